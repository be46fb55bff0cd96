"""The registered backends' cluster models as one pydantic discriminated union, chosen by ``backend:``.

spec/ sits below backends/: it never imports a backend. Each backend's package defines its model (a
``ClusterSpec`` subclass with its ``backend:`` literal and its own section, named as the backend), and
``launcher.backends`` hands the registered ones to ``ClusterModels``, which the loader is given.

A file (or a stored record) may keep the section of another backend than its own (``backend: local``
with an ``ssh:`` section left from before; records stored before the sections were split kept every
one): such a section is checked by its own backend's model, as it always was, and then left out.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any

from pydantic import BaseModel, Discriminator, Tag, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from launcher.spec.cluster import ClusterSpec
from launcher.spec.keys import Loc, keys_at

DEFAULT_BACKEND = "local"


def backend_of(data: Any) -> str | None:
    """The ``backend:`` a cluster's data names (``local`` when it names none), or None when it is no mapping."""
    if isinstance(data, Mapping):
        return data.get("backend", DEFAULT_BACKEND) if isinstance(data.get("backend", DEFAULT_BACKEND), str) else None
    return getattr(data, "backend", None)


class ClusterModels:
    """The cluster model of each backend name, validated as one discriminated union."""

    def __init__(self, models: Mapping[str, type[ClusterSpec]]) -> None:
        for name, model in models.items():
            if typing.get_args(model.model_fields["backend"].annotation) != (name,) or name not in model.model_fields:
                raise TypeError(f"{model.__name__}: a backend's model has backend: Literal[{name!r}] and a section {name!r}")
        self.models = dict(models)

    @cached_property
    def adapter(self) -> TypeAdapter[ClusterSpec]:
        members = tuple(Annotated[model, Tag(name)] for name, model in self.models.items())
        union: Any = Annotated[typing.Union[members], Discriminator(backend_of)]  # noqa: UP007 (a union built at run time)
        return TypeAdapter(union)

    def section(self, name: str) -> type[BaseModel]:
        """The model of backend ``name``'s own section (``ssh:`` of the ssh backend)."""
        return self.models[name].model_fields[name].annotation  # type: ignore[return-value]

    def validate(self, data: Any) -> ClusterSpec:
        """``data`` as its backend's cluster model; one ValidationError with every problem, located as in the file."""
        name = backend_of(data)
        if isinstance(data, ClusterSpec) and name in self.models:
            return self.adapter.validate_python(data)
        if name not in self.models:
            raise self._error([InitErrorDetails(
                type=PydanticCustomError("literal_error", "Input should be " + _choices(list(self.models))),
                loc=("backend",), input=data.get("backend") if isinstance(data, Mapping) else data)])
        assert isinstance(data, Mapping)
        errors: list[InitErrorDetails] = []
        own = {}
        for key, value in data.items():
            if key in self.models and key not in self.models[name].model_fields:
                errors += _located(self._other_section(key, value), (key,))
            else:
                own[key] = value
        try:
            cluster = self.adapter.validate_python(own)
        except ValidationError as exc:
            errors = _located(exc.errors(), (), strip=name) + errors
        if errors:
            raise self._error(errors)
        return cluster

    def _other_section(self, key: str, value: Any) -> list[ErrorDetails]:
        try:
            self.section(key).model_validate(value)
        except ValidationError as exc:
            return exc.errors()
        return []

    def known_keys(self, name: str | None, loc: Loc) -> list[str]:
        """The keys the cluster of backend ``name`` takes at ``loc`` (the top level: another backend's section too)."""
        if name not in self.models:
            return ["name", "backend"] if not loc else []
        if loc and loc[0] in self.models and loc[0] not in self.models[name].model_fields:
            return keys_at(self.section(loc[0]), loc[1:])
        known = keys_at(self.models[name], loc)
        return known + [other for other in self.models if other not in known] if not loc else known

    def json_schema(self) -> dict[str, Any]:
        return self.adapter.json_schema()

    def _error(self, errors: list[InitErrorDetails]) -> ValidationError:
        return ValidationError.from_exception_data("ClusterSpec", errors)


def _choices(names: list[str]) -> str:
    quoted = [repr(name) for name in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _located(errors: list[ErrorDetails], prefix: Loc, strip: str | None = None) -> list[InitErrorDetails]:
    """Errors made again at ``prefix`` + their location, less the union's tag (their message kept: without a
    context, PydanticCustomError formats nothing)."""
    found = []
    for err in errors:
        loc = tuple(err["loc"])
        if strip is not None and loc[:1] == (strip,):
            loc = loc[1:]
        found.append(InitErrorDetails(type=PydanticCustomError(err["type"], err["msg"]), loc=prefix + loc, input=err["input"]))
    return found

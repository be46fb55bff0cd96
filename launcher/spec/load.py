"""Read YAML specs into pydantic models, keeping line numbers for errors.

Every problem in a file is reported at once, each as
``jobs/x.yaml:12: batch.micro_batch: Input should be greater than or equal to 1``,
with a did-you-mean suggestion for unknown keys. ``--set key.path=value``
overrides are applied before validation and are named in errors as such; the
same key path given twice in ``--set`` is an error. The YAML itself is read
under the bounds of ``launcher.spec.safeyaml``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from launcher.errors import SpecError
from launcher.spec.cluster import ClusterSpec, NamedFile
from launcher.spec.clusters import ClusterModels, backend_of
from launcher.spec.files import check_regular, expand_user
from launcher.spec.job import JobSpec
from launcher.spec.keys import Loc, keys_at
from launcher.spec.safeyaml import Document, YAMLSyntaxError, parse_document, parse_value, read_spec_text

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Kind:
    """A kind of spec file: its name in messages, how its data is validated, the keys it takes at a location."""

    name: str
    validate: Callable[[Any], BaseModel]
    keys: Callable[[Any, Loc], list[str]]

    @classmethod
    def of(cls, model: type[BaseModel]) -> Kind:
        name = "job" if model is JobSpec else model.__name__
        return cls(name, model.model_validate, lambda data, loc: keys_at(model, loc))

    @classmethod
    def cluster(cls, models: ClusterModels) -> Kind:
        return cls("cluster", models.validate, lambda data, loc: models.known_keys(backend_of(data), loc))


def load_job(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> JobSpec:
    """Load and validate a job spec, applying ``--set`` overrides."""
    return load_spec(JobSpec, path, overrides)


def load_cluster(path: str | Path, models: ClusterModels, overrides: list[str] | tuple[str, ...] = ()) -> ClusterSpec:
    """Load and validate a cluster spec as its backend's model (``launcher.backends.load_cluster`` gives ``models``)."""
    spec = _load(Kind.cluster(models), path, overrides)
    assert isinstance(spec, ClusterSpec)
    return spec


def load_spec(model: type[M], path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> M:
    """Load ``path`` as ``model``; every problem is reported in one SpecError."""
    spec = _load(Kind.of(model), path, overrides)
    assert isinstance(spec, model)
    return spec


def _load(kind: Kind, path: str | Path, overrides: list[str] | tuple[str, ...]) -> BaseModel:
    document = read_document(path)
    data = document.data
    set_locs = apply_overrides(data, overrides)
    spec = validate_as(kind, data, str(path), document.lines, set_locs)
    check_named_files(spec, str(path), document.lines, set_locs)
    return spec


def job_from_data(data: dict[str, Any], source: str, overrides: list[str] | tuple[str, ...] = ()) -> JobSpec:
    """A job spec from plain data (a stored job's, `launch resubmit`), ``--set`` overrides applied to a copy;
    problems are reported as a file's are, ``source`` in place of its name."""
    import copy

    data = copy.deepcopy(data)
    set_locs = apply_overrides(data, overrides)
    spec = validate(JobSpec, data, source, {}, set_locs)
    check_named_files(spec, source, {}, set_locs)
    return spec


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[Loc, str]:
    """Apply ``--set`` overrides in place; each key path's override, by path (the same path twice is an error)."""
    set_locs: dict[Loc, str] = {}
    for item in overrides:
        loc = apply_override(data, item)
        if loc in set_locs:
            raise SpecError(f"--set {item!r}: '{'.'.join(loc)}' is already set by --set {set_locs[loc]!r}; give it once")
        set_locs[loc] = item
    return set_locs


MAX_NAMED_FILE_BYTES = 1 << 20  # a DeepSpeed config, an ssh key, known_hosts or ssh config: far less than this


def named_files(spec: BaseModel) -> list[NamedFile]:
    """Every file on this machine that ``spec`` names and launch reads."""
    if isinstance(spec, JobSpec):
        return [NamedFile(("deepspeed", "config"), spec.deepspeed.config, False)] if spec.deepspeed.config else []
    return spec.named_files() if isinstance(spec, ClusterSpec) else []


def check_named_files(spec: BaseModel, source: str, lines: dict[Loc, int], set_locs: dict[Loc, str]) -> None:
    """Every file the spec names: ``~user`` known here, a regular file (not a FIFO or a device) of bounded size.

    Checked at load, before anything reads them: a FIFO would block for ever, ``/dev/zero`` would fill memory.
    """
    for loc, text, missing_ok in named_files(spec):
        field = ".".join(loc)
        where = next((f"--set {item}" for set_loc, item in set_locs.items() if loc[: len(set_loc)] == set_loc),
                     f"{source}:{_line_of(loc, lines)}")
        check_regular(expand_user(text, f"{where}: {field}"), f"{where}: {field}", MAX_NAMED_FILE_BYTES,
                      missing_ok=missing_ok)


def read_document(path: str | Path) -> Document:
    """A spec file's top-level mapping and line numbers, read under the bounds of ``safeyaml``."""
    path = Path(path)
    return parse_document(read_spec_text(path), str(path))


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A spec file's top-level mapping, unvalidated (to tell a job from a cluster); SpecError otherwise."""
    return read_document(path).data


def apply_override(data: dict[str, Any], item: str) -> Loc:
    """Apply one ``key.path=value`` override in place; the value is parsed as YAML (text if it is not YAML)."""
    try:
        item.encode("utf-8")
    except UnicodeEncodeError as exc:  # bytes from a command line that were not UTF-8
        raise SpecError(f"--set {item!r}: not UTF-8 text (undecodable byte at character {exc.start + 1})") from None
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise SpecError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. --set resources.nproc_per_node=2")
    parts = key.strip().split(".")
    if not all(parts):
        raise SpecError(f"--set {item!r}: '{key.strip()}' has an empty part; keys are separated by single dots")
    try:
        value = parse_value(raw, f"--set {item}") if raw.strip() else ""
    except YAMLSyntaxError:
        value = raw
    target = data
    for part in parts[:-1]:
        child = target.get(part)
        if child is None:
            child = target[part] = {}
        if not isinstance(child, dict):
            raise SpecError(f"--set {item!r}: '{part}' is not a section, cannot set '{key}' inside it")
        target = child
    target[parts[-1]] = value
    return tuple(parts)


def validate(model: type[M], data: Any, source: str, lines: dict[Loc, int], set_locs: dict[Loc, str]) -> M:
    """Validate plain data as ``model``; turn every pydantic error into one SpecError."""
    spec = validate_as(Kind.of(model), data, source, lines, set_locs)
    assert isinstance(spec, model)
    return spec


def validate_as(kind: Kind, data: Any, source: str, lines: dict[Loc, int], set_locs: dict[Loc, str]) -> BaseModel:
    """Validate plain data as a spec of ``kind``; turn every pydantic error into one SpecError, its problems in
    the file's order (those of ``--set`` last)."""
    try:
        return kind.validate(data)
    except ValidationError as exc:
        found = [_describe(kind, data, dict(err), source, lines, set_locs) for err in exc.errors()]
    problems = [text for _, text in sorted(found, key=lambda pair: pair[0])]
    noun = "problem" if len(problems) == 1 else "problems"
    raise SpecError(f"{source}: {len(problems)} {noun} in the {kind.name} spec:\n" + "\n".join(problems))


def _describe(kind: Kind, data: Any, err: dict[str, Any], source: str, lines: dict[Loc, int],
              set_locs: dict[Loc, str]) -> tuple[float, str]:
    """(where it sorts: its line, --set last; the problem as a line of the error)."""
    loc = tuple(part for part in err["loc"] if part != "[key]")
    field = ".".join(str(p) for p in loc) or "(top level)"
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown key"
        known = kind.keys(data, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        if close:
            message += f"; did you mean '{close[0]}'?"
        elif known:
            message += f"; expected one of: {', '.join(known)}"
    elif err["type"] == "missing":
        message = "required field is missing"
    elif "input" in err and err["type"] not in ("model_type", "dict_type") and not isinstance(err["input"], dict):
        message += f" (got {_shown(err['input'])})"
    for set_loc, item in set_locs.items():
        if loc[: len(set_loc)] == set_loc:
            return math.inf, f"  --set {item}: {field}: {message}"
    line = _line_of(loc, lines)
    return line, f"  {source}:{line}: {field}: {message}"


def _shown(value: Any, limit: int = 80) -> str:
    """``repr`` of an offending value, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _line_of(loc: Loc, lines: dict[Loc, int]) -> int:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1

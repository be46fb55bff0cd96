"""The keys a spec model takes at a location: what an "unknown key" error suggests instead."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

Loc = tuple[Any, ...]


def keys_at(model: type[BaseModel], loc: Loc) -> list[str]:
    """Field names of the section of ``model`` at ``loc`` (list indexes skipped)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return []
        current = section_model(current.model_fields[part].annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def section_model(annotation: Any) -> Any:
    """The BaseModel inside an annotation such as ``NodeSpec``, ``list[NodeSpec]`` or ``X | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = section_model(arg)
            if found is not None:
                return found
    return None

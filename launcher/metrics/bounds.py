"""The bounds of every record value (``Bound``: pydantic enforces them on untrusted input) and the reading of
stored rows by the same bounds without pydantic: a row that would not validate is left out, and a NaN or
infinity (as launches before the record model stored) reads as unknown. Standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Mapping
from typing import Annotated, Any

MAX_EXTRA_KEYS = 16
MAX_KEY_CHARS = 64
MAX_TEXT_CHARS = 256
MAX_RANKS = 1 << 20
MAX_COUNT = 10**15  # steps, samples, tokens: far beyond any run, far inside SQLite's 64-bit integers
MAX_BYTES = 1 << 60
MAX_SECONDS = 1e9
MAX_TIMESTAMP = 1e11
MAX_MAGNITUDE = 1e100  # losses and program-added numbers: sums of many stay finite
INT64_MAX = (1 << 63) - 1
KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


@dataclasses.dataclass(frozen=True)
class Bound:
    """Limits of a value: pydantic enforces them on untrusted input, ``from_stored`` applies them on read."""

    low: float | None = None
    high: float | None = None
    max_len: int | None = None
    pattern: str | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        schema = handler(source)
        for key, value in (("ge", self.low), ("le", self.high), ("max_length", self.max_len), ("pattern", self.pattern)):
            if value is not None:
                schema[key] = value
        return schema


Index = Annotated[int, Bound(0, MAX_RANKS)]
Count = Annotated[int, Bound(0, MAX_COUNT)]
Bytes = Annotated[int, Bound(0, MAX_BYTES)]
Seconds = Annotated[float, Bound(0, MAX_SECONDS)]
Timestamp = Annotated[float, Bound(0, MAX_TIMESTAMP)]
Rate = Annotated[float, Bound(0, 1e18)]
Fraction = Annotated[float, Bound(0, 1)]
Number = Annotated[float, Bound(-MAX_MAGNITUDE, MAX_MAGNITUDE)]
Flops = Annotated[float, Bound(0, 1e21)]
Text = Annotated[str, Bound(max_len=MAX_TEXT_CHARS)]
ExtraKey = Annotated[str, Bound(max_len=MAX_KEY_CHARS, pattern=KEY_PATTERN)]
ExtraValue = bool | Annotated[int, Bound(-INT64_MAX, INT64_MAX)] | Number | Text
Extras = Annotated[dict[ExtraKey, ExtraValue], Bound(max_len=MAX_EXTRA_KEYS)]


_REQUIRED = object()


@functools.cache
def _field_kinds(kind: type) -> tuple[tuple[str, type, Bound | None, Any], ...]:
    """(name, base type, bound, default) of each plain field of a record class."""
    hints = typing.get_type_hints(kind, include_extras=True)
    out = []
    for field in dataclasses.fields(kind):
        if field.name == "extra":
            continue
        hint = hints[field.name]
        args = typing.get_args(hint)
        if typing.get_origin(hint) is not Annotated and type(None) in args:
            hint = next(a for a in args if a is not type(None))
        base, bound = hint, None
        if typing.get_origin(hint) is Annotated:
            base, *meta = typing.get_args(hint)
            bound = next((m for m in meta if isinstance(m, Bound)), None)
        default = field.default if field.default is not dataclasses.MISSING else _REQUIRED
        out.append((field.name, base, bound, default))
    return tuple(out)


def read_fields(kind: type, data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The fields of a stored row; None if a value is of the wrong type or out of bounds (NaN reads as unknown)."""
    values = {}
    for name, base, bound, default in _field_kinds(kind):
        raw = data.get(name)
        value = clean_value(raw, base, bound)
        if value is None and raw is not None and not _non_finite(raw):
            return None
        if value is None and default is not None:
            if default is _REQUIRED:
                return None
            value = default
        values[name] = value
    return values


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def clean_value(value: Any, base: type, bound: Bound | None = None) -> Any:
    """``value`` as a ``base`` (int, float, str or bool) within ``bound``, or None if it is not one."""
    if value is None:
        return None
    kind = type(value)
    if (kind is int and base is int) or (kind is float and base is float and math.isfinite(value)):  # most values
        if bound is None or ((bound.low is None or value >= bound.low) and (bound.high is None or value <= bound.high)):
            return value
        return None
    if base is bool:
        return value if isinstance(value, bool) else None
    if base is str:
        if not isinstance(value, str):
            return None
        return value[: bound.max_len] if bound is not None and bound.max_len is not None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if bound is not None and ((bound.low is not None and value < bound.low) or (bound.high is not None and value > bound.high)):
        return None
    if base is int:
        if isinstance(value, float):
            if not value.is_integer():
                return None
            value = int(value)
    elif base is float:
        try:
            value = float(value)
        except OverflowError:
            return None
    else:
        return None
    return value

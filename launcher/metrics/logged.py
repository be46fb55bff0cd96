"""Numbers a program logs of its own in a usual format, for what launch's step hooks cannot see.

Hugging Face's Trainer prints a dict a logging step (``{'loss': 2.51, 'grad_norm': 1.2, 'learning_rate': 5e-05,
'epoch': 0.25}``; newer versions quote the numbers). ``read_logged`` turns such a line of rank output into its
numbers; the watcher keeps the latest of each rank and puts them on the rank's next observed record: the loss as
the program logged it (its own mean over its logging interval) where the hooks could not read one honestly, the
learning rate and epoch as extra keys. The hooks stay the source of steps and time. Rank output is untrusted: a
line is read only whole, short, as a Python literal (never evaluated), its numbers finite and bounded.
"""

from __future__ import annotations

import ast
import math
from dataclasses import replace

from launcher.metrics.bounds import MAX_MAGNITUDE
from launcher.metrics.record import MetricRecord, check_extra

MAX_CHARS = 2048
KEYS = {"loss": "loss", "learning_rate": "learning_rate", "epoch": "epoch"}  # the Trainer's key -> launch's


def read_logged(text: str) -> dict[str, float] | None:
    """The numbers of a Trainer-style log line (at least a loss or a learning rate, and an epoch), else None."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")) or len(text) > MAX_CHARS or "'epoch'" not in text:
        return None
    try:
        data = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    found = {}
    for key, name in KEYS.items():
        value = _number(data.get(key))
        if value is not None:
            found[name] = value
    return found if "epoch" in found and ("loss" in found or "learning_rate" in found) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        return None
    return float(value)


def with_logged(record: MetricRecord, logged: dict[str, float]) -> MetricRecord:
    """An observed record with what its rank last logged: the loss where it has none, learning rate and epoch."""
    if not record.observed:
        return record  # the Reporter's records say what the program chose
    added = {key: value for key, value in logged.items() if key != "loss" and key not in record.extra}
    try:
        extra = check_extra({**record.extra, **added})
    except ValueError:
        extra = record.extra
    loss = record.loss if record.loss is not None else logged.get("loss")
    return replace(record, loss=loss, extra=extra)

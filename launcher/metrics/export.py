"""Export a job's raw metric records: CSV (one row per record) and TensorBoard event files.

TensorBoard files are written with ``torch.utils.tensorboard`` (it needs the
``tensorboard`` package): one run directory per rank, ``DIR/JOB/rankN``, so
TensorBoard overlays the ranks of a job and puts jobs side by side.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from launcher.errors import LaunchError
from launcher.metrics import mfu as mfu_mod
from launcher.metrics.record import CSV_FIELDS, MetricRecord
from launcher.spec.files import expand_user

MB = 1024 * 1024
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet would evaluate at the start of a cell


def csv_columns(records: Sequence[MetricRecord]) -> list[str]:
    """The record's fields (``MetricRecord``, in its order), then any extra keys the program added (sorted)."""
    extra = sorted({key for record in records for key in record.extra})
    return [*CSV_FIELDS, *extra]


def write_csv(records: Sequence[MetricRecord], out: TextIO) -> int:
    """Write the records as CSV (header first) to ``out``; the number of rows."""
    writer = csv.DictWriter(out, fieldnames=csv_columns(records), lineterminator="\n")
    writer.writeheader()
    for record in records:
        row = {name: getattr(record, name) for name in CSV_FIELDS} | record.extra
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return len(records)


def _cell(value: Any) -> Any:
    """A CSV cell: texts came from rank output, so one a spreadsheet would run as a formula gets a leading
    quote (OWASP's advice for CSV injection); numbers stay numbers, None is empty.

    A line break inside a text is written as the two characters ``\\r`` or ``\\n``: some spreadsheets start
    a new row (or cell) at a bare CR even inside quotes, and the text after it would be read as a formula.
    Leading spaces do not hide a formula either (spreadsheets trim them)."""
    if value is None:
        return ""
    if isinstance(value, str):
        value = value.replace("\r", "\\r").replace("\n", "\\n")
        if value.lstrip(" ").startswith(FORMULA_STARTS):
            return "'" + value
    return value


def scalars(record: MetricRecord, peak_tflops: float | None) -> dict[str, float]:
    """The TensorBoard scalars of one record, by tag (unknown values left out)."""
    values = {
        "throughput/samples_per_sec": record.samples_per_sec,
        "throughput/tokens_per_sec": record.tokens_per_sec or None,
        "step_time_ms": record.step_time_s * 1000.0 if record.step_time_s is not None else None,
        "loss": record.loss,
        "memory/peak_mb": record.mem_peak_bytes / MB if record.mem_peak_bytes is not None else None,
        "gpu_util": record.gpu_util,
        "mfu": mfu_mod.mfu(record.samples_per_sec, record.flops_per_sample, 1, peak_tflops),
    }
    return {tag: float(v) for tag, v in values.items() if v is not None}


def write_tensorboard(job_id: str, spec: Mapping[str, Any] | None, records: Sequence[MetricRecord],
                      logdir: str | Path) -> list[Path]:
    """Write a job's records (``spec``: its stored specs) as TensorBoard scalars under ``logdir/JOB/rankN``; the run
    directories."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise LaunchError(
            f"TensorBoard export needs torch and the tensorboard package ({exc})",
            hint="pip install tensorboard  (or use `launch metrics JOB --csv`)",
        ) from None
    peak = mfu_mod.peak_tflops(spec, records)
    by_rank: dict[int, list[MetricRecord]] = {}
    for record in records:
        by_rank.setdefault(record.rank, []).append(record)
    runs = []
    for rank, rows in sorted(by_rank.items()):
        run = expand_user(logdir, "--tensorboard") / job_id / f"rank{rank}"
        try:
            writer = SummaryWriter(log_dir=str(run))
        except OSError as exc:
            raise LaunchError(f"cannot write TensorBoard files to {run}: {exc.strerror or exc}") from None
        with writer:
            for record in rows:
                for tag, value in scalars(record, peak).items():
                    writer.add_scalar(tag, value, global_step=record.step, walltime=record.t)
        runs.append(run)
    return runs

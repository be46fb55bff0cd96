"""Export a job's raw metric records: CSV (one row per record) and TensorBoard event files.

TensorBoard files are written with ``torch.utils.tensorboard`` (it needs the
``tensorboard`` package): one run directory per rank, ``DIR/JOB/rankN``, so
TensorBoard overlays the ranks of a job and puts jobs side by side.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, TextIO

from launcher.errors import LaunchError
from launcher.metrics import mfu as mfu_mod

MB = 1024 * 1024

CSV_COLUMNS: tuple[str, ...] = (
    "job", "attempt", "node", "rank", "local_rank", "host", "step", "t", "warmup", "steps", "interval_s",
    "step_time_s", "samples", "tokens", "samples_per_sec", "tokens_per_sec", "loss", "mem_peak_bytes",
    "gpu_util", "flops_per_sample",
)


def csv_columns(records: list[dict[str, Any]]) -> list[str]:
    """The fixed record columns, then any extra keys the program added (sorted)."""
    extra = sorted({key for record in records for key in record} - set(CSV_COLUMNS) - {"v"})
    return [*CSV_COLUMNS, *extra]


def write_csv(records: list[dict[str, Any]], out: TextIO) -> int:
    """Write the records as CSV (header first) to ``out``; the number of rows."""
    writer = csv.DictWriter(out, fieldnames=csv_columns(records), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: ("" if v is None else v) for k, v in record.items()})
    return len(records)


def scalars(record: dict[str, Any], peak_tflops: float | None) -> dict[str, float]:
    """The TensorBoard scalars of one record, by tag (unknown values left out)."""
    step_time = record.get("step_time_s")
    mem = record.get("mem_peak_bytes")
    values = {
        "throughput/samples_per_sec": record.get("samples_per_sec"),
        "throughput/tokens_per_sec": record.get("tokens_per_sec") or None,
        "step_time_ms": step_time * 1000.0 if step_time is not None else None,
        "loss": record.get("loss"),
        "memory/peak_mb": mem / MB if mem is not None else None,
        "gpu_util": record.get("gpu_util"),
        "mfu": mfu_mod.mfu(record.get("samples_per_sec"), record.get("flops_per_sample"), 1, peak_tflops),
    }
    return {tag: float(v) for tag, v in values.items() if v is not None}


def write_tensorboard(job: dict[str, Any], records: list[dict[str, Any]], logdir: str | Path) -> list[Path]:
    """Write a job's records as TensorBoard scalars under ``logdir/JOB/rankN``; the run directories."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise LaunchError(
            f"TensorBoard export needs torch and the tensorboard package ({exc})",
            hint="pip install tensorboard  (or use `launch metrics JOB --csv`)",
        ) from None
    peak = mfu_mod.peak_tflops(job, records)
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        by_rank.setdefault(int(record.get("rank", 0)), []).append(record)
    runs = []
    for rank, rows in sorted(by_rank.items()):
        run = Path(logdir).expanduser() / job["id"] / f"rank{rank}"
        try:
            writer = SummaryWriter(log_dir=str(run))
        except OSError as exc:
            raise LaunchError(f"cannot write TensorBoard files to {run}: {exc.strerror or exc}") from None
        with writer:
            for record in rows:
                for tag, value in scalars(record, peak).items():
                    writer.add_scalar(tag, value, global_step=int(record.get("step", 0)), walltime=record.get("t"))
        runs.append(run)
    return runs

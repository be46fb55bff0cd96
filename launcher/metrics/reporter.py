"""Per-rank metric reporter: runs inside training processes.

Cheap on every step: ``step()`` only reads a monotonic clock and adds two
integers. On a reporting step (every ``every`` steps) it synchronises the
device once, reads the loss, and writes one JSON record as a marked stdout
line (``@@launch {...}``) that the supervisor picks out of the rank's output.
That channel works unchanged through every backend (local pipes, SSH
channels, Ray actors). Each record is a ``MetricRecord`` (record.py), the
model the supervisor validates the line against.

Imports only the standard library on ordinary runs; torch is used when it is
already loaded. Program-added ``extra`` keys are validated once, when the
Reporter is made (that imports pydantic, ~0.1 s, only then).
"""

from __future__ import annotations

import json
import math
import os
import resource
import socket
import sys
import time
from typing import Any

from launcher.metrics.bounds import MAX_MAGNITUDE, MAX_TEXT_CHARS
from launcher.metrics.record import MARKER, MetricRecord, check_extra

ACTIVE = False  # a Reporter was made in this process: launch's step hooks leave the records to it


def _torch():
    return sys.modules.get("torch")


def _is_cuda_available(torch) -> bool:
    return torch is not None and torch.cuda.is_available()


def peak_memory_bytes() -> int:
    """Peak memory of this rank: CUDA max allocated on GPUs, peak RSS on CPU."""
    torch = _torch()
    if _is_cuda_available(torch):
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _scalar(value: Any) -> float | None:
    """A loss as a float; None when unknown or not finite (a diverged loss cannot be carried as JSON)."""
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach().float().item()
    value = float(value)
    return value if math.isfinite(value) and abs(value) <= MAX_MAGNITUDE else None


class Reporter:
    """Collects step timings on one rank and emits a record every ``every`` steps.

    Call ``step()`` once per optimizer step with the samples (and tokens)
    this rank processed in it. ``warmup`` steps at the start are reported
    but flagged, so throughput summaries leave them out.
    """

    def __init__(
        self,
        every: int = 10,
        warmup: int | None = None,
        flops_per_sample: float | None = None,
        stream=None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.enabled = os.environ.get("LAUNCH_METRICS", "1") != "0"
        global ACTIVE
        ACTIVE = True
        self.every = max(1, int(os.environ.get("LAUNCH_METRICS_EVERY", every)))
        self.warmup = self.every if warmup is None else warmup
        if flops_per_sample is not None and not (0 < flops_per_sample <= 1e21):
            raise ValueError(f"flops_per_sample must be a positive number up to 1e21, not {flops_per_sample!r}")
        self.flops_per_sample = flops_per_sample
        self.extra = check_extra(extra) if extra else {}
        self._stream = stream or sys.stdout
        self._job = os.environ.get("LAUNCH_JOB_ID", "")
        self._node = int(os.environ.get("LAUNCH_NODE", "0"))
        self._rank = int(os.environ.get("RANK", "0"))
        self._local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._host = socket.gethostname()
        self._step = 0
        self._interval_steps = 0
        self._interval_samples = 0
        self._interval_tokens = 0
        self._interval_start = time.perf_counter()
        self._gpu_util = _GpuUtilSampler.start(self._local_rank) if self.enabled else None
        torch = _torch()
        self._gpu_name = torch.cuda.get_device_name()[:MAX_TEXT_CHARS] if _is_cuda_available(torch) else None

    @property
    def steps_done(self) -> int:
        return self._step

    def resume_at(self, step: int) -> None:
        """Continue counting from ``step`` (after loading a checkpoint)."""
        self._step = step
        self._interval_start = time.perf_counter()

    def step(self, samples: int, tokens: int = 0, loss: Any = None) -> None:
        """Record one optimizer step; emit a record on reporting steps."""
        self._step += 1
        self._interval_steps += 1
        self._interval_samples += samples
        self._interval_tokens += tokens
        if self.enabled and self._step % self.every == 0:
            self._emit(loss)

    def close(self, loss: Any = None) -> None:
        """Flush the last partial interval and stop the utilisation sampler."""
        if self.enabled and self._interval_steps:
            self._emit(loss)
        if self._gpu_util is not None:
            self._gpu_util.stop()

    def _emit(self, loss: Any) -> None:
        torch = _torch()
        if _is_cuda_available(torch):
            torch.cuda.synchronize()
        now = time.perf_counter()
        elapsed = max(now - self._interval_start, 1e-9)
        steps = self._interval_steps
        record = MetricRecord(
            job=self._job,
            node=self._node,
            rank=self._rank,
            local_rank=self._local_rank,
            host=self._host,
            step=self._step,
            t=time.time(),
            steps=steps,
            interval_s=elapsed,
            step_time_s=elapsed / steps,
            samples=self._interval_samples,
            tokens=self._interval_tokens,
            samples_per_sec=self._interval_samples / elapsed,
            tokens_per_sec=self._interval_tokens / elapsed,
            loss=_scalar(loss),
            mem_peak_bytes=peak_memory_bytes(),
            warmup=self._step <= self.warmup,
            flops_per_sample=self.flops_per_sample,
            gpu_name=self._gpu_name,
            gpu_util=self._gpu_util.mean_and_reset() if self._gpu_util is not None else None,
            extra=self.extra,
        )
        self._stream.write(MARKER + json.dumps(record.to_wire(), separators=(",", ":"), allow_nan=False) + "\n")
        self._stream.flush()
        self._interval_steps = 0
        self._interval_samples = 0
        self._interval_tokens = 0
        self._interval_start = time.perf_counter()


class _GpuUtilSampler:
    """Samples this rank's GPU utilisation through NVML in a daemon thread."""

    def __init__(self, handle, nvml) -> None:
        import threading

        self._handle = handle
        self._nvml = nvml
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="launch-nvml")
        self._thread.start()

    @classmethod
    def start(cls, local_rank: int) -> _GpuUtilSampler | None:
        torch = _torch()
        if not _is_cuda_available(torch):
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            index = torch.cuda.current_device() if torch.cuda.is_initialized() else local_rank
            return cls(pynvml.nvmlDeviceGetHandleByIndex(index), pynvml)
        except Exception:  # noqa: BLE001 - NVML is optional; no sampler without it
            return None

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            except Exception:  # noqa: BLE001 - a failed sample is skipped
                continue
            self._samples.append(rates.gpu / 100.0)

    def mean_and_reset(self) -> float | None:
        samples, self._samples = self._samples, []
        return sum(samples) / len(samples) if samples else None

    def stop(self) -> None:
        self._stop.set()

"""`launch bench`: the same job under each strategy in turn, on the same cluster, then the comparison.

Each strategy is an ordinary foreground submit (``orchestrate.prepare`` with
``--set strategy=...`` overrides, then ``orchestrate.submit``), so every run
is a job in the store like any other. A strategy that fails (refused spec,
failed preflight, failed run) becomes a failed row with its reason and the
next one still runs; a cancelled run (Ctrl-C) stops the bench. The
comparison is saved as JSON and HTML in ``$LAUNCH_HOME/runs/bench-<time>/``.
"""

from __future__ import annotations

import json
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.catalog.strategies import BENCH_DEFAULT, find_strategy
from launcher.errors import LaunchError, SpecError
from launcher.metrics.record import MetricRecord
from launcher.spec.job import JobSpec
from launcher.store.db import Store, launch_home
from launcher.store.rows import JobRow
from launcher.store.states import JobState
from launcher.views.compare import compare_row, failed_row, job_metrics, with_ratios


@dataclass
class BenchRun:
    """One strategy's run: its job (None if it never got one), final state and reason."""

    strategy: str
    job_id: str | None
    state: JobState
    reason: str | None
    seconds: float


@dataclass
class BenchResult:
    """Every run of a bench, the comparison rows, and the (job row, records) behind them."""

    runs: list[BenchRun]
    rows: list[dict[str, Any]]
    entries: list[tuple[JobRow, list[MetricRecord]]] = field(default_factory=list)


def parse_strategies(text: str) -> list[str]:
    """``ddp,zero2`` -> ['ddp', 'zero2']; empty items dropped, unknown names kept (they fail as runs)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise SpecError(f"--strategies: give a comma-separated list, e.g. {','.join(BENCH_DEFAULT)}")
    return names


def strategy_overrides(job: JobSpec, strategy: str) -> list[str]:
    """The ``--set`` overrides that run ``job`` under ``strategy``, with what the strategy requires.

    The strategy's registry entry says what it changes: a launcher it runs under (a
    DeepSpeed-launched job runs the torch strategies under torchrun), one node and one
    process (dp). An unknown name is passed on as is, for the spec to refuse as a failed run.
    """
    found = find_strategy(strategy)
    if found is None:
        return [f"strategy={strategy}"]
    settings = found.spec_settings(job.launcher, job.resources.nodes, job.resources.nproc_per_node)
    return [f"{key}={value}" for key, value in settings.items()]


def _merged_sets(users: tuple[str, ...], bench: list[str]) -> list[str]:
    """The user's ``--set`` items, less those whose key the bench sets itself (a strategy's one process
    for dp, ``--steps``), then the bench's: each key is given once, and the bench's value wins."""
    own = {item.split("=", 1)[0].strip() for item in bench}
    return [item for item in users if item.split("=", 1)[0].strip() not in own] + bench


def run_bench(
    job_file: str,
    strategies: list[str],
    *,
    steps: int | None = None,
    cluster_file: str | None = None,
    overrides: tuple[str, ...] = (),
    echo: Callable[[str], None] | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> BenchResult:
    """Run ``job_file`` under each strategy in turn (foreground), then build the comparison."""
    from launcher.spec.load import load_job

    base = load_job(job_file, overrides)
    if base.recipe is None:
        raise LaunchError(
            f"{job_file}: bench compares the strategies of a built-in recipe; this job runs an entrypoint "
            "that chooses its own strategy",
            hint="use a recipe job (e.g. jobs/cifar10_convnet.yaml), or `launch compare` jobs you ran yourself",
        )
    store = Store()
    runs: list[BenchRun] = []
    for index, strategy in enumerate(strategies, start=1):
        if runs and runs[-1].state == JobState.CANCELLED:
            runs.append(BenchRun(strategy, None, JobState.CANCELLED, "not run: the bench was cancelled", 0.0))
            continue
        sets = _merged_sets(overrides, [*strategy_overrides(base, strategy), *([f"max_steps={steps}"] if steps else [])])
        progress(f"bench {index}/{len(strategies)}: {strategy}")
        run = _run_one(store, job_file, cluster_file, strategy, tuple(sets), echo)
        progress(f"bench {index}/{len(strategies)}: {strategy}: {run.job_id or '(no job)'} {run.state} "
                 f"in {run.seconds:.1f} s" + (f": {run.reason}" if run.reason else ""))
        runs.append(run)
    try:
        return _comparison(store, runs)
    finally:
        store.close()


def _run_one(store: Store, job_file: str, cluster_file: str | None, strategy: str, sets: tuple[str, ...],
             echo: Callable[[str], None] | None) -> BenchRun:
    from launcher.run import orchestrate

    start = time.monotonic()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        prepared = orchestrate.prepare(job_file, cluster_file, sets)
        job_id, state = orchestrate.submit(prepared, detach=False, echo=echo)
    except LaunchError as exc:
        return BenchRun(strategy, None, JobState.FAILED, str(exc), time.monotonic() - start)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    reason = store.job(job_id).reason
    return BenchRun(strategy, job_id, state, reason, time.monotonic() - start)


def _comparison(store: Store, runs: list[BenchRun]) -> BenchResult:
    rows, entries = [], []
    for run in runs:
        if run.job_id is None:
            rows.append(failed_row(run.strategy, run.reason or "failed", run.state))
            continue
        job = store.job(run.job_id)
        records = store.metrics(run.job_id)
        rows.append(compare_row(job, job_metrics(job, records)))
        entries.append((job, records))
    return BenchResult(runs=runs, rows=with_ratios(rows), entries=entries)


def save(result: BenchResult, job_file: str, out: str | None = None) -> list[Path]:
    """Save the comparison (JSON + HTML report) in the store's run directory, and to ``out`` if given.

    ``out`` ending in ``.html`` gets the HTML report, anything else the JSON.
    """
    from launcher.views.report import build_report

    folder = launch_home() / "runs" / f"bench-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}"
    folder.mkdir(mode=0o700, parents=True)
    data = json.dumps(
        {"job_file": job_file, "runs": [asdict(run) for run in result.runs], "comparison": result.rows}, indent=2
    )
    page = build_report(result.entries, result.rows, title=f"launch bench: {Path(job_file).name}")
    targets = [(folder / "comparison.json", data), (folder / "report.html", page)]
    if out:
        targets.append((Path(out).expanduser(), page if out.endswith(".html") else data))
    for path, text in targets:
        try:
            path.write_text(text)
        except OSError as exc:
            raise LaunchError(f"cannot write {path}: {exc.strerror or exc}") from None
    return [path for path, _ in targets]

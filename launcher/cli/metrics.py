"""The metric commands: `launch metrics`, `launch compare`, `launch bench`, `launch report`.

Only click is imported at module level; the store, rich, torch (TensorBoard
export) and the orchestration are imported inside the commands that use them.
"""

from __future__ import annotations

import sys

import click

from launcher.catalog.strategies import BENCH_DEFAULT, REGISTRY
from launcher.cli.output import CLUSTER_HELP
from launcher.store.states import JobState
from launcher.views.render import console, json_text


def _load(store, refs):
    """(job row, raw records) for each job reference, in order; unknown ids raise JobNotFound."""
    entries = []
    for ref in refs:
        job = store.job(ref)
        entries.append((job, store.metrics(job.id)))
    return entries


@click.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="The summary and per-rank figures as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Every raw record (one row per rank and reporting step) as CSV.")
@click.option("--tensorboard", "tb_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Also write TensorBoard event files to DIR/JOB/rankN (needs the tensorboard package).")
@click.option("--attempt", type=int, help="Attempt to summarise (default: the latest).")
def metrics(job, as_json, as_csv, tb_dir, attempt):
    """Show a job's metrics per job and per rank; flag stragglers.

    Throughput, step time p50/p95, peak memory, GPU util, MFU and loss, then
    one row per rank. Throughput and step time need the Reporter; peak memory
    and GPU util of ranks without it come from the node agent's process samples.
    Warm-up steps are left out of throughput and step time. A rank more than
    10% slower than the median rank is flagged as a straggler. MFU needs the
    program's FLOPs per sample (the recipes report them) and the GPU's peak
    (known for A100/A800/H100/H200, else gpu.peak_tflops in the cluster spec).

    \b
    Examples:
      launch metrics cifar10-convnet-3f2a1c
      launch metrics cifar10 --json | jq .mfu
      launch metrics cifar10 --csv > cifar10.csv
      launch metrics cifar10 --tensorboard runs/  &&  tensorboard --logdir runs/
    """
    from launcher.store.db import Store
    from launcher.views.compare import job_metrics, metrics_renderables

    if as_json and as_csv:
        raise click.UsageError("--json and --csv are exclusive: give one")
    store = Store()
    [(row, records)] = _load(store, [job])
    usage = store.samples(row.id)
    if tb_dir:
        from launcher.metrics.export import write_tensorboard

        runs = write_tensorboard(row.id, row.spec, records, tb_dir)
        click.echo(f"wrote TensorBoard event files for {len(runs)} rank(s) under {tb_dir}/{row.id}", err=True)
    if as_csv:
        from launcher.metrics.export import write_csv

        write_csv(records, sys.stdout)
        return
    figures = job_metrics(row, records, attempt, usage)
    if as_json:
        click.echo(json_text({"id": row.id, "state": row.state, **figures}))
        return
    out = console()
    for part in metrics_renderables(row, figures):
        out.print(part)


@click.command()
@click.argument("jobs", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="The comparison rows as JSON.")
def compare(jobs, as_json):
    """Compare jobs side by side against the first one.

    Columns: strategy, precision, world size, global batch, step time (p50),
    steps/s, samples/s, tokens/s, peak memory (per GPU on GPU nodes, per rank on
    CPU), GPU util, MFU, speed-up (samples/s) and memory ratio vs the first job,
    wall time, time to the first step, the number of timed steps, and the
    run's attempts and goodput (a restarted job's figures are its last
    attempt's). Jobs that differ in global batch, world size, precision or
    recipe are warned about.

    \b
    Examples:
      launch compare cifar10-convnet-3f2a1c cifar10-convnet-9b8e07
      launch compare bert-ddp bert-zero2 bert-zero3 --json
    """
    from launcher.store.db import Store
    from launcher.views.compare import comparison, comparison_table, job_metrics

    store = Store()
    entries = _load(store, jobs)
    rows = comparison([(job, job_metrics(job, records, usage=store.samples(job.id))) for job, records in entries])
    if as_json:
        click.echo(json_text(rows))
    else:
        console().print(comparison_table(rows))


def _strategy_list() -> str:
    """The strategies `launch bench` accepts, one line each, for its --help."""
    width = max(map(len, REGISTRY))
    return "\n".join(f"  {s.name:<{width}}  {s.description}" for s in REGISTRY.values())


@click.command(epilog="\b\nStrategies (launcher/catalog/strategies.py):\n" + _strategy_list())
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--strategies", default=",".join(BENCH_DEFAULT), show_default=True,
              help="Comma-separated strategies to run, in order; the first is the baseline of the ratios.")
@click.option("--steps", type=click.IntRange(min=1), help="max_steps of every run (default: the job's).")
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False),
              help=CLUSTER_HELP)
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Override a job spec value for every run; repeatable.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False),
              help="Also save the comparison here (.html: the report, else JSON).")
@click.option("--logs", "show_logs", is_flag=True, help="Stream every run's logs with [node/rank] prefixes.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison rows as JSON.")
def bench(job_file, strategies, steps, cluster_file, overrides, out_file, show_logs, as_json):
    """Run a job under each strategy in turn, then compare.

    JOB_FILE runs once per strategy, one after the other, on the same cluster.
    Each run gets what its strategy requires (launcher/catalog/strategies.py): dp runs
    as one process on one node, DataParallel driving the node's GPUs; a torch
    strategy of a `launcher: deepspeed` job runs under torchrun. The micro
    batch is per process, so dp's global batch is micro x accumulation. Every
    run is an ordinary job in the store. A strategy that fails is shown
    as failed with its reason and the others still run; Ctrl-C cancels the
    current run and stops the bench. The comparison is saved (JSON and HTML)
    in the store's run directory, and to --out if given. The exit code is 0
    only if every run succeeded.

    \b
    Examples:
      launch bench jobs/cifar10_convnet.yaml --strategies dp,ddp,ddp_compile,zero2,zero3 --steps 50
      launch bench jobs/bert_large_zero3.yaml --strategies ddp,zero2,zero3 --cluster examples/clusters/a800.yaml --out bench.html
      launch bench jobs/cifar10_convnet.yaml --set resources.nproc_per_node=4 --json
    """
    from launcher.run import bench as bench_mod
    from launcher.views.compare import comparison_table

    def progress(line: str) -> None:
        click.echo(line, err=True)

    def echo(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    result = bench_mod.run_bench(
        job_file, bench_mod.parse_strategies(strategies), steps=steps, cluster_file=cluster_file,
        overrides=tuple(overrides), echo=echo if show_logs else None, progress=progress,
    )
    saved = bench_mod.save(result, job_file, out_file)
    if as_json:
        click.echo(json_text(result.rows))
    else:
        console().print(comparison_table(result.rows))
    click.echo("saved " + ", ".join(str(path) for path in saved), err=True)
    if any(run.state != JobState.SUCCEEDED for run in result.runs):
        sys.exit(1)


@click.command()
@click.argument("jobs", nargs=-1, required=True)
@click.option("--out", "out_file", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="The HTML file to write.")
@click.option("--title", default="launch report", show_default=True, help="Title of the page.")
def report(jobs, out_file, title):
    """Write an HTML report of jobs: plots and the comparison.

    One self-contained file: inline SVG, no scripts, nothing fetched.
    It holds the comparison table (first job = baseline), throughput over
    steps, peak memory per rank, loss over steps, failures and stragglers.

    \b
    Examples:
      launch report cifar10-convnet-3f2a1c --out convnet.html
      launch report bert-ddp bert-zero2 bert-zero3 --out bert.html --title "BERT-large, 4x A800"
    """
    from launcher.spec.files import expand_user
    from launcher.store.db import Store
    from launcher.views.report import build_report

    store = Store()
    entries = _load(store, jobs)
    page = build_report(entries, title=title, usage={job.id: store.samples(job.id) for job, _ in entries},
                        events={job.id: store.events(job.id) for job, _ in entries})
    path = expand_user(out_file, "report --out")
    _write_new_or_own(path, page)
    click.echo(f"wrote {path} ({len(jobs)} job(s), {len(page) // 1024} KB)")


def _write_new_or_own(path, text: str) -> None:
    """Write ``text`` to ``path``, never through a symlink (it could point at any file of the user's, planted
    by whoever can write the directory), and only to a regular file."""
    import os
    import stat

    from launcher.errors import LaunchError

    if path.is_symlink():
        raise LaunchError(f"report --out: {path} is a symbolic link; give the file itself (launch does not write "
                          "through a link)")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise LaunchError(f"cannot write {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LaunchError(f"report --out: {path} is not a regular file; give a file to write")
        try:
            handle.truncate(0)
            handle.write(text)
        except OSError as exc:
            raise LaunchError(f"cannot write {path}: {exc.strerror or exc}") from None

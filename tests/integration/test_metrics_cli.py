"""`launch metrics | compare | report | bench` on jobs run for real (torchrun, 2 gloo ranks).

Two tiny entrypoint jobs are submitted once for the module: 'even' (both
ranks alike) and 'strag' (rank 1 sleeps 20 ms more a step: a straggler).
The cluster spec names an A100, so MFU is computed (tiny on CPU, but exact).

The Reporter runs unchanged, but the program hands it a step clock that advances by exactly
each step's sleep, and a fixed peak memory, so every figure below can be worked out by hand:
a step is 20 ms (40 ms on the straggler's rank 1) and 8 samples / 128 tokens on each rank.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FLOPS_PER_SAMPLE = 1e6
STEPS, EVERY = 12, 2

PROGRAM = f"""
import os, time
import torch, torch.distributed as dist
from launcher.metrics import Reporter, reporter as reporter_module

class StepClock:  # time as the Reporter reads it, with a perf_counter that moves by each step's nominal length
    now = 0.0
    perf_counter = staticmethod(lambda: StepClock.now)
    def __getattr__(self, name):
        return getattr(time, name)

reporter_module.time = StepClock()
reporter_module.peak_memory_bytes = lambda: int(os.environ["PEAK_MB"]) * 1024 * 1024
dist.init_process_group("gloo")
rank = dist.get_rank()
slow = float(os.environ.get("SLOW_SLEEP", "0")) if rank == int(os.environ.get("SLOW_RANK", "-1")) else 0.0
reporter = Reporter(every={EVERY}, flops_per_sample={FLOPS_PER_SAMPLE})
x = torch.randn(64, 64)
for step in range({STEPS}):
    y = x @ x
    time.sleep(0.02 + slow)
    StepClock.now += 0.02 + slow
    reporter.step(samples=8, tokens=128, loss=1.0 / (step + 1))
reporter.close()
dist.barrier()
dist.destroy_process_group()
"""


def launch_argv() -> list[str]:
    """The `launch` console script of this interpreter (or the same entry point through -c)."""
    script = Path(sys.executable).with_name("launch")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from launcher.cli.main import main; main(sys.argv[1:])"]


def run_launch(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `launch ARGS` with the store in ``home`` (cwd = home)."""
    env = {**os.environ, "LAUNCH_HOME": str(home / "store")}
    return subprocess.run([*launch_argv(), *args], cwd=home, env=env, capture_output=True, text=True, timeout=timeout)


def write_job(home: Path, name: str, env: dict[str, str] | None = None) -> Path:
    """A tiny 2-rank entrypoint job (and the program it runs) under ``home``."""
    program = home / "train.py"
    program.write_text(PROGRAM)
    path = home / f"{name}.yaml"
    spec = {
        "name": name, "entrypoint": [sys.executable, str(program)], "batch": {"micro_batch": 8},
        "resources": {"nodes": 1, "nproc_per_node": 2}, "env": env or {},
    }
    path.write_text(json.dumps(spec))
    return path


def write_cluster(home: Path) -> Path:
    """The local cluster, declaring its GPU as an A100 so that MFU has a peak."""
    path = home / "cluster.yaml"
    path.write_text(json.dumps({"name": "local", "backend": "local", "gpu": {"name": "NVIDIA A100-SXM4-80GB"}}))
    return path


def submit(home: Path, job_file: Path, cluster_file: Path) -> str:
    """Submit in the foreground; the job id (the job must succeed)."""
    done = run_launch(home, "submit", str(job_file), "--cluster", str(cluster_file), "--json")
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout.strip().splitlines()[-1])["id"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> tuple[Path, str, str]:
    home = tmp_path_factory.mktemp("metrics")
    cluster = write_cluster(home)
    even = submit(home, write_job(home, "even", {"PEAK_MB": "100"}), cluster)
    strag = submit(home, write_job(home, "strag", {"SLOW_RANK": "1", "SLOW_SLEEP": "0.02", "PEAK_MB": "150"}), cluster)
    return home, even, strag


def test_metrics_prints_the_summary_and_flags_the_straggler(jobs) -> None:
    home, even, strag = jobs
    done = run_launch(home, "metrics", strag)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for text in ("throughput", "step time", "p95", "memory", "MFU", "of 312 TFLOP/s", "RANK", "STRAGGLER"):
        assert text in out
    assert "straggler: rank 1 on" in out
    calm = run_launch(home, "metrics", even)
    assert calm.returncode == 0 and "STRAGGLER" not in calm.stdout


def test_metrics_json_has_mfu_and_per_rank_flags(jobs) -> None:
    home, even, strag = jobs
    data = json.loads(run_launch(home, "metrics", strag, "--json").stdout)
    assert data["id"] == strag and data["state"] == "SUCCEEDED"
    assert data["steps"] == STEPS
    assert data["stragglers"] == [1]
    assert [r["straggler"] for r in data["per_rank"]] == [False, True]
    # step times 20 and 40 ms, their median 30 ms: rank 1 is 40 / 30 = 1.333 of the median
    assert data["per_rank"][1]["slowdown"] == pytest.approx(4 / 3)
    # samples/s: rank 0 8 / 0.02 = 400, rank 1 8 / 0.04 = 200, the job 600
    assert [r["samples_per_sec"] for r in data["per_rank"]] == pytest.approx([400.0, 200.0])
    assert data["samples_per_sec"] == pytest.approx(600.0)
    # MFU: 600 samples/s x 1e6 FLOP = 6e8 FLOP/s over 2 GPUs x 312e12 FLOP/s = 6.24e14: 9.615e-7
    assert data["mfu"] == pytest.approx(9.6153846e-7)
    # tokens/s: 128 / 0.02 + 128 / 0.04 = 6400 + 3200
    assert data["tokens_per_sec"] == pytest.approx(9600.0)
    assert data["peak_mem_mb"] == pytest.approx(150.0)
    assert json.loads(run_launch(home, "metrics", even, "--json").stdout)["stragglers"] == []


def test_metrics_csv_has_one_row_per_record(jobs) -> None:
    home, even, _ = jobs
    done = run_launch(home, "metrics", even, "--csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert len(rows) == 2 * STEPS // EVERY
    assert {r["rank"] for r in rows} == {"0", "1"}
    assert sorted({int(r["step"]) for r in rows}) == list(range(EVERY, STEPS + 1, EVERY))
    assert all(float(r["step_time_s"]) > 0 and r["job"] == even for r in rows)


def test_metrics_tensorboard_writes_event_files_per_rank(jobs, tmp_path) -> None:
    pytest.importorskip("tensorboard", reason="TensorBoard export needs the tensorboard package")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    home, even, _ = jobs
    done = run_launch(home, "metrics", even, "--tensorboard", str(tmp_path / "tb"))
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        acc = EventAccumulator(str(tmp_path / "tb" / even / f"rank{rank}"))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"throughput/samples_per_sec", "step_time_ms", "loss", "memory/peak_mb", "mfu"} <= tags
        assert [e.step for e in acc.Scalars("loss")] == list(range(EVERY, STEPS + 1, EVERY))


def test_compare_prints_the_reference_table_and_json(jobs) -> None:
    home, even, strag = jobs
    done = run_launch(home, "compare", even, strag)
    assert done.returncode == 0, done.stderr
    for header in ("STRATEGY", "PRECISION", "WORLD", "GLOBAL BATCH", "STEP MS", "STEPS/S", "SAMPLES/S", "TOKENS/S",
                   "MEM/GPU", "GPU UTIL", "MFU", "SPEED-UP", "MEM RATIO", "WALL", "1ST STEP", "TIMED STEPS"):
        assert header in done.stdout
    assert f"against {even}" in done.stdout and f"{strag}: straggler rank(s) 1" in done.stdout
    rows = json.loads(run_launch(home, "compare", even, strag, "--json").stdout)
    assert [r["job"] for r in rows] == [even, strag]
    assert rows[0]["baseline"] and rows[0]["speedup"] == pytest.approx(1.0)
    # samples/s: even 400 + 400 = 800, strag 400 + 200 = 600: 600 / 800 = 0.75
    assert [r["samples_per_sec"] for r in rows] == pytest.approx([800.0, 600.0])
    assert rows[1]["speedup"] == pytest.approx(0.75)
    assert rows[1]["mem_ratio"] == pytest.approx(1.5)  # peak memory 150 MB / 100 MB


def test_report_writes_one_self_contained_html_file(jobs) -> None:
    home, even, strag = jobs
    done = run_launch(home, "report", even, strag, "--out", "out.html")
    assert done.returncode == 0, done.stderr
    page = (home / "out.html").read_text()
    assert page.count("<svg") == 3 and page.count("<polyline") == 4
    assert "<script" not in page and "src=" not in page and "href=" not in page and "@import" not in page
    assert even in page and strag in page and "straggler rank 1" in page


@pytest.mark.parametrize("command", [["metrics", "nope"], ["compare", "nope", "nada"], ["report", "nope"]])
def test_unknown_jobs_are_errors_not_tracebacks(jobs, command) -> None:
    home, _, _ = jobs
    done = run_launch(home, *command)
    assert done.returncode == 4
    assert "error: no job 'nope'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["metrics", "compare", "bench", "report"])
def test_every_command_help_shows_an_example(tmp_path, command) -> None:
    done = run_launch(tmp_path, command, "--help")
    assert done.returncode == 0 and "Example" in done.stdout and f"launch {command} " in done.stdout


def test_bench_refuses_an_entrypoint_job(jobs) -> None:
    home, _, _ = jobs
    done = run_launch(home, "bench", "even.yaml", "--strategies", "ddp")
    assert done.returncode == 1 and "built-in recipe" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(not (REPO / "launcher/recipes/train.py").exists(), reason="needs the recipes (launcher/recipes/train.py)")
def test_bench_runs_each_strategy_and_shows_failures_with_reasons(tmp_path) -> None:
    done = run_launch(
        tmp_path, "bench", str(REPO / "jobs/cifar10_convnet.yaml"), "--strategies", "nonsense,dp,ddp", "--steps", "4",
        "--set", "resources.nproc_per_node=2", "--json", "--out", "bench.json", timeout=240,
    )
    assert done.returncode == 1, done.stderr  # one strategy failed
    rows = json.loads(done.stdout)
    assert [r["strategy"] for r in rows] == ["nonsense", "dp", "ddp"]
    assert rows[0]["state"] == "FAILED" and rows[0]["job"] is None
    assert "unknown strategy 'nonsense'; choose one of" in rows[0]["reason"] and ", dp" in rows[0]["reason"]
    # dp needs one process: bench sets it from the registry, over the --set for every run.
    assert rows[1]["state"] == "SUCCEEDED" and rows[1]["world_size"] == 1 and rows[1]["baseline"]
    assert rows[2]["state"] == "SUCCEEDED" and rows[2]["world_size"] == 2 and rows[2]["samples_per_sec"] > 0
    for row in rows[1:]:  # how long each run took, to its first step, and how many steps its figures time
        assert row["wall_s"] > row["first_step_s"] > 0 and 0 < row["timed_steps"] <= 4, row
    assert "bench 3/3: ddp" in done.stderr
    saved = list((tmp_path / "store" / "runs").glob("bench-*/comparison.json"))
    assert len(saved) == 1 and (saved[0].parent / "report.html").exists()
    assert json.loads((tmp_path / "bench.json").read_text())["comparison"] == rows
    listed = json.loads(run_launch(tmp_path, "status", "--json").stdout)
    assert sorted((j["strategy"], j["state"], j["max_steps"]) for j in listed) == [
        ("ddp", "SUCCEEDED", 4), ("dp", "SUCCEEDED", 4)]


@pytest.mark.skipif(not (REPO / "launcher/recipes/train.py").exists(), reason="needs the recipes (launcher/recipes/train.py)")
def test_a_bench_run_is_a_supervised_job_in_status_attach_and_cancel(tmp_path) -> None:
    """`launch bench` supervises each run in its own process: status names it, a plain attach is refused, and
    `launch cancel` asks it (not the orphan path), which stops the bench."""
    from tests.helpers import status_json, wait_for

    store = tmp_path / "store"
    bench = subprocess.Popen(
        [*launch_argv(), "bench", str(REPO / "jobs/cifar10_convnet.yaml"), "--strategies", "ddp,dp", "--steps",
         "100000", "--set", "resources.nproc_per_node=2"], cwd=tmp_path, env={**os.environ, "LAUNCH_HOME": str(store)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job_id = wait_for(lambda: [j["id"] for j in json.loads(run_launch(tmp_path, "status", "--json").stdout)
                                   if j["state"] == "RUNNING"], timeout=180)
        assert job_id, "the bench's first run never reached RUNNING"
        supervisor = status_json(store, job_id[0])["supervisor"]
        assert supervisor["state"] == "attached" and supervisor["pid"] == bench.pid, supervisor
        listed = run_launch(tmp_path, "status")
        assert "unattended" not in listed.stdout, listed.stdout
        refused = run_launch(tmp_path, "attach", job_id[0])
        assert refused.returncode == 1 and f"process {bench.pid} on" in refused.stderr, refused.stderr
        cancelled = run_launch(tmp_path, "cancel", job_id[0])
        assert cancelled.returncode == 0, cancelled.stderr
        out, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.communicate()
    row = status_json(store, job_id[0])
    assert row["state"] == "CANCELLED" and "supervisor was gone" not in (row["reason"] or ""), row["reason"]
    assert "cancelled (SIGTERM to the supervisor)" in row["reason"], row["reason"]
    assert "dp" in err and "not run: the bench was cancelled" in out + err, out + err

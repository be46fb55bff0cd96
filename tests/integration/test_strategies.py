"""Every strategy trains for real: 2 ranks under torchrun, gloo, CPU (dp: 1 process).

Loss tolerance: at fp32 with the same seed and data, each strategy's per-rank
loss at every step must be within LOSS_TOLERANCE (absolute, 1e-3 on losses
around 2) of DDP's. ZeRO flattens and partitions the same fp32 Adam update
and FSDP2 reduce-scatters the same gradients, so only reduction order differs;
observed differences are below 1e-6. dp (DataParallel) is one process per node,
so it is compared with a 1-process DDP run on the same seed and data.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from launcher.catalog.strategies import get_strategy
from launcher.metrics.record import RANK_PREFIX, MetricRecord, parse_line
from launcher.plan.planner import LOG_PREFIX_TEMPLATE
from tests.helpers import TORCH_EXTENSIONS_DIR

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXTENSIONS_CACHE = TORCH_EXTENSIONS_DIR
LOSS_TOLERANCE = 1e-3
# Adam's first update is about lr * sign(grad); rounding differences only move
# parameters whose gradient is near Adam's eps, by a small fraction of lr (1e-3).
PARAM_TOLERANCE = 2e-5
CONVNET = ["--recipe", "convnet", "--precision", "fp32", "--micro-batch", "4", "--grad-accum", "2",
           "--seed", "7", "--metrics-every", "1"]
BASELINE_STEPS = 6


def _env(job_id: str = "test") -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(REPO), DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=EXTENSIONS_CACHE,
        OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", LAUNCH_JOB_ID=job_id,
        TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=LOG_PREFIX_TEMPLATE,  # records are read from each rank's own stream
    )
    env.pop("LAUNCH_METRICS", None)
    env.pop("LAUNCH_METRICS_EVERY", None)
    return env


def run_ranks(args: list[str], timeout: float = 180, nproc: int = 2, job_id: str = "test") -> tuple[int, str, list[dict]]:
    """Run ``nproc`` ranks of the train entry point; returns (exit status, output without torchrun's rank
    prefixes, metric records read from each rank's prefixed stream)."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
        "--local-addr", "127.0.0.1", "--monitor-interval", "0.5", "--tee", "3", "-m", "launcher.recipes.train", *args,
    ]
    proc = subprocess.Popen(command, cwd=REPO, env=_env(job_id), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = _stacks(proc.pid)
        _kill_tree(proc.pid)
        output, _ = proc.communicate(timeout=30)
        pytest.fail(f"ranks did not finish in {timeout}s:\n{output[-6000:]}\n{stacks}")
    parsed = (parse_line(line, world_size=1024, node=None, host=None) for line in output.splitlines())
    records = [r for r in parsed if isinstance(r, MetricRecord)]
    return proc.returncode, re.sub("^" + RANK_PREFIX.pattern, "", output, flags=re.M), records


def _stacks(pid: int) -> str:
    """The Python stacks of torchrun and its workers (py-spy, from the dev extras), to see where a run hangs."""
    py_spy = Path(sys.executable).with_name("py-spy")
    if not py_spy.exists():
        return "(no py-spy to show where the processes are)"
    dumps = []
    for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        done = subprocess.run([str(py_spy), "dump", "--pid", str(process.pid)], capture_output=True, text=True,
                              timeout=30)
        dumps.append(f"--- pid {process.pid}: {' '.join(process.cmdline()[:4])}\n{done.stdout[-3000:]}{done.stderr[-500:]}")
    return "\n".join(dumps)


def _kill_tree(pid: int) -> None:
    """Kill torchrun and its workers (which may sit in sessions of their own)."""
    root = psutil.Process(pid)
    for process in [*root.children(recursive=True), root]:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue


def losses(records: list[MetricRecord]) -> dict[tuple[int, int], float]:
    """{(rank, step): loss} from metric records."""
    return {(r.rank, r.step): r.loss for r in records}


def assert_ok(rc: int, output: str) -> None:
    assert rc == 0, output[-4000:]


@pytest.fixture(scope="module")
def ddp_baseline() -> dict[tuple[int, int], float]:
    rc, output, records = run_ranks([*CONVNET, "--strategy", "ddp", "--max-steps", str(BASELINE_STEPS)])
    assert_ok(rc, output)
    baseline = losses(records)
    assert set(baseline) == {(rank, step) for rank in (0, 1) for step in range(1, BASELINE_STEPS + 1)}
    assert all(math.isfinite(v) for v in baseline.values())
    return baseline


def assert_losses_follow_ddp(strategy: str, got: dict[tuple[int, int], float],
                             ddp_baseline: dict[tuple[int, int], float]) -> None:
    """Every (rank, step) of ``got`` within LOSS_TOLERANCE of DDP's."""
    assert got and set(got) <= set(ddp_baseline), sorted(got)
    worst = max(abs(got[key] - ddp_baseline[key]) for key in got)
    print(f"{strategy}: max |loss - ddp loss| = {worst:.3g}")
    assert worst <= LOSS_TOLERANCE


# fsdp2, zero2, zero3 and zero3_offload: their first 4 steps, in the resume test below
def test_compiled_ddp_losses_follow_ddp(ddp_baseline):
    rc, output, records = run_ranks([*CONVNET, "--strategy", "ddp_compile", "--max-steps", str(BASELINE_STEPS)])
    assert_ok(rc, output)
    assert set(losses(records)) == set(ddp_baseline)
    assert_losses_follow_ddp("ddp_compile", losses(records), ddp_baseline)


# zero2's resume: at another world size, below
def test_checkpoint_resume_ends_at_max_steps(ddp_baseline, tmp_path):
    common = [*CONVNET, "--strategy", "ddp", "--checkpoint-dir", str(tmp_path), "--checkpoint-every", "2"]
    rc, output, records = run_ranks([*common, "--max-steps", "4"])
    assert_ok(rc, output)
    assert max(r.step for r in records) == 4
    assert (tmp_path / "latest").read_text().strip() == "step_00000004"

    rc, output, records = run_ranks([*common, "--max-steps", "6"])
    assert_ok(rc, output)
    assert "resumed from step 4" in output.splitlines()
    assert sorted({r.step for r in records}) == [5, 6]
    assert records[-1].step == 6
    for key, value in losses(records).items():  # the same trajectory as an uninterrupted run
        assert abs(value - ddp_baseline[key]) <= LOSS_TOLERANCE


def test_final_checkpoint_makes_a_restart_a_no_op(tmp_path):
    common = [*CONVNET, "--strategy", "ddp", "--checkpoint-dir", str(tmp_path), "--max-steps", "3"]
    rc, output, records = run_ranks(common)  # no --checkpoint-every: saved once, at the end
    assert_ok(rc, output)
    assert (tmp_path / "latest").read_text().strip() == "step_00000003"
    rc, output, records = run_ranks(common)
    assert_ok(rc, output)
    assert "resumed from step 3" in output.splitlines() and records == []
    # another job on the same dir does not continue this run by surprise; with --resume (checkpoint.resume) it does
    rc, output, records = run_ranks(common, nproc=1, job_id="other")
    assert rc != 0 and f"{tmp_path} holds the checkpoint of job test after step 3: job other would continue " \
        "that run; set checkpoint.resume: true" in output, output[-3000:]
    rc, output, records = run_ranks([*common, "--grad-accum", "4", "--resume"], nproc=1, job_id="other")  # same batch
    assert_ok(rc, output)
    assert "resumed from step 3" in output.splitlines()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_data_parallel_losses_follow_one_process_ddp(precision):
    common = [*CONVNET, "--precision", precision, "--max-steps", str(BASELINE_STEPS)]
    runs = {}
    for strategy in ("ddp", "dp"):
        rc, output, records = run_ranks([*common, "--strategy", strategy], nproc=1)
        assert_ok(rc, output)
        runs[strategy] = losses(records)
    assert set(runs["dp"]) == set(runs["ddp"]) == {(0, step) for step in range(1, BASELINE_STEPS + 1)}
    assert all(math.isfinite(v) for v in runs["dp"].values())
    worst = max(abs(runs["dp"][key] - runs["ddp"][key]) for key in runs["dp"])
    print(f"dp vs 1-process ddp at {precision}: max |loss difference| = {worst:.3g}; "
          f"losses dp {[round(runs['dp'][(0, s)], 5) for s in range(1, BASELINE_STEPS + 1)]}")
    assert worst <= LOSS_TOLERANCE


def test_data_parallel_checkpoint_resumes_under_ddp(tmp_path):
    common = [*CONVNET, "--checkpoint-dir", str(tmp_path)]
    rc, output, first = run_ranks([*common, "--strategy", "dp", "--max-steps", "3"], nproc=1)
    assert_ok(rc, output)
    rc, output, resumed = run_ranks([*common, "--strategy", "ddp", "--max-steps", "5"], nproc=1)
    assert_ok(rc, output)
    assert "resumed from step 3" in output.splitlines()
    assert sorted(losses(resumed)) == [(0, 4), (0, 5)]
    rc, output, straight = run_ranks([*CONVNET, "--strategy", "ddp", "--max-steps", "5"], nproc=1)
    assert_ok(rc, output)
    for key, value in losses(resumed).items():  # the same trajectory as an uninterrupted run
        assert abs(value - losses(straight)[key]) <= LOSS_TOLERANCE


def test_data_parallel_refuses_two_processes_a_node():
    rc, output, records = run_ranks([*CONVNET, "--strategy", "dp", "--max-steps", "2"], nproc=2)
    assert rc != 0 and records == []
    refusals = [line for line in output.splitlines() if "train: error:" in line]
    assert len(refusals) == 2, output[-4000:]
    assert all("strategy 'dp'" in line and "set resources.nproc_per_node: 1" in line for line in refusals)


@pytest.mark.parametrize("argv, message", [
    (["--recipe", "convnet", "--micro-batch", "0"], "--micro-batch"),
    (["--recipe", "convnet", "--seq-len", "64"], "--seq-len does not apply"),
    (["--recipe", "bert", "--seq-len", "4096"], "exceeds"),
    (["--recipe", "convnet", "--strategy", "zero2", "--ds-config-json", '{"train_batch_size": 3}'], "contradicts"),
])
def test_bad_arguments_exit_with_one_line(argv, message):
    proc = subprocess.run([sys.executable, "-m", "launcher.recipes.train", *argv], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train: error:") and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture()
def single_rank_group(tmp_path, monkeypatch):
    import torch.distributed as dist

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "DS_ACCELERATOR": "cpu",
                       "TORCH_EXTENSIONS_DIR": EXTENSIONS_CACHE, "GLOO_SOCKET_IFNAME": "lo"}.items():
        monkeypatch.setenv(key, value)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("strategy", ["ddp", "dp", "zero2"])
def test_accumulation_matches_one_big_batch(strategy, single_rank_group):
    from launcher.plan.dsconfig import make_ds_config
    from launcher.recipes import convnet
    from launcher.recipes.data import DataSpec, split_micro_batches, step_batches
    from launcher.recipes.strategies import TrainOptions, build_trainer

    micro, accum = 4, 4
    batch = next(step_batches(DataSpec("convnet", 0, 1, seed=3, samples_per_step=micro * accum), 0, 1))
    params, grads, moved = [], [], []
    for this_micro, this_accum in ((micro, accum), (micro * accum, 1)):
        ds_config = make_ds_config(strategy, "fp32", this_micro, this_accum, 1) if strategy == "zero2" else None
        opts = TrainOptions(recipe="convnet", strategy=strategy, precision="fp32", lr=1e-3,
                            grad_clip=0.0, ds_config=ds_config)
        trainer = build_trainer(opts, convnet, torch.device("cpu"), seed=11)
        module = trainer.engine.module if strategy == "zero2" else trainer.module
        before = _flat(module)
        trainer.step(split_micro_batches(batch, this_accum))
        params.append(_flat(module))
        if strategy != "zero2":  # gradients stay in .grad until the next step
            grads.append(torch.cat([p.grad.flatten() for p in module.parameters()]))
        moved.append((params[-1] - before).abs().max().item())
    assert min(moved) > 1e-4  # the step really updated the parameters
    if grads:  # the mean over micro-batches, not their sum (Adam alone would hide a missing 1/accum)
        assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)
    difference = (params[0] - params[1]).abs().max().item()
    print(f"{strategy}: accumulation vs one batch, max |param difference| = {difference:.3g}")
    assert difference <= PARAM_TOLERANCE


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in module.parameters()])


def _step_means(records: list[MetricRecord]) -> dict[int, float]:
    """The loss of each step over the whole global batch: the mean of the ranks' (each holds as many samples)."""
    by_step: dict[int, list[float]] = {}
    for r in records:
        by_step.setdefault(r.step, []).append(r.loss)
    return {step: sum(values) / len(values) for step, values in by_step.items()}


# ddp: tests/integration/test_elastic.py, on 3 hosts. zero3_offload's DeepSpeedCPUAdam loads the cpu_adam op
# that `make ops` builds (a run without it builds it first, about a minute).
@pytest.mark.parametrize("strategy", ["fsdp2", "zero2", "zero3", "zero3_offload"])
def test_resume_at_another_world_size_keeps_the_trajectory_and_the_data(strategy, ddp_baseline, tmp_path):
    # global 16 = micro 4 x GA 2 x 2 ranks; resumed on 1 rank: GA 4 keeps 16 (issue 22)
    common = [*CONVNET, "--strategy", strategy, "--checkpoint-dir", str(tmp_path), "--checkpoint-every", "2"]
    rc, output, before = run_ranks([*common, "--max-steps", "4"])
    assert_ok(rc, output)
    assert set(losses(before)) == {(rank, step) for rank in (0, 1) for step in range(1, 5)}
    assert_losses_follow_ddp(strategy, losses(before), ddp_baseline)  # the same trajectory as DDP's, step by step
    one_rank = [*common[: common.index("--grad-accum")], *common[common.index("--grad-accum") + 2:]]
    rc, output, records = run_ranks([*one_rank, "--grad-accum", "4", "--max-steps", str(BASELINE_STEPS)], nproc=1)
    assert_ok(rc, output)
    assert "resumed from step 4" in output.splitlines()
    assert records[-1].step == BASELINE_STEPS and records[-1].extra["samples_consumed"] == BASELINE_STEPS * 16
    if get_strategy(strategy).uses_deepspeed:  # DeepSpeed's own pointer names the universal checkpoint it can load
        assert (tmp_path / (tmp_path / "latest_universal").read_text().strip() / "zero").is_dir()
    expected = _step_means([MetricRecord(rank=rank, step=step, loss=loss) for (rank, step), loss in ddp_baseline.items()])
    got = _step_means(records)
    assert sorted(got) == [5, 6]
    for step, loss in got.items():  # the loss an uninterrupted 2-rank run had at that step
        assert abs(loss - expected[step]) <= LOSS_TOLERANCE, (step, loss, expected[step])


def test_a_steps_samples_are_the_same_at_any_world_size() -> None:
    # global 12 = micro 2 x GA 3 x 2 ranks = micro 2 x GA 2 x 3 ranks = micro 2 x GA 6 x 1 rank
    from launcher.recipes.data import DataSpec, step_batches

    def step(world: int, accum: int, at: int) -> torch.Tensor:
        ranks = [next(step_batches(DataSpec("convnet", rank, world, seed=5, samples_per_step=2 * accum,
                                            micro_batch=2), at, at + 1)) for rank in range(world)]
        return torch.cat([batch["images"] for batch in ranks])

    for at in (0, 7):
        one = step(1, 6, at)
        assert torch.equal(step(2, 3, at), one) and torch.equal(step(3, 2, at), one)
    assert not torch.equal(step(1, 6, 0), step(1, 6, 1))

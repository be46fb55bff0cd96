"""Users' own programs measured without changing them: launch's step hooks (``launcher.node.stephooks``) in their
ranks, 2 processes on the local backend (gloo on CPU).

The programs in tests/programs/ are written in other people's conventions (a plain loop with a DataLoader under DDP,
a nanoGPT-style loop with its own get_batch, Hugging Face's Trainer, Accelerate, FSDP2's fully_shard, a Lightning
Trainer; DeepSpeed's engine in test_user_programs.py) and never import ``launcher``. Each job runs once, in one module fixture.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import ROOT, cli_env, cli_json, run_cli, status_json, write_yaml

pytestmark = pytest.mark.slow
PROGRAMS = ROOT / "tests" / "programs"
STEPS = 12  # each program's optimizer steps


def _submit(home: Path, folder: Path, name: str, argv: list[str], **extra) -> tuple[str, object]:
    job = write_yaml(folder / f"{name}.yaml", {"name": name, "entrypoint": ["python", *argv],
                                               "resources": {"nodes": 1, "nproc_per_node": 2},
                                               "metrics": {"every": 5}, **extra})
    result = run_cli(home, "submit", str(job), timeout=240, env=cli_env(home, LAUNCH_LEASE_DIR=str(folder / "leases")))
    return result.stderr.split()[1].rstrip(":"), result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("observed")
    home = folder / "home"
    out = folder / "out"
    out.mkdir()
    jobs = {
        # DDP, a DistributedSampler, 2 micro-batches of 8 a step; raises at step 6 once, restarted once
        "ddp": _submit(home, folder, "ddp", [str(PROGRAMS / "plain_loop.py"), "--ddp", "--accum", "2", "--fail-at", "6",
                                             "--steps", str(STEPS), "--out", str(out)], restarts=1),
        "nanogpt": _submit(home, folder, "nanogpt", [str(PROGRAMS / "nanogpt_loop.py")]),
        "trainer": _submit(home, folder, "trainer", [str(PROGRAMS / "hf_trainer.py")]),
        "accelerate": _submit(home, folder, "accelerate", [str(PROGRAMS / "accelerate_loop.py")]),
        "fsdp2": _submit(home, folder, "fsdp2", [str(PROGRAMS / "fsdp2_loop.py")]),
        "lightning": _submit(home, folder, "lightning", [str(PROGRAMS / "lightning_loop.py")]),
        # rank 1 leaves a thread running: its training ends, then its Python waits for that thread for ever
        "exit_hang": _submit(home, folder, "exit_hang", [str(PROGRAMS / "plain_loop.py"), "--ddp", "--hang-at-exit", "1",
                                                         "--steps", str(STEPS)],
                             watch={"stall_timeout": 20, "grace_period": 2}),  # 20 s: a loaded start is silent too
        "output": _submit(home, folder, "output", [str(PROGRAMS / "output_forms.py")],
                          resources={"nodes": 1, "nproc_per_node": 1}),
    }
    return home, out, jobs


def _metrics(home: Path, job_id: str) -> dict:
    obj = status_json(home, job_id)
    assert obj["state"] == "SUCCEEDED", obj.get("reason")
    return obj["metrics"]


@pytest.mark.parametrize("name", ["ddp", "nanogpt", "trainer", "accelerate", "fsdp2", "lightning"])
def test_steps_step_time_and_memory_of_a_program_without_the_reporter(runs, name):
    home, _, jobs = runs
    job_id, result = jobs[name]
    assert result.returncode == 0, result.stderr + result.stdout
    metrics = _metrics(home, job_id)
    assert metrics["steps"] == STEPS, "the optimizer steps taken, each counted once"
    assert metrics["step_time_ms_p50"] > 0 and metrics["steps_per_sec"] > 0
    assert metrics["peak_mem_mb"] > 50
    assert sorted(r["rank"] for r in metrics["per_rank"]) == [0, 1]
    assert all(r["steps"] == STEPS for r in metrics["per_rank"])
    records = cli_json(home, "metrics", job_id, "--json")
    assert records["steps"] == STEPS and records["records"] >= 2 * 3, "a record every 5 steps and the last, per rank"


def test_samples_from_the_dataloader_and_tokens_from_the_token_batches(runs):
    home, _, jobs = runs
    ddp = _metrics(home, jobs["ddp"][0])
    assert ddp["samples_per_sec"] > 0 and ddp["tokens_per_sec"] in (None, 0)
    assert 0 < ddp["loss"] < 10, "its loss / 2 on 2 micro-batches a step: their mean, read by the hooks"
    trainer = _metrics(home, jobs["trainer"][0])
    assert trainer["samples_per_sec"] > 0 and trainer["tokens_per_sec"] == pytest.approx(16 * trainer["samples_per_sec"])
    assert _metrics(home, jobs["accelerate"][0])["samples_per_sec"] > 0
    fsdp2 = _metrics(home, jobs["fsdp2"][0])
    assert fsdp2["samples_per_sec"] > 0 and fsdp2["loss"] > 0, "FSDP2's loss is the loss function's: read by the hooks"
    assert 0 < trainer["loss"] < 10, "the loss as the Trainer logged it (its own, divided by the tokens, is left out)"
    lightning = _metrics(home, jobs["lightning"][0])
    assert lightning["samples_per_sec"] > 0 and 0 < lightning["loss"] < 10, "Lightning's loss / its accumulation (1)"
    header = run_cli(home, "metrics", jobs["trainer"][0], "--csv").stdout.splitlines()[0].split(",")
    assert {"learning_rate", "epoch"} <= set(header), "from the Trainer's log lines"


def test_a_program_without_a_dataloader_or_a_batch_shows_steps_per_second_only(runs):
    home, _, jobs = runs
    job_id = jobs["nanogpt"][0]
    metrics = _metrics(home, job_id)
    assert metrics["samples_per_sec"] is None and metrics["steps_per_sec"] > 0
    shown = run_cli(home, "status", job_id).stdout
    assert f"metrics: {STEPS} steps," in shown, "no total invented: the spec gave no max_steps"
    assert "samples/s (batch not seen)" in shown
    assert status_json(home, job_id)["precision"] is None and "(entrypoint), the program's precision," in shown, \
        "the spec named no precision: the program's own, not an invented fp32"


def test_a_program_failing_after_its_first_steps_is_restarted_and_the_reason_names_the_step(runs):
    home, out, jobs = runs
    job_id, result = jobs["ddp"]
    obj = status_json(home, job_id)
    assert obj["attempt"] == 1, "restarts: 1 was used: the error came after steps were taken"
    assert [json.loads(p.read_text())["steps"] for p in sorted(out.glob("rank*.json"))] == [STEPS, STEPS]
    text = run_cli(home, "status", job_id).stdout
    assert "exit code 1: it failed after step 6, the last step observed" in text and "restart 1 of 1" in text
    failed = run_cli(home, "logs", job_id, "--attempt", "0").stdout.splitlines()
    keys = failed.index("[0] Root Cause (first observed failure):") + 1
    assert failed[keys] in ("[0] [0]:", "[0] [1]:"), "torchrun's own report, keyed by rank: a line of the node's"
    assert not any(line.rstrip() in ("[0/0]", "[0/1]") for line in failed), "its keys are no rank's empty line"


def test_a_program_that_trained_then_hangs_in_exit_is_called_hung_in_exit_at_its_last_step(runs):
    home, _, jobs = runs
    job_id, result = jobs["exit_hang"]
    assert result.returncode == 1, result.stderr + result.stdout
    obj = status_json(home, job_id)
    assert obj["state"] == "FAILED" and obj["first_failure"]["kind"] == "hang" and obj["attempt"] == 0
    reason = obj["reason"]
    assert reason.startswith(f"hung in exit: training ended at step {STEPS}; rank(s) 1 on node 0 stuck in exit for "), reason
    assert "rank(s) 0 exited" in reason and "every rank alive" not in reason and "first step" not in reason
    stacks = run_cli(home, "stacks", job_id).stdout
    assert "stacks of 1 of 2 rank(s) in 2 class(es)" in stacks, "rank 0 had exited: no stack, and counted so"
    assert "_shutdown" in stacks, "rank 1's main thread waits in Python's shutdown for the thread it left running"


def test_a_ranks_output_shows_as_it_wrote_it_a_tqdm_bar_an_empty_line_and_stderr_in_order(runs):
    home, _, jobs = runs
    job_id, result = jobs["output"]
    assert result.returncode == 0, result.stderr + result.stdout
    logs = run_cli(home, "logs", job_id).stdout.splitlines()
    lines = [line for line in logs if line.startswith("[0/0]")]
    assert "[0/0] epoch: 3/3" in lines and not any("\\x0d" in line or "\r" in line for line in lines)
    assert lines[lines.index("[0/0] in order 0") - 1].rstrip() == "[0/0]", "the rank's empty line, behind its rank"
    assert not any(line.startswith("[0] [0]:") for line in logs), "not the node's line of a bare prefix"
    assert [line for line in lines if "in order" in line] == [
        f"[0/0] in order {i}" + (" (stderr)" if i % 2 else "") for i in range(10)], "stdout and stderr as written"


def test_compare_and_report_work_for_programs_without_the_reporter(runs, tmp_path):
    home, _, jobs = runs
    ids = [jobs[name][0] for name in ("ddp", "fsdp2", "trainer", "nanogpt", "lightning")]
    shown = run_cli(home, "compare", *ids)
    assert shown.returncode == 0, shown.stderr
    assert all(job_id in shown.stdout for job_id in ids) and "failed" not in shown.stdout
    out = tmp_path / "report.html"
    made = run_cli(home, "report", *ids, "--out", str(out))
    assert made.returncode == 0, made.stderr
    assert all(job_id in out.read_text() for job_id in ids)

"""launch's step hooks in a rank (``launcher.node.sitehook``, ``launcher.node.stephooks``): real Python processes
started with the hooks' folder on their PYTHONPATH as the node agent writes it, and the agent writing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.metrics.record import MARKER, MetricRecord, parse_line
from launcher.node.agent import write_step_hooks
from launcher.node.ship import step_hook_files

LOOP = """
import torch
from torch.utils.data import DataLoader, TensorDataset
ACCUM = {accum}
torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
second = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)  # a GAN's other optimizer: the same step
losses = []
step_loss = 0.0
for index, (x, y) in enumerate(DataLoader(data, batch_size=4)):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    if ACCUM > 1:
        loss = loss / ({divisor})
    loss.backward()
    step_loss += loss.item()
    if (index + 1) % ACCUM:
        continue
    losses.append(step_loss)  # with loss / ACCUM: the mean of the step's micro-batch losses
    step_loss = 0.0
    optimizer.step()
    second.step()
    optimizer.zero_grad()
    if len(losses) == {steps}:
        break
print("LOSSES " + " ".join(map(str, losses)))
"""


@pytest.fixture
def hooks(tmp_path) -> str:
    return write_step_hooks(str(tmp_path), step_hook_files(), None)


def _run(hooks: str, code: str, cwd: Path, **env: str) -> tuple[list[MetricRecord], str]:
    full = {**os.environ, "PYTHONPATH": hooks, "LOCAL_RANK": "0", "RANK": "1", "WORLD_SIZE": "2",
            "LAUNCH_AUTO_METRICS": "5", "OMP_NUM_THREADS": "1", **env}
    for name in ("LAUNCH_METRICS", "LAUNCH_METRICS_EVERY", "LAUNCH_GLOBAL_BATCH"):
        if name not in env:
            full.pop(name, None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    parsed = [parse_line(line, world_size=2, node=0, host="h", rank=1) for line in done.stdout.splitlines()]
    records = [r for r in parsed if isinstance(r, MetricRecord)]
    if records and records[-1].observed:  # the hooks' last says the program returned (none when the Reporter wrote)
        assert [r.ended for r in records] == [False] * (len(records) - 1) + [True]
    return [r for r in records if r.steps or not r.ended], done.stdout + done.stderr


def test_the_agent_puts_the_hooks_first_on_the_ranks_path_and_keeps_theirs(tmp_path):
    path = write_step_hooks(str(tmp_path), step_hook_files(), "/their/lib")
    folder, rest = path.split(os.pathsep, 1)
    assert rest == "/their/lib"
    assert sorted(os.listdir(folder)) == ["__pycache__", "launch_stephooks.py", "sitecustomize.py"], "compiled by the agent"
    assert oct(os.stat(folder).st_mode & 0o777) == "0o700"
    assert write_step_hooks(str(tmp_path), step_hook_files(), None) == folder


def test_a_process_that_never_imports_torch_loads_nothing_and_the_users_sitecustomize_still_runs(hooks, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    code = "import os, sys; print(os.environ.get('THEIRS_RAN'), 'torch' in sys.modules, 'launch_stephooks' in sys.modules)"
    _, out = _run(hooks + os.pathsep + str(theirs), code, tmp_path)
    assert out.split() == ["1", "False", "False"]


def test_optimizer_steps_batches_and_the_loss_are_observed(hooks, tmp_path):
    records, out = _run(hooks, LOOP.format(accum=1, steps=12, divisor=1), tmp_path)
    assert [(r.step, r.steps) for r in records] == [(5, 5), (10, 5), (12, 2)], "two optimizers, one step each iteration"
    assert all(r.observed and r.rank == 1 for r in records)
    assert [r.samples for r in records] == [20, 20, 8], "4 a batch, the DataLoader's first dimension"
    assert all(r.step_time_s and r.step_time_s > 0 and r.mem_peak_bytes for r in records)
    assert [r.warmup for r in records] == [True, False, False]
    losses = [float(v) for v in out.split("LOSSES ")[1].splitlines()[0].split()]
    assert records[0].loss == pytest.approx(losses[4]) and records[1].loss == pytest.approx(losses[9])
    assert records[2].loss is None, "the last partial interval, flushed at exit, has no reporting step's loss"


def test_gradient_accumulation_counts_optimizer_steps_and_the_mean_loss_of_the_micro_batches(hooks, tmp_path):
    # steps 1-5 divide each micro-batch's loss by the accumulation (3); later ones by 7 (a token count, say)
    records, out = _run(hooks, LOOP.format(accum=3, steps=10, divisor="ACCUM if len(losses) < 5 else 7"), tmp_path)
    assert [(r.step, r.steps, r.samples) for r in records] == [(5, 5, 60), (10, 5, 60)]
    losses = [float(v) for v in out.split("LOSSES ")[1].splitlines()[0].split()]
    assert records[0].loss == pytest.approx(losses[4]), "loss / 3 over 3 backward calls: their mean, the step's loss"
    assert records[1].loss is None, "a loss divided by other than the step's backward calls is not the loss: left out"


def test_without_a_dataloader_samples_come_from_the_specs_batch_or_are_not_measured(hooks, tmp_path):
    code = """
    import torch
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    """
    records, _ = _run(hooks, code, tmp_path, LAUNCH_GLOBAL_BATCH="16")
    assert [(r.steps, r.samples) for r in records] == [(5, 40)], "16 a step for 2 ranks: 8 a rank"
    records, _ = _run(hooks, code, tmp_path)
    assert [(r.steps, r.samples, r.samples_per_sec, r.loss) for r in records] == [(5, 0, None, None)]


def test_the_programs_own_reporter_wins_and_launch_metrics_0_turns_them_off(hooks, tmp_path):
    code = """
    import torch
    from launcher.metrics import Reporter
    reporter = Reporter(every=5)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        reporter.step(samples=3)
    reporter.close()
    """
    root = str(Path(__file__).resolve().parents[2])
    records, _ = _run(hooks + os.pathsep + root, code, tmp_path)
    assert [(r.step, r.samples, r.observed) for r in records] == [(5, 15, False), (10, 15, False)]
    records, out = _run(hooks, LOOP.format(accum=1, steps=6, divisor=1), tmp_path, LAUNCH_METRICS="0")
    assert records == [] and MARKER not in out


def test_a_rank_that_fails_says_its_last_step_on_the_way_out(hooks, tmp_path):
    code = """
    import torch
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 10):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        if step == 7:
            raise SystemExit("the program's error")
    """
    records, _ = _run_failing(hooks, code, tmp_path)
    assert [(r.step, r.steps, r.ended) for r in records] == [(5, 5, False), (7, 2, True)]


def _run_failing(hooks: str, code: str, cwd: Path) -> tuple[list[MetricRecord], str]:
    env = {**os.environ, "PYTHONPATH": hooks, "LOCAL_RANK": "0", "RANK": "0", "LAUNCH_AUTO_METRICS": "5"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    records = [parse_line(line, world_size=1, node=0, host="h", rank=0) for line in done.stdout.splitlines()]
    return [r for r in records if isinstance(r, MetricRecord)], json.dumps(done.stderr)


def _dry_run(tmp_path, capsys, **spec) -> dict:
    from launcher.cli.main import main
    from tests.helpers import write_yaml

    job = write_yaml(tmp_path / "job.yaml", {"name": "x", **spec})
    main(["submit", str(job), "--dry-run", "--json"])
    return json.loads(capsys.readouterr().out)


def test_an_entrypoints_ranks_get_the_hooks_unless_metrics_auto_is_false(tmp_path, home, capsys):
    plan = _dry_run(tmp_path, capsys, entrypoint=["python", "train.py"], metrics={"every": 7})
    assert plan["max_steps"] is None, "no total invented for a program that did not say"
    assert [(n["step_hooks"], n["env"]["LAUNCH_AUTO_METRICS"]) for n in plan["nodes"]] == [(True, "7")]
    plan = _dry_run(tmp_path, capsys, entrypoint=["python", "train.py"], metrics={"auto": False}, max_steps=40)
    assert plan["max_steps"] == 40
    assert [(n["step_hooks"], "LAUNCH_AUTO_METRICS" in n["env"]) for n in plan["nodes"]] == [(False, False)]
    plan = _dry_run(tmp_path, capsys, recipe="convnet", batch={"micro_batch": 8})
    assert plan["max_steps"] == 100 and not plan["nodes"][0]["step_hooks"], "recipes report through the Reporter"


def test_metrics_auto_is_a_strict_boolean(tmp_path):
    from launcher.errors import SpecError
    from launcher.spec.load import load_job
    from tests.helpers import write_yaml

    with pytest.raises(SpecError, match="metrics.auto"):
        load_job(write_yaml(tmp_path / "job.yaml", {"name": "x", "entrypoint": ["python", "t.py"], "metrics": {"auto": "maybe"}}))

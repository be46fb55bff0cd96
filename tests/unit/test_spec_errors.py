"""Broken specs are refused with exit 2, the file, line and field named, no traceback, nothing started."""

from __future__ import annotations

import pytest

from launcher.cli.main import main
from tests.helpers import PROBE, write_yaml

GOOD = {
    "name": "ok",
    "entrypoint": ["python", str(PROBE)],
    "batch": {"micro_batch": 8},
    "resources": {"nodes": 1, "nproc_per_node": 2},
}

CASES = [
    # (description, text of the job file, expected fragments)
    ("unknown key", "name: x\nentrypoint: [python, t.py]\nbatch: {micro_batch: 8}\nmax_step: 5\n",
     ["job.yaml:4", "max_step", "unknown key", "did you mean 'max_steps'"]),
    ("wrong type", "name: x\nentrypoint: [python, t.py]\nbatch:\n  micro_batch: eight\n",
     ["job.yaml:4", "batch.micro_batch", "valid integer", "'eight'"]),
    ("missing field", "entrypoint: [python, t.py]\n",
     ["job.yaml:1", "name", "required field is missing"]),
    ("a recipe without a batch", "name: x\nrecipe: convnet\n", ["a recipe needs 'batch'"]),
    ("batch does not divide", "name: x\nentrypoint: [python, t.py]\nbatch: {global_batch: 100, micro_batch: 8}\n"
     "resources: {nodes: 1, nproc_per_node: 2}\n",
     ["global_batch 100", "micro_batch 8", "world size 2", "multiple of 16"]),
    ("more processes than slots", "name: x\nentrypoint: [python, t.py]\nbatch: {micro_batch: 8}\n"
     "resources: {nodes: 1, nproc_per_node: 64}\n",
     ["64 processes on this machine", "local.slots", "this fits: --set resources.nodes=1 --set resources.nproc_per_node="]),
    ("nested unknown key", "name: x\nentrypoint: [python, t.py]\nbatch: {micro_batch: 8, grad_acum: 2}\n",
     ["job.yaml:3", "batch.grad_acum", "did you mean 'grad_accum'"]),
    ("unknown strategy", "name: x\nrecipe: convnet\nstrategy: data_parallel\nbatch: {micro_batch: 8}\n",
     ["job.yaml:3", "strategy", "unknown strategy 'data_parallel'",
      "choose one of ddp_compile, ddp, zero2, zero3, zero3_offload, fsdp2, dp"]),
    ("dp with two processes a node", "name: x\nrecipe: convnet\nstrategy: dp\nbatch: {micro_batch: 8}\n"
     "resources: {nodes: 1, nproc_per_node: 2}\n",
     ["resources.nproc_per_node: strategy 'dp'", "drives all of the node's GPUs", "set resources.nproc_per_node: 1"]),
    ("dp on two nodes", "name: x\nrecipe: convnet\nstrategy: dp\nbatch: {micro_batch: 8}\n"
     "resources: {nodes: 2, nproc_per_node: 1}\n",
     ["resources.nodes: strategy 'dp'", "runs on one node", "set resources.nodes: 1"]),
    ("deepspeed launcher with a torch strategy", "name: x\nrecipe: convnet\nlauncher: deepspeed\nstrategy: ddp\n"
     "batch: {micro_batch: 8}\n",
     ["launcher 'deepspeed' runs the strategies zero2, zero3, zero3_offload", "strategy 'ddp' runs under 'torchrun'"]),
    ("both recipe and entrypoint", "name: x\nrecipe: convnet\nentrypoint: [python, t.py]\nbatch: {micro_batch: 8}\n",
     ["exactly one of 'recipe'"]),
    ("leaving out nodes without restarts", "name: x\nentrypoint: [python, t.py]\nbatch: {micro_batch: 8}\n"
     "leave_out_failed_nodes: true\nrestarts: 1\n",
     ["leave_out_failed_nodes needs restarts: 2 or more", "restarts is 1"]),
    ("leaving out a node of the local cluster", "name: x\nentrypoint: [python, t.py]\nbatch: {micro_batch: 8}\n"
     "leave_out_failed_nodes: true\nrestarts: 2\n",
     ["leave_out_failed_nodes: needs a cluster whose nodes are listed (ssh)", "cluster 'local' is local"]),
    ("an interpreter option the launchers cannot take", "name: x\nentrypoint: [python, -X, faulthandler, t.py]\n",
     ["entrypoint: '-X' is an option of the interpreter", "-X faulthandler: PYTHONFAULTHANDLER=1"]),
    ("not yaml", "name: x\nbatch: {micro_batch: 8\n", ["not valid YAML"]),
    ("checkpoints every N steps with nowhere to write", "name: x\nrecipe: convnet\nbatch: {micro_batch: 8}\n"
     "checkpoint: {dir: null, every_steps: 50}\n",
     ["job.yaml:4: checkpoint.every_steps: every_steps: 50 saves checkpoints, but checkpoint.dir is not set"]),
]


@pytest.mark.parametrize("description,text,fragments", CASES, ids=[c[0] for c in CASES])
def test_broken_job_spec_exits_2_naming_the_problem(description, text, fragments, tmp_path, home, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main(["submit", str(job)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.startswith("error: ")
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} missing from:\n{err}"
    assert "Traceback" not in err
    assert not (home / "jobs.db").exists() or "PENDING" not in (home / "jobs.db").read_bytes().decode("latin-1")


def test_every_problem_is_listed_at_once(tmp_path, home, capsys):
    job = tmp_path / "job.yaml"
    job.write_text("name: Bad Name\nentrypoint: [python, t.py]\nbatch: {micro_batch: 0}\ncolour: red\n")
    with pytest.raises(SystemExit):
        main(["submit", str(job), "--set", "max_steps=-3"])
    err = capsys.readouterr().err
    assert "4 problems" in err
    assert "job.yaml:1: name" in err
    assert "job.yaml:3: batch.micro_batch" in err
    assert "job.yaml:4: colour: unknown key" in err
    assert "--set max_steps=-3: max_steps" in err


def test_set_override_is_validated_and_applied(tmp_path, home, capsys):
    job = write_yaml(tmp_path / "job.yaml", GOOD)
    with pytest.raises(SystemExit) as exit_info:
        main(["submit", str(job), "--set", "resources.nproc_per_node=two"])
    assert exit_info.value.code == 2
    assert "--set resources.nproc_per_node=two" in capsys.readouterr().err
    main(["submit", str(job), "--set", "resources.nproc_per_node=1", "--dry-run", "--json"])
    assert '"world_size": 1' in capsys.readouterr().out


def test_broken_cluster_spec_names_its_file(tmp_path, home, capsys):
    job = write_yaml(tmp_path / "job.yaml", GOOD)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: c\nbackend: ssh\nssh: {usr: root}\nnodes:\n  - {hots: a}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["submit", str(job), "--cluster", str(cluster)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "cluster.yaml:3: ssh.usr: unknown key; did you mean 'user'?" in err
    assert "cluster.yaml:5: nodes.0.hots: unknown key; did you mean 'host'?" in err


def test_validate_checks_several_files(tmp_path, capsys):
    good = write_yaml(tmp_path / "good.yaml", GOOD)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nentrypoint: [python, t.py]\nbatch: {micro_batch: -1}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(good), str(bad), "cluster.yaml"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2
    assert f"ok    {good}" in captured.out and "ok    cluster.yaml" in captured.out
    assert "bad.yaml:3: batch.micro_batch" in captured.err


def test_schema_lists_the_spec_keys(capsys):
    main(["schema", "job"])
    out = capsys.readouterr().out
    for key in ("entrypoint", "recipe", "resources", "nproc_per_node", "global_batch", "secrets"):
        assert f'"{key}"' in out

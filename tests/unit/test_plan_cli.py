"""`launch plan` and the dry-run show the memory fit; a strategy that cannot fit is refused."""

from __future__ import annotations

import json

import pytest

from launcher.backends import load_cluster, plan_job
from launcher.cli.main import main
from launcher.spec.load import load_job
from launcher.views.render import plan_json
from tests.unit.test_plan_golden import check_golden

A800 = "examples/clusters/a800.yaml"
BERT_LARGE = "jobs/bert_large_zero3.yaml"


def test_bert_large_zero3_on_two_a800_nodes_matches_golden():
    plan = plan_job(load_job(BERT_LARGE), load_cluster(A800), "bert-large-zero3-golden", rdzv_port=29500,
                     ds_config=__import__("launcher.run.orchestrate", fromlist=["x"]).deepspeed_config(load_job(BERT_LARGE)))
    data = plan_json(plan)
    check_golden("plan_bert_large_zero3_a800_2x8", data)
    assert data["world_size"] == 16 and data["ds_config"]["train_batch_size"] == data["batch"]["global_batch"]
    assert data["memory"]["fits"] is True


def test_launch_plan_lists_every_strategy_and_recommends_one(capsys):
    main(["plan", BERT_LARGE, "--cluster", A800])
    out = capsys.readouterr().out
    for strategy in ("ddp_compile", "ddp", "zero2", "zero3", "zero3_offload", "fsdp2"):
        assert strategy in out
    assert "recommendation:" in out and "fits in 72.0 usable GiB" in out


def test_a_strategy_that_does_not_fit_is_refused_before_launch(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path))
    overrides = ["--set", "strategy=zero2", "--set", "batch.micro_batch=512", "--set", "batch.global_batch=8192"]
    with pytest.raises(SystemExit) as exit_info:
        main(["submit", BERT_LARGE, "--cluster", A800, *overrides])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "'zero2' needs about" in err and "GiB a GPU" in err
    main(["plan", BERT_LARGE, "--cluster", A800, *overrides, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["plan"]["fits"] is False


def test_status_on_an_empty_store(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path))
    main(["status"])
    assert "no jobs yet" in capsys.readouterr().out
    main(["status", "--json"])
    assert json.loads(capsys.readouterr().out) == []


def test_deepspeed_rejects_a_bad_user_config_before_launch(tmp_path):
    import subprocess

    from tests.helpers import cli_env, launch_argv

    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"zero_optimization": {"reduce_bucket_size": "lots"}}))
    result = subprocess.run(
        launch_argv("submit", "jobs/cifar10_convnet_zero2.yaml", "--set", f"deepspeed.config={user}",
                    "--set", "resources.nproc_per_node=2", "--set", "batch.global_batch=null",
                    "--set", "batch.micro_batch=2"),
        capture_output=True, text=True, env=cli_env(tmp_path), timeout=120,
    )
    assert result.returncode == 3, result.stderr
    assert "deepspeed config:" in result.stderr and "reduce_bucket_size" in result.stderr
    assert "nothing was started" in result.stderr
    assert json.loads(subprocess.run(launch_argv("status", "--json"), capture_output=True, text=True,
                                     env=cli_env(tmp_path)).stdout) == []


def test_the_dry_run_says_where_the_cluster_came_from_who_is_told_and_what_a_restart_redoes(
        tmp_path, home, monkeypatch, capsys):
    """The cluster is $LAUNCH_CLUSTER, else $LAUNCH_HOME/cluster.yaml, else ./cluster.yaml; with none of them the job
    runs on this machine and the dry run says so. Notifiers are shown as written (a token stays ``${NAME}``)."""
    from tests.helpers import write_yaml

    job = write_yaml(tmp_path / "job.yaml", {
        "name": "told", "recipe": "convnet", "batch": {"micro_batch": 2}, "max_steps": 4, "restarts": 2,
        "resources": {"nodes": 1, "nproc_per_node": 1}, "secrets": ["TOKEN"],
        "notify": {"on": ["failed", "restarted"], "webhooks": ["http://127.0.0.1:9/${TOKEN}"]},
    })
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.delenv("LAUNCH_CLUSTER", raising=False)

    def dry_run() -> str:
        main(["submit", str(job), "--dry-run"])
        return capsys.readouterr().out

    out = dry_run()
    assert "cluster     this machine: no --cluster, and none of $LAUNCH_CLUSTER, $LAUNCH_HOME/cluster.yaml, " \
           "./cluster.yaml exists" in out
    assert "notify      on failed, restarted: webhook http://127.0.0.1:9/${TOKEN}" in out
    assert "warning     restarts: 2, but checkpoint.dir is not set: a restart begins again at step 0" in out

    write_yaml(here / "cluster.yaml", {"name": "cwd", "backend": "local"})
    home.mkdir()
    write_yaml(home / "cluster.yaml", {"name": "home", "backend": "local"})
    write_yaml(tmp_path / "env.yaml", {"name": "env", "backend": "local"})
    assert "cluster     home (backend local)" in dry_run()
    monkeypatch.setenv("LAUNCH_CLUSTER", str(tmp_path / "env.yaml"))
    out = dry_run()
    assert "cluster     env (backend local)" in out and "this machine: no --cluster" not in out
    monkeypatch.delenv("LAUNCH_CLUSTER")
    (home / "cluster.yaml").unlink()
    assert "cluster     cwd (backend local)" in dry_run()

    monkeypatch.setenv("LAUNCH_CLUSTER", str(tmp_path / "gone.yaml"))
    with pytest.raises(SystemExit) as exit_info:
        main(["submit", str(job), "--dry-run"])
    assert exit_info.value.code == 2
    assert f"LAUNCH_CLUSTER={tmp_path / 'gone.yaml'}: no such file" in capsys.readouterr().err

    monkeypatch.delenv("LAUNCH_CLUSTER")
    main(["submit", str(job), "--dry-run", "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
          "--set", "checkpoint.every_steps=2"])
    assert "restarts: 2" not in capsys.readouterr().out

"""A Slurm command that fails is unknown, never an empty answer; the Slurm backend's protocol never raises for it.

Slurm's client commands are replaced by a fake ``subprocess.run`` that answers per command (the words are
Slurm's own, from tools/SLURM-NOTES.md and a busy controller); nothing runs.
"""

from __future__ import annotations

import subprocess

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.backends.base import SweepOutcome
from launcher.backends.failures import LOST_NODE_EXIT
from launcher.backends.slurm import commands as cli
from launcher.backends.slurm.backend import SlurmBackend
from launcher.backends.slurm.job import SlurmJob, SlurmNode
from launcher.spec.job import JobSpec

BUSY = "slurm_load_jobs error: Socket timed out on send/recv operation"
FORGOTTEN = "slurm_load_jobs error: Invalid job id specified"


def fake_slurm(monkeypatch, answers: dict[str, object]) -> list[list[str]]:
    """Each command (by its name) answers ``(code, stdout, stderr)`` or raises the exception given; the argv asked."""
    asked: list[list[str]] = []

    def run(argv, **kwargs):
        asked.append(list(argv))
        answer = answers[argv[0]]
        if isinstance(answer, BaseException):
            raise answer
        code, out, err = answer
        return subprocess.CompletedProcess(argv, code, out, err)

    monkeypatch.setattr(cli.subprocess, "run", run)
    return asked


@pytest.mark.parametrize("ask", [
    lambda: cli.steps("12"), lambda: cli.jobs_named("launch-x"), lambda: cli.node_reasons(["n1"]),
    lambda: cli.show_job("12"), lambda: cli.nodes_in_service("p"), lambda: cli.partition_gpus("p"),
    lambda: cli.job_status("12"),
], ids=["steps", "jobs_named", "node_reasons", "show_job", "nodes_in_service", "partition_gpus", "job_status"])
def test_a_failed_slurm_command_is_an_error_naming_slurms_words_not_an_empty_answer(monkeypatch, ask):
    fake_slurm(monkeypatch, {"squeue": (1, "", BUSY), "scontrol": (1, "", BUSY), "sinfo": (1, "", BUSY)})
    with pytest.raises(cli.SlurmCommandError, match="Socket timed out"):
        ask()


def test_a_job_the_controller_forgot_has_no_steps_and_no_details(monkeypatch):
    fake_slurm(monkeypatch, {"squeue": (1, "", FORGOTTEN), "scontrol": (1, "", FORGOTTEN)})
    assert cli.steps("12") == []
    assert cli.show_job("12") == {}
    assert cli.job_status("12").state == cli.SlurmState.GONE


def slurm_plan(tmp_path):
    cluster = cluster_spec(name="s", backend="slurm", slurm={"partition": "p"}, workdir=str(tmp_path))
    job = JobSpec.model_validate({"name": "j", "entrypoint": ["python", "t.py"],
                                  "resources": {"nodes": 2, "nproc_per_node": 1}})
    return cluster, plan_job(job, cluster, "j-00000001", rdzv_port=29500)


def test_a_sweep_that_could_not_ask_slurm_reports_every_node_unchecked_not_clean(monkeypatch, tmp_path):
    fake_slurm(monkeypatch, {"squeue": (1, "", BUSY), "scontrol": (1, "", BUSY), "sinfo": (1, "", BUSY),
                             "scancel": (0, "", "")})
    cluster, plan = slurm_plan(tmp_path)

    report = SlurmBackend(cluster).sweep(plan, grace=1.0)

    assert not report.clean
    assert [n.outcome for n in report.nodes] == [SweepOutcome.UNREACHABLE] * 2
    assert all("Socket timed out" in problem and "not checked" in problem for problem in report.problems())


def test_a_sweep_that_finds_a_job_but_cannot_follow_it_reports_it_unchecked(monkeypatch, tmp_path):
    answers = iter([(0, "12\n", ""), (1, "", BUSY)])  # squeue -n finds job 12, then squeue -j 12 fails
    monkeypatch.setattr(cli, "run", lambda argv, timeout=30.0: subprocess.CompletedProcess(argv, *next(answers)))
    cluster, plan = slurm_plan(tmp_path)

    report = SlurmBackend(cluster).sweep(plan, grace=1.0)

    assert not report.clean
    assert all("Slurm job 12" in problem and "Socket timed out" in problem for problem in report.problems())


def test_a_command_on_a_node_whose_srun_times_out_is_an_unreachable_result_and_no_kernel_log(monkeypatch, tmp_path):
    fake_slurm(monkeypatch, {"squeue": (0, "RUNNING|None|n[1-2]\n", ""),
                             "srun": subprocess.TimeoutExpired(["srun"], 90)})
    cluster, plan = slurm_plan(tmp_path)
    backend = SlurmBackend(cluster)
    backend._jobs[plan.job_id] = SlurmJob("12", tmp_path)  # the job this backend started

    result = backend.run_on_node(plan, 1, ["true"], timeout=60)

    assert result.code == LOST_NODE_EXIT and "timed out" in result.err and "node 1" in result.err
    assert backend.kernel_log(plan, 1) == []


def test_a_node_exit_is_known_without_its_output_being_read(monkeypatch, tmp_path):
    fake_slurm(monkeypatch, {"squeue": (0, "RUNNING|None|n[1-2]\n", "")})
    (tmp_path / "node0.out").write_text('@started {"pid": 5}\n|hello\n@exit {"code": 0}\n')
    (tmp_path / "node1.out").write_text('@started {"pid": 6}\n|still going\n')
    job = SlurmJob("12", tmp_path)

    assert SlurmNode(0, "n1", job, 5).poll() == 0
    assert SlurmNode(1, "n2", job, 6).poll() is None


def test_a_node_poll_while_slurm_does_not_answer_is_unknown_not_an_error(monkeypatch, tmp_path):
    fake_slurm(monkeypatch, {"squeue": (1, "", BUSY)})
    (tmp_path / "node0.out").write_text('@started {"pid": 5}\n')
    assert SlurmNode(0, "n1", SlurmJob("12", tmp_path), 5).poll() is None

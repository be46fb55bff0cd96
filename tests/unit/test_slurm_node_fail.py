"""A node whose slurmd dies: Slurm fails the job (NODE_FAIL) and kills the other nodes' steps, whose ends reach the
supervisor first. The lost node is the first failure, a restartable one; the others are Slurm's echo of it.

Slurm's client commands are replaced by a fake ``subprocess.run`` answering as Slurm did on the test bed; nothing runs.
"""

from __future__ import annotations

import subprocess

from launcher.backends.failures import ENDED_FOR_ANOTHER_NODE, FailureKind, precedence
from launcher.backends.slurm import commands as cli
from launcher.backends.slurm.job import SlurmJob
from launcher.run.restarts import why_not_restart

ANSWERS = {
    ("squeue",): "NODE_FAIL|NodeDown|lu-h[1-2]\n",
    ("scontrol", "show", "job"): "JobId=12 JobName=launch-x JobState=NODE_FAIL Reason=NodeDown NodeList=lu-h[1-2]\n",
    ("scontrol", "show", "hostnames"): "lu-h1\nlu-h2\n",
    ("sinfo",): "lu-h1|idle|none\nlu-h2|down*|Not responding\n",
}


def _slurm(argv, **kwargs):
    for words, out in ANSWERS.items():
        if tuple(argv[:len(words)]) == words:
            return subprocess.CompletedProcess(argv, 0, out, "")
    raise AssertionError(f"unexpected command {argv}")


def test_the_node_slurm_ended_for_another_is_an_echo_and_the_lost_node_comes_first(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cli.subprocess, "run", _slurm)
    job = SlurmJob("12", tmp_path)
    ended, lost = job.scheduler_failure("lu-h1"), job.scheduler_failure("lu-h2")
    assert ended is not None and ended.kind == FailureKind.EXIT and ended.reason.startswith(ENDED_FOR_ANOTHER_NODE)
    assert "NODE_FAIL" in ended.reason and "down: lu-h2" in ended.reason
    assert lost is not None and lost.kind == FailureKind.LOST and "lu-h2 is down*: Not responding" in lost.reason
    seen_first = ended.model_copy(update={"node": 0, "exit_code": -9, "observed": 1})
    seen_later = lost.model_copy(update={"node": 1, "exit_code": 255, "observed": 2})
    assert min([seen_first, seen_later], key=precedence).node == 1


def test_a_lost_slurm_node_is_restarted_under_restart_on_transient(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cli.subprocess, "run", _slurm)
    lost = SlurmJob("12", tmp_path).scheduler_failure("lu-h2")
    assert why_not_restart(0, lost, restarts=1, restart_on="transient", leave_out=False) is None

"""Leases end to end (docs/LEASES.md): real users, real sshd in namespaced hosts, real node agents and torchrun.

Every job here runs tests/programs/lease_hold.py: each rank notes when it starts and ends (in its user's
own times file) and holds its slot until the test creates the job's release file, so what ran when is
read from the ranks themselves, never from sleeps.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from launcher.backends import cluster_spec, leasing
from launcher.backends.base import StartContext
from launcher.backends.ssh.backend import SSHBackend
from launcher.node import proctree
from launcher.run import orchestrate, queue
from launcher.spec.job import JobSpec
from launcher.store.db import Store
from tests.helpers import ROOT, wait_for, write_yaml
from tests.testbed_fixture import needs_root
from tests.users_fixture import User
from tools import testbed as tb

pytestmark = [needs_root, pytest.mark.testbed]

HOLD = ROOT / "tests" / "programs" / "lease_hold.py"
HOSTS = ("lt-h1", "lt-h2")


class Bed:
    """One test's shared lease directory, release files, and each user's job and cluster files."""

    def __init__(self, testbed: tb.Testbed, users: dict[str, User], slots: int) -> None:
        self.testbed, self.users = testbed, users
        self.dir = Path(tempfile.mkdtemp(prefix="lt-lease-test-", dir=next(iter(users.values())).dir.parent))
        self.dir.chmod(0o755)
        self.leases = self.dir / "leases"
        self.leases.mkdir()
        self.leases.chmod(0o1777)
        self.slots = slots

    def env(self, user: User) -> dict[str, str]:
        return user.env(LAUNCH_LEASE_DIR=str(self.leases))

    def files(self, user: User, tag: str, report: bool = False) -> tuple[str, str]:
        """(job file, cluster file) of ``user``'s 2-node job ``tag``, written where the user can read them; ``report``:
        its ranks report a step every 0.5 s (of max_steps 100000) while they hold their slots."""
        hosts = {h.name: h for h in self.testbed.hosts}
        cluster = {
            "name": "bed", "backend": "ssh",
            "ssh": {"user": user.name, "port": tb.SSH_PORT, "key_file": str(user.key), "known_hosts": str(user.known_hosts),
                    "config_file": str(user.ssh_config)},
            "nodes": [{"host": name, "address": hosts[name].address, "gpus": 0, "slots": self.slots} for name in HOSTS],
            "python": sys.executable, "workdir": "/tmp",
        }
        job = {"name": f"hold-{tag}", "entrypoint": ["python", str(HOLD)], "resources": {"nodes": 2, "nproc_per_node": 1},
               "watch": {"grace_period": 1},
               "env": {"TEST_TIMES": str(self.times(user, tag)), "TEST_RELEASE": str(self.dir / f"release-{tag}")}}
        if report:
            job.update(max_steps=100000)
            job["env"].update(TEST_REPORT="1", TEST_STEP_S="0.5", PYTHONPATH=str(ROOT))
        paths = (write_yaml(self.dir / f"job-{tag}.yaml", job), write_yaml(self.dir / f"cluster-{user.name}.yaml", cluster))
        return str(paths[0]), str(paths[1])

    def times(self, user: User, tag: str) -> Path:
        """Where the ranks of ``user``'s job ``tag`` note their start and end (the user's own directory)."""
        return user.dir / f"times-{self.dir.name}-{tag}"

    def release(self, tag: str) -> None:
        (self.dir / f"release-{tag}").touch()


def _times(bed: Bed, user: User, tag: str) -> list[tuple[str, str, str, float]]:
    """(what, job, host, time) of each start and end line the job's ranks wrote."""
    path = bed.times(user, tag)
    if not path.exists():
        return []
    return [(p[0], p[1], p[3], float(p[5])) for p in (line.split() for line in path.read_text().splitlines())]


def _started(bed: Bed, user: User, tag: str, ranks: int = 2) -> str | None:
    """The job id once ``ranks`` ranks of job ``tag`` started."""
    starts = [t for t in _times(bed, user, tag) if t[0] == "start"]
    return starts[0][1] if len(starts) >= ranks else None


def _until_started(bed: Bed, user: User, tag: str, proc: subprocess.Popen) -> str | None:
    """The job id once both ranks of job ``tag`` started; None if its submit ended first."""
    wait_for(lambda: _started(bed, user, tag) or proc.poll() is not None, timeout=90)
    return _started(bed, user, tag)


def _job(bed: Bed, user: User, state: str) -> dict | None:
    done = user.run(["status", "--json"], bed.env(user))
    jobs = [job for job in json.loads(done.stdout or "[]") if job["state"] == state]
    return jobs[0] if jobs else None


def _why(proc: subprocess.Popen) -> str:
    """What a submit said, once it has ended (a job that never started)."""
    return proc.communicate(timeout=60)[1] if proc.poll() is not None else "(still running)"


def _ended(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _by_host(bed: Bed, user: User, tag: str) -> dict[str, tuple[float, float]]:
    """Per host: (first start, last end) of the job's ranks there."""
    times = _times(bed, user, tag)
    return {host: (min(t[3] for t in times if t[2] == host and t[0] == "start"),
                   max(t[3] for t in times if t[2] == host and t[0] == "end")) for host in {t[2] for t in times}}


def test_a_second_users_job_exits_3_naming_the_holder_or_waits_its_turn_and_a_third_waits_behind_it(
        testbed: tb.Testbed, unix_users: dict[str, User]) -> None:
    a, b, c = unix_users.values()
    bed = Bed(testbed, unix_users, slots=1)
    first = a.popen(["submit", *_submit_args(bed, a, "a", report=True)], bed.env(a))
    job_a = _until_started(bed, a, "a", first)
    assert job_a, _why(first)
    # a's job reports steps: every user sees how far it is and when it may end (its agents record its pace)
    paced = rf"job {job_a} \(user {a.name}, from {re.escape(socket.gethostname())}, since \d\d:\d\d; " \
            rf"step \d+/100000, ETA \d\d:\d\d\)"
    queue_of_c = ["queue", "--cluster", bed.files(c, "c")[1]]
    listed = wait_for(lambda: len(re.findall(paced, c.run(queue_of_c, bed.env(c)).stdout)) == len(HOSTS), timeout=60)
    assert listed, c.run(queue_of_c, bed.env(c)).stdout

    refused = b.run(["submit", *_submit_args(bed, b, "b")], bed.env(b))
    assert refused.returncode == 3, refused.stderr
    for host in HOSTS:
        assert re.search(rf"{host} slot 0: {paced}", refused.stderr), refused.stderr
    assert not _times(bed, b, "b"), "the refused job started a rank"

    second = b.popen(["submit", *_submit_args(bed, b, "b"), "--wait"], bed.env(b))
    queued = wait_for(lambda: _job(bed, b, "QUEUED"), timeout=60)
    assert queued and job_a in queued["queue_reason"] and f"user {a.name}" in queued["queue_reason"], queued
    assert "ETA" not in queued["queue_reason"], "the waiting reason changes only when the holders do"
    shown = b.run(["status", queued["id"]], bed.env(b)).stdout
    assert f"waiting: lt-h1 slot 0: job {job_a}" in shown, shown
    assert re.search(rf"; now job {job_a} of {a.name}: step \d+/100000, ETA \d\d:\d\d", shown), shown
    third = c.popen(["submit", *_submit_args(bed, c, "c"), "--wait"], bed.env(c))
    job_c = wait_for(lambda: _job(bed, c, "QUEUED"), timeout=60)
    assert job_c, _why(third)

    listed = c.run(["queue", "--cluster", bed.files(c, "c")[1]], bed.env(c))
    assert listed.returncode == 0, listed.stderr
    for host in HOSTS:
        assert f"{host} slot 0: job {job_a} (user {a.name}" in listed.stdout, listed.stdout
    assert f"1. job {queued['id']} (user {b.name}" in listed.stdout and f"2. job {job_c['id']} (user {c.name}" in listed.stdout
    as_json = json.loads(c.run(["queue", "--cluster", bed.files(c, "c")[1], "--json"], bed.env(c)).stdout)
    assert [w["job"] for w in as_json["waiting"]] == [queued["id"], job_c["id"]]

    bed.release("a")
    assert _ended(first)[0] == 0
    assert _until_started(bed, b, "b", second), _why(second)
    assert _job(bed, c, "QUEUED"), "the third job started while the second held the slots"
    bed.release("b")
    code, err = _ended(second)
    assert code == 0, err
    bed.release("c")
    code, err = _ended(third)
    assert code == 0, err
    spans = [_by_host(bed, a, "a"), _by_host(bed, b, "b"), _by_host(bed, c, "c")]
    for host in HOSTS:
        assert spans[0][host][1] <= spans[1][host][0] and spans[1][host][1] <= spans[2][host][0], spans


def _submit_args(bed: Bed, user: User, tag: str, report: bool = False) -> list[str]:
    job, cluster = bed.files(user, tag, report)
    return [job, "--cluster", cluster]


STEAL = """
import fcntl, json, os, sys
from launcher.node import leases
directory, holder_uid, holder_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lock = os.path.join(directory, leases.host_name() + ".slot0.lock")
tried = {}
fd = os.open(lock, os.O_RDONLY)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    tried["flock"] = "taken"
except BlockingIOError:
    tried["flock"] = "held"
for name, step in (("unlink", lambda: os.unlink(lock)), ("replace", lambda: os.replace(open(os.path.join(directory, "mine"), "w").name, lock)),
                   ("write", lambda: os.open(lock, os.O_WRONLY)), ("kill", lambda: os.kill(holder_pid, 9)),
                   ("forge", lambda: open(os.path.join(directory, leases.host_name() + f".holder.{holder_uid}.{holder_pid}"), "w"))):
    try:
        step()
        tried[name] = "done"
    except OSError as exc:
        tried[name] = type(exc).__name__
got = leases.acquire("slot", 1, 1, {"job": "thief"}, directory=directory)
tried["acquire"] = "busy" if isinstance(got, leases.Busy) else "taken"
tried["holder"] = leases.survey("slot", 1, directory).holders[0].job
print(json.dumps(tried))
"""


def test_kill_9_of_the_holders_agents_frees_its_leases_at_once_and_no_other_user_can_take_or_release_them(
        testbed: tb.Testbed, unix_users: dict[str, User]) -> None:
    a, b, c = unix_users.values()
    bed = Bed(testbed, unix_users, slots=1)
    first = a.popen(["submit", *_submit_args(bed, a, "a")], bed.env(a))
    job_a = _until_started(bed, a, "a", first)
    assert job_a, _why(first)
    second = b.popen(["submit", *_submit_args(bed, b, "b"), "--wait"], bed.env(b))
    assert wait_for(lambda: _job(bed, b, "QUEUED"), timeout=60), _why(second)

    agents = {n["host"]: n["pid"] for n in json.loads(a.run(["status", job_a, "--json"], bed.env(a)).stdout)["nodes"]}
    host = testbed.host("lt-h1")
    tried = json.loads(tb.exec_in(host, ["runuser", "-u", b.name, "--", "env", f"PYTHONPATH={ROOT}", sys.executable, "-c",
                                         STEAL, str(bed.leases), str(a.uid), str(agents["lt-h1"])]).stdout)
    assert tried == {"flock": "held", "unlink": "PermissionError", "replace": "PermissionError",
                     "write": "PermissionError", "kill": "PermissionError", "forge": "PermissionError",
                     "acquire": "busy", "holder": job_a}, tried

    killed_at = time.time()
    for pid in agents.values():
        os.kill(pid, signal.SIGKILL)
    assert _until_started(bed, b, "b", second), _why(second)
    assert _ended(first)[0] != 0
    bed.release("b")
    assert _ended(second)[0] == 0
    started = min(t[3] for t in _times(bed, b, "b") if t[0] == "start")
    free = next(e["t"] for e in Store(b.home).events(_times(bed, b, "b")[0][1]) if e["kind"] == "allocated")
    print(f"after kill -9 of the holder's agents: the waiting job found the leases free in {free - killed_at:.2f} s, "
          f"its first rank started in {started - killed_at:.2f} s")


def test_a_run_root_another_user_made_first_no_longer_stops_a_job_which_is_taken_over_and_cleaned(
        testbed: tb.Testbed, unix_users: dict[str, User]) -> None:
    """Issue 39, item 6: b makes /tmp/launch-UID of c first (the root of c's run directories before: the hosts log in
    without PAM, so without a runtime directory), and plants a directory and a symlink at names of the new roots. c's
    job still starts, in a root c made (found by its owner), is taken over by a second supervisor (`fence`, `record`
    and `follow` find it there) and its run directory goes once the taker filed its end. Before, the job was refused."""
    _, b, c = unix_users.values()
    bed = Bed(testbed, unix_users, slots=1)
    theirs = [Path(f"/tmp/launch-{c.uid}"), Path(f"/tmp/launch-{c.uid}-000000000000")]
    link = Path(f"/tmp/launch-{c.uid}-000000000001")
    _remove_run_roots(c.uid)  # what an earlier session's users left
    planted = b.python(f"import os; [os.mkdir(p, 0o700) for p in {[str(p) for p in theirs]!r}]; "
                       f"os.symlink({str(b.dir)!r}, {str(link)!r})", bed.env(b))
    try:
        assert planted.returncode == 0 and all(p.lstat().st_uid == b.uid for p in [*theirs, link]), planted.stderr
        job_file, cluster_file = bed.files(c, "c")
        submit = c.popen(["submit", job_file, "--cluster", cluster_file], bed.env(c))
        job_id = _until_started(bed, c, "c", submit)
        assert job_id, _why(submit)
        roots = [p for p in Path("/tmp").glob(f"launch-{c.uid}-*") if not p.is_symlink() and p.stat().st_uid == c.uid]
        assert len(roots) == 1 and roots[0].stat().st_mode & 0o777 == 0o700, roots
        run_dir = roots[0] / job_id
        assert (run_dir / "node0.journal").exists() and (run_dir / "node1.journal").exists()
        assert all(os.listdir(p) == [] for p in theirs), "nothing of c's in what b made"

        taker = c.popen(["attach", job_id, "--takeover"], bed.env(c))
        code, said = _ended(submit)
        assert code == 5 and "taken over by a newer supervisor" in said, said
        bed.release("c")
        out, err = taker.communicate(timeout=180)
        assert taker.returncode == 0 and f"job {job_id}: SUCCEEDED" in err, err + out[-2000:]
        assert not run_dir.exists(), "the one store that followed the job filed it: its run directory went"
        assert [p.lstat().st_uid for p in [*theirs, link]] == [b.uid] * 3, "b's left as they were"
    finally:
        bed.release("c")
        _remove_run_roots(c.uid)


def _remove_run_roots(uid: int) -> None:
    """Whatever is at the names of the run roots of ``uid`` in /tmp (``launcher/node/rundir.py``)."""
    for path in [*Path("/tmp").glob(f"launch-{uid}"), *Path("/tmp").glob(f"launch-{uid}-*")]:
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)


QUICKER = """
import sys, time
from launcher.node import leases
got = leases.acquire("slot", 1, 1, {"job": "quicker"}, directory=sys.argv[1])
print(got.devices, flush=True)
time.sleep(3600)
"""


def test_a_job_finding_one_hosts_leases_taken_at_start_starts_no_rank_on_any_host(
        testbed: tb.Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race between preflight and start, made certain: a holder takes lt-h2's one slot after the check."""
    lease_dir = tmp_path / "leases"
    monkeypatch.setenv("LAUNCH_LEASE_DIR", str(lease_dir))
    hosts = {h.name: h for h in testbed.hosts}
    cluster = cluster_spec({
        **yaml.safe_load(testbed.cluster_yaml(sys.executable, n=2)),
        "nodes": [{"host": name, "address": hosts[name].address, "gpus": 0, "slots": 1} for name in HOSTS]})
    times = tmp_path / "times"
    job = JobSpec(name="race", entrypoint=["python", str(HOLD)], resources={"nodes": 2, "nproc_per_node": 1},
                  env={"TEST_TIMES": str(times), "TEST_RELEASE": str(tmp_path / "release")})
    prepared = orchestrate.prepare_job(job, cluster)
    backend = SSHBackend(cluster)
    try:
        plan = orchestrate.preflight(prepared, backend, run_check=False, warn=None)
        tb.start_daemon(hosts["lt-h2"], "quicker", ["env", f"PYTHONPATH={ROOT}", sys.executable, "-c", QUICKER,
                                                    str(lease_dir)])
        assert wait_for(lambda: list(lease_dir.glob("lt-h2.holder.*")), timeout=30)
        with pytest.raises(leasing.LeasesBusy, match=f"{leasing.TAKEN_FIRST} .*lt-h2 slot 0: job quicker"):
            backend.start(plan, StartContext(run_dir=tmp_path, secrets={}, grace=1.0))
    finally:
        tb.stop_daemon(hosts["lt-h2"], "quicker")
        backend.close()
    assert not times.exists(), "no rank ran on any host"
    # the agent told not to start (lt-h1's) may still be exiting when start has raised: it goes by itself
    assert wait_for(lambda: proctree.job_pids(plan.job_id) == [], timeout=10), proctree.job_pids(plan.job_id)
    # issue 39, item 5: root's `launch queue --set-up --cluster` gives each node's lock files to root, over SSH
    lock = lease_dir / "lt-h1.slot0.lock"
    os.chown(lock, pwd.getpwnam("nobody").pw_uid, -1)  # as if another user had leased lt-h1's slot first
    nodes, _ = queue.read_queue(cluster, set_up=True)
    assert [(n.host, n.set_up, n.exposed) for n in nodes] == [
        ("lt-h1", [f"{lock} given to root (was nobody's)"], []), ("lt-h2", [], [])], nodes
    assert lock.stat().st_uid == 0

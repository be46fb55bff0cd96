"""The node side of leases (launcher.node.leases) with real locks held by real processes, and how the submitting
side names holders (launcher.backends.leasing). Several users: tests/integration/test_leases.py."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.backends import leasing
from launcher.node import gpuapps, leases, progress, waiting
from launcher.node.protocol import Frame, FrameKind, LeaseRequest, encode_frame, parse
from launcher.run import queue

ROOT = Path(__file__).resolve().parents[2]
HOLDER = """
import json, sys
from launcher.node import leases
kind, count, capacity, job, directory, mode = sys.argv[1:7]
if mode in ("ticket", "claim"):  # claim: a ticket whose record says it came first (order 0, since 0)
    claimed = {"order": 0.0, "since": 0.0} if mode == "claim" else {}
    with leases.ticket({"job": job, "from": "login-1", **claimed}, int(count), directory):
        print("held", flush=True)
        sys.stdin.read()
else:
    got = leases.acquire(kind, int(count), int(capacity), {"job": job, "from": "login-1"}, directory=directory)
    print(json.dumps(got.devices if isinstance(got, leases.Lease) else None), flush=True)
    sys.stdin.read()
"""


class Holder:
    """A process holding leases (or a ticket) until it is closed or killed."""

    def __init__(self, directory: Path, *args: str, mode: str = "lease") -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, *args, str(directory), mode], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None
        self.said = self.proc.stdout.readline().strip()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    return Path(leases.lease_dir(str(tmp_path / "leases")))


def test_a_job_gets_the_lowest_free_devices_all_or_none(directory: Path) -> None:
    first = Holder(directory, "slot", "1", "3", "job-a")
    assert first.said == "[0]"
    got = leases.acquire("slot", 2, 3, {"job": "job-b"}, directory=str(directory))
    assert isinstance(got, leases.Lease) and got.devices == [1, 2]
    got.release()
    busy = leases.acquire("slot", 3, 3, {"job": "job-b"}, directory=str(directory))
    assert isinstance(busy, leases.Busy)
    assert leases.survey("slot", 3, str(directory)).free(False) == [1, 2], "a refused job kept some of its devices"
    first.close()


def test_the_holder_is_named_from_its_record_and_the_lease_dies_with_its_process(directory: Path) -> None:
    holder = Holder(directory, "slot", "2", "2", "job-a")
    seen = leases.survey("slot", 2, str(directory))
    assert [h.job if h else None for h in seen.holders.values()] == ["job-a", "job-a"]
    assert {h.pid for h in seen.holders.values() if h} == {holder.proc.pid}
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait()
    assert leases.survey("slot", 2, str(directory)).free(False) == [0, 1]  # at once: no stale lease
    stale = list(directory.glob("*.holder.*"))
    assert stale, "the killed holder's record should still be there (and not be believed)"
    got = leases.acquire("slot", 2, 2, {"job": "job-b"}, directory=str(directory))
    assert isinstance(got, leases.Lease)
    assert not any(path.exists() for path in stale), "the next lease of the same user tidies a dead holder's record"
    got.release()


def test_a_record_not_written_by_the_lock_holder_is_not_believed(directory: Path) -> None:
    holder = Holder(directory, "slot", "1", "1", "job-a")
    record = directory / f"{leases.host_name()}.holder.{os.getuid()}.{holder.proc.pid}"
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "job": "forged", "start_ticks": data["start_ticks"] + 1, "step": 5,
                                  "max_steps": 10, "steps_per_s": 1.0, "step_t": time.time()}))
    seen = leases.survey("slot", 1, str(directory)).holders[0]
    assert seen is not None and seen.job is None and seen.pace is None and seen.pid == holder.proc.pid
    assert leasing.who(seen.as_json()) == f"process {holder.proc.pid} (user {seen.user}, no launch record)"
    holder.close()


def test_an_earlier_live_ticket_goes_first_and_a_dead_one_is_ignored(directory: Path) -> None:
    waiting = Holder(directory, "slot", "1", "1", "job-early", mode="ticket")
    assert waiting.said == "held"
    later = leases.acquire("slot", 1, 1, {"job": "job-late"}, directory=str(directory))
    assert isinstance(later, leases.Busy) and [t.job for t in later.ahead] == ["job-early"]
    state = later.as_json(False)
    assert leasing.describe("gpu-02", state, False)[0].startswith("gpu-02: job job-early (user ")
    assert leasing.describe("gpu-02", state, False)[0].endswith(" waits for it first")
    ticketless = leases.acquire("slot", 1, 1, {"job": "job-ticketless"}, directory=str(directory))
    assert isinstance(ticketless, leases.Busy), "a job without a ticket went before a waiting one"
    own = leases.acquire("slot", 1, 1, {"job": "job-early"}, waited=True, directory=str(directory))
    assert isinstance(own, leases.Lease), "the waiting job's own agent, its turn found, was sent back"
    own.release()
    waiting.proc.send_signal(signal.SIGKILL)
    waiting.proc.wait()
    got = leases.acquire("slot", 1, 1, {"job": "job-late"}, directory=str(directory))
    assert isinstance(got, leases.Lease), "a dead waiter's ticket held the queue"
    got.release()


def test_the_lease_directory_must_be_safe(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(leases.LeaseError, match="without the sticky bit"):
        leases.lease_dir(str(open_dir))
    (tmp_path / "link").symlink_to(open_dir)
    with pytest.raises(leases.LeaseError, match="not a directory"):
        leases.lease_dir(str(tmp_path / "link"))
    made = leases.lease_dir(str(tmp_path / "new"))
    assert os.stat(made).st_mode & 0o7777 == 0o1777


def test_holders_are_named_as_users_read_them() -> None:
    since = time.mktime(time.strptime(time.strftime("%Y-%m-%d 10:02"), "%Y-%m-%d %H:%M"))
    held = {"pid": 7, "user": "ml-a", "job": "bert-large-zero3-1a2b3c4d", "from": "login-1", "since": since}
    state = {"kind": "gpu", "devices": [{"index": i, "holder": held, "foreign": []} for i in range(8)], "ahead": []}
    assert leasing.describe("gpu-02", state, False) == [
        "gpu-02 GPUs 0-7: job bert-large-zero3-1a2b3c4d (user ml-a, from login-1, since 10:02)"]
    state["devices"][3]["holder"] = None
    state["devices"][3]["holder"] = {**held, "job": "evil\x1b]0;x\x07job"}
    assert "gpu-02 GPU 3: job evil?]0;x?job" in leasing.describe("gpu-02", state, False)[1]


SMI_GPUS = "0, GPU-aaaa\n1, GPU-bbbb\n2, GPU-cccc\n"
SMI_APPS = "4194999, GPU-bbbb, python train.py --lr 3e-4\n4194998, GPU-zzzz, not ours\n"


def test_gpus_with_foreign_processes_are_busy_unless_shared(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    apps = gpuapps.parse_compute_apps(SMI_GPUS, SMI_APPS)
    assert apps == {1: [(4194999, "python train.py --lr 3e-4")]}
    monkeypatch.setattr(gpuapps, "compute_apps", lambda: apps)
    got = leases.acquire("gpu", 2, 3, {"job": "job-a"}, directory=str(directory))
    assert isinstance(got, leases.Lease) and got.devices == [0, 2]
    got.release()
    busy = leases.acquire("gpu", 3, 3, {"job": "job-a"}, directory=str(directory))
    assert isinstance(busy, leases.Busy)
    lines = leasing.describe("gpu-01", busy.as_json(False), False)
    assert lines == ["gpu-01 GPU 1: process 4194999 (user ?: python train.py --lr 3e-4), not started by launch "
                     "(resources.allow_shared_gpus: true shares it)"]
    shared = leases.acquire("gpu", 3, 3, {"job": "job-a"}, allow_shared=True, directory=str(directory))
    assert isinstance(shared, leases.Lease) and shared.devices == [0, 1, 2]
    shared.release()


def test_devices_read_as_ranges_and_each_holder_gets_its_line() -> None:
    assert leasing.devices_text("gpu", [7, 0, 1, 2, 5, 8]) == "GPUs 0-2,5,7-8"
    assert leasing.devices_text("slot", [1]) == "slot 1"
    one = {"pid": 7, "user": "ml-a", "job": "job-a", "from": "login-1", "since": None}
    two = {"pid": 8, "user": "ml-b", "job": "job-b", "from": "login-2", "since": None}
    state = {"kind": "slot", "devices": [{"index": 0, "holder": one}, {"index": 1, "holder": two},
                                         {"index": 2, "holder": one}, {"index": 3, "holder": None}]}
    assert leasing.describe("cpu-1", state, False) == [
        "cpu-1 slots 0,2: job job-a (user ml-a, from login-1, since ?)",
        "cpu-1 slot 1: job job-b (user ml-b, from login-2, since ?)"]


def test_deepspeeds_launcher_is_given_the_leased_gpus_of_its_node() -> None:
    """DeepSpeed's launcher sets CUDA_VISIBLE_DEVICES from its --world_info entry: node 1's must be its leased GPUs."""
    import base64

    from launcher.node.rankstreams import on_devices
    from launcher.plan.commands import deepspeed_argv

    argv = deepspeed_argv("python", [4, 4], 1, "10.0.0.1", 29500, (False, ["train.py"]))
    given = on_devices(argv, [4, 5, 6, 7])
    world = json.loads(base64.urlsafe_b64decode(next(a for a in given if a.startswith("--world_info="))[13:]))
    assert world == {"node0": [0, 1, 2, 3], "node1": [4, 5, 6, 7]}
    assert [a for a in given if not a.startswith("--world_info=")] == [a for a in argv if not a.startswith("--world_info=")]
    torchrun = ["python", "-m", "torch.distributed.run", "--nproc-per-node", "4", "train.py"]
    assert on_devices(torchrun, [4, 5, 6, 7]) == torchrun


def test_a_tickets_place_is_when_it_arrived_on_the_node_and_one_that_does_not_lease_in_its_turn_loses_it(
        directory: Path) -> None:
    """Issue 39, Low: a ticket's place was the order its client claimed, so one ticket claiming 0 and never leasing
    blocked a free host for every user. Its place is now when it arrived on the node (the ticket file's change time),
    and a ticket whose turn came (first, its devices free) that takes no lease for PLACE_LOST_S loses its place."""
    first = Holder(directory, "slot", "1", "1", "job-a", mode="ticket")
    claimer = Holder(directory, "slot", "1", "1", "job-b", mode="claim")
    assert first.said == claimer.said == "held"
    try:
        queue = leases.tickets(str(directory))
        assert [t.job for t in queue] == ["job-a", "job-b"], "a ticket's claimed order put it first"
        a_since, b_since = queue[0].since, queue[1].since
        assert leases.ahead(queue, "job-c", None) == queue  # a job without a ticket: behind them all
        request = LeaseRequest(kind="slot", count=1, capacity=1, job="job-a", dir=str(directory))
        assert waiting.state(request, a_since, waiting.Places())["ready"], "the claim held up the first ticket"
        now = [0.0]
        places = waiting.Places(clock=lambda: now[0])  # job-b's waiter's memory, on a clock the test moves
        assert [t.job for t in places.ahead(queue, "job-b", b_since, free=0)] == ["job-a"] and not places.pending()
        assert [t.job for t in places.ahead(queue, "job-b", b_since, free=1)] == ["job-a"] and places.pending()
        now[0] = waiting.PLACE_LOST_S - 1
        assert [t.job for t in places.ahead(queue, "job-b", b_since, free=1)] == ["job-a"]
        now[0] = waiting.PLACE_LOST_S
        assert places.ahead(queue, "job-b", b_since, free=1) == [], "a ticket that did not lease in its turn kept it"
        request = LeaseRequest(kind="slot", count=1, capacity=1, job="job-b", dir=str(directory))
        assert waiting.state(request, b_since, places)["ready"]
    finally:
        first.close()
        claimer.close()


def test_something_another_user_planted_at_a_lock_path_is_named_not_shown_free(tmp_path: Path) -> None:
    """Issue 39, item 5 (part): a directory, symlink or FIFO planted at a lock path blocked that device for everyone
    ("Permission denied" at start) while `launch queue` and preflight said "free"."""
    directory = tmp_path / "leases"
    directory.mkdir(mode=0o1777)
    os.chmod(directory, 0o1777)
    host = leases.host_name()
    (directory / f"{host}.slot0.lock").mkdir()
    os.mkfifo(directory / f"{host}.slot1.lock")
    (directory / f"{host}.slot2.lock").symlink_to(tmp_path / "elsewhere")
    for index, what in ((0, "a directory"), (1, "a FIFO"), (2, "a symlink")):
        path = directory / f"{host}.slot{index}.lock"
        if os.geteuid() == 0:
            os.chown(path, 12345, 12345, follow_symlinks=False)
        with pytest.raises(leases.LeaseError, match=f"{path} is {what}, owned by .*: that device cannot be leased"):
            leases.survey("slot", index + 1, str(directory))
        path.unlink() if index else path.rmdir()
    assert leases.survey("slot", 3, str(directory)).holders == {0: None, 1: None, 2: None}


def _as_other_user(*argv: str) -> subprocess.Popen:
    """``argv`` run as ``nobody`` (a second Unix user): what a co-tenant can do with the files it owns."""
    other = pwd.getpwnam("nobody")
    return subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/",
                            user=other.pw_uid, group=other.pw_gid, extra_groups=[], env={"PATH": "/usr/bin:/bin"})


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A lease directory as launch makes one on a node without the set-up (root's, 1777), where a second user
    (``nobody``) can go: under /tmp, not pytest's private tmp_path."""
    if os.geteuid() != 0:
        pytest.skip("acting as a second Unix user needs root")
    path = Path(tempfile.mkdtemp(prefix="lt-leases-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_lock_file_its_owner_removes_under_a_held_lease_is_named_said_and_leased_again(shared_dir: Path) -> None:
    """Issue 39, item 5: the owner of a lock file (whoever leased the device first) could unlink it while another
    user's job held it, double-book the device, and `launch queue` said "free"."""
    nobody = pwd.getpwnam("nobody").pw_uid
    lock = shared_dir / f"{leases.host_name()}.slot0.lock"
    lock.touch(0o644)
    os.chown(lock, nobody, nobody)  # nobody leased slot 0 first: the lock file is theirs, and kept
    lease = leases.acquire("slot", 1, 1, {"job": "job-a"}, directory=str(shared_dir))
    assert isinstance(lease, leases.Lease) and lease.devices == [0]
    assert lease.exposed == ["the lock file(s) of slot(s) 0 belong to nobody, who can remove them"]
    seen_by_queue = queue.NodeQueue(0, "gpu-01", "slot", exposed=leases.survey("slot", 1, str(shared_dir)).exposed)
    assert queue.queue_lines([seen_by_queue], [])[0] == (
        "gpu-01: warning: the lock file(s) of slot(s) 0 belong to nobody, who can remove them, and so let a second job "
        "lease a device that is held; root runs `launch queue --set-up` once (docs/LEASES.md)")
    assert _as_other_user("rm", "-f", str(lock)).wait(30) == 0  # the sticky bit lets a file's owner unlink it
    seen = leases.survey("slot", 1, str(shared_dir)).holders[0]
    assert seen is not None, "a device whose holder's lock file was removed was shown free"
    assert seen.job == "job-a" and seen.lock_removed and seen.pid == os.getpid()
    assert leasing.who(seen.as_json()).endswith("though its lock file was removed (docs/LEASES.md: shared nodes)")
    # the co-tenant leases the device too before the holder looks: two jobs share it, and the holder says so
    other = _as_other_user("flock", "-n", str(lock), "-c", "echo held; exec sleep 600")
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        moved = lease.verify()
        assert len(moved) == 1 and not moved[0].leased_again and moved[0].holder is not None
        assert (moved[0].what, moved[0].owners, moved[0].holder.user) == ("replaced", ["nobody"], "nobody")
        frame = parse(encode_frame(FrameKind.LEASE, moved[0].as_json()))
        assert isinstance(frame, Frame)
        assert leasing.lock_file_removed(1, frame).startswith(
            f"launch: node 1: the lock file of slot 0 ({lock}) was replaced while this job held it (only nobody or root "
            f"could): slot 0 is now leased by process {moved[0].holder.pid} (user nobody, no launch record) as well: two "
            "jobs share it")
        assert lease.verify() == [], "said once"
    finally:
        other.kill()
        other.wait(30)
    # once the path is free again the holder leases it again, in a lock file of its own that the co-tenant cannot remove
    assert _as_other_user("rm", "-f", str(lock)).wait(30) == 0
    moved = lease.verify()
    assert [(m.what, m.leased_again) for m in moved] == [("removed", True)]
    again = leases.survey("slot", 1, str(shared_dir)).holders[0]
    assert again is not None and again.pid == os.getpid() and not again.lock_removed, "not leased again"
    assert lock.stat().st_uid == os.getuid() and lease.verify() == []
    lease.release()


def test_root_sets_up_lock_files_no_other_user_can_remove_or_plant(shared_dir: Path) -> None:
    """Issue 39, item 5: `launch queue --set-up` (root, once on a shared node) makes the directory and every lock
    file root's; a lock file a job holds keeps its inode (its lease holds), a FIFO planted at a lock path goes."""
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(shared_dir, nobody, nobody)  # a co-tenant made the lease directory
    host = leases.host_name()
    held = shared_dir / f"{host}.slot0.lock"
    held.touch(0o644)
    os.chown(held, nobody, nobody)
    lease = leases.acquire("slot", 1, 3, {"job": "job-a"}, directory=str(shared_dir))
    assert isinstance(lease, leases.Lease) and lease.devices == [0]
    assert lease.exposed[0] == (f"the lease directory {shared_dir} belongs to nobody, who can remove any lock file "
                                "in it")
    os.mkfifo(shared_dir / f"{host}.slot1.lock")
    os.chown(shared_dir / f"{host}.slot1.lock", nobody, nobody)
    inode = held.stat().st_ino
    done = leases.set_up("slot", 3, str(shared_dir))
    assert done == [f"{shared_dir} given to root (was nobody's)", f"{held} given to root (was nobody's)",
                    f"removed {shared_dir}/{host}.slot1.lock (nobody's, not a lock file)",
                    f"made {shared_dir}/{host}.slot1.lock", f"made {shared_dir}/{host}.slot2.lock"]
    assert leases.set_up("slot", 3, str(shared_dir)) == []
    info = shared_dir.stat()
    assert (info.st_uid, info.st_mode & 0o7777) == (0, 0o1777)
    for index in range(3):
        lock = shared_dir / f"{host}.slot{index}.lock"
        assert (lock.stat().st_uid, lock.stat().st_mode & 0o777) == (0, 0o644)
        remove = _as_other_user("rm", "-f", str(lock))
        assert remove.wait(30) != 0 and "Operation not permitted" in (remove.stdout.read() if remove.stdout else "")
    assert held.stat().st_ino == inode and lease.verify() == []
    assert leases.survey("slot", 3, str(shared_dir)).holders[0] is not None, "the set-up broke a held lease"
    lease.release()
    second = leases.acquire("slot", 3, 3, {"job": "job-b"}, directory=str(shared_dir))
    assert isinstance(second, leases.Lease) and second.exposed == [] and leases.survey("slot", 3, str(shared_dir)).exposed == []
    second.release()
    shown = subprocess.run([sys.executable, "-m", "launcher", "queue", "--set-up"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "LAUNCH_LEASE_DIR": str(shared_dir)}, timeout=120)
    assert shown.returncode == 0 and ": set up: nothing to change: the lease directory and its lock files are root's\n" \
        in shown.stdout and "warning" not in shown.stdout, shown.stdout + shown.stderr


def test_the_holders_pace_comes_from_the_step_records_its_agent_relays_and_only_whole_records_on_a_ranks_stream(
        directory: Path) -> None:
    """Rank output is untrusted: what counts is a whole record with an integer step on a rank's stream; the holder
    record keeps the newest step, max_steps and the rate, and every user's survey reads an ETA from it."""
    watch = progress.StepWatch(max_steps=1000)
    record = b'[0]: @@launch {"v":1,"rank":0,"step":%d}'
    watch.feed([record % 10, b"@@launch " + b'{"v":1,"step":999}', b'[1]: @@launch {"v":1,"rank":0,"step":999}',
                b'[0]: @@launch {"v":1,"step":true}', b'[0]: @@launch {"v":1,"step":1e30}', b"[0]: step 500 of 1000",
                b'[0]: x @@launch {"v":1,"step":999}',
                b'[0]: @@launch {"v":1,"step":900,"pad":"' + b"x" * progress.MAX_RECORD + b'"}'])
    first = watch.fields()
    assert first is not None and first["step"] == 10 and first["steps_per_s"] is None  # one record: no rate yet
    assert watch.fields() is None, "nothing moved: nothing to rewrite"
    time.sleep(0.2)  # the rate is the steps between two records over the node time between them: time must pass
    watch.feed([record % 30])
    fields = watch.fields()
    assert fields is not None and fields["step"] == 30 and fields["max_steps"] == 1000 and fields["steps_per_s"] > 0

    lease = leases.acquire("slot", 1, 1, {"job": "job-a", "from": "login-1", "max_steps": 1000},
                           directory=str(directory))
    assert isinstance(lease, leases.Lease)
    try:
        lease.note_progress(fields)
        assert lease.record_path is not None and os.path.getsize(lease.record_path) < 512
        holder = leases.survey("slot", 1, str(directory)).holders[0]
        assert holder is not None and holder.pace is not None and holder.pace.step == 30
        assert holder.pace.max_steps == 1000 and holder.pace.eta_s is not None and holder.pace.eta_s > 0
        said = leasing.who(holder.as_json())
        assert re.fullmatch(r"job job-a \(user \S+, from login-1, since \d\d:\d\d; step 30/1000, ETA \d\d:\d\d\)", said)
        found = leasing.paces({"devices": [{"index": 0, "holder": holder.as_json()}]}, time.time())
        assert found["job-a"].text().startswith(f"job job-a of {holder.user}: step 30/1000, ETA ")
    finally:
        lease.release()
    assert not list(directory.glob("*.holder.*")), "the record goes with the lease"
    lease.note_progress(fields)  # the watcher's last write after the release: no record comes back
    assert not list(directory.glob("*.holder.*"))


def test_the_agent_writes_the_pace_as_soon_as_two_steps_give_a_rate_not_a_whole_interval_later() -> None:
    """A teammate refused right after a job started already sees its ETA: the first write comes once a rate is known,
    well before WRITE_EVERY_S; the next ones at most every WRITE_EVERY_S."""
    watch, written, stop = progress.StepWatch(max_steps=50), [], threading.Event()
    wrote = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop, lambda fields: (written.append(fields), wrote.set())))
    started = time.monotonic()
    thread.start()
    try:
        watch.feed([b'[0]: @@launch {"v":1,"step":1}'])
        assert not wrote.wait(progress.LOOK_S * 3), "one step gives no rate: nothing written yet"
        watch.feed([b'[0]: @@launch {"v":1,"step":2}'])
        assert wrote.wait(progress.WRITE_EVERY_S) and time.monotonic() - started < progress.WRITE_EVERY_S, written
        assert written[0]["step"] == 2 and written[0]["steps_per_s"] > 0
    finally:
        stop.set()
        thread.join(5)

"""The node agent's journal (docs/JOURNALS.md), with real processes: the agent run through bash as sshd would run
it, its stdout broken mid-run, the job unattended, the journal full, the agent killed, and ``follow`` reading it all
back. No sleep synchronises anything: the tests wait on a process, a file or a line, each with a deadline."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from launcher.node import proctree, rundir
from launcher.node.protocol import FrameKind, encode_output
from launcher.node.ship import node_argv, stdin_argv
from launcher.plan.shell import render_command
from tests.helpers import frame_data, frames, kind_of_line, output_texts

JOB_PREFIX = f"journal-{os.getpid()}-"
NODE = 1


@pytest.fixture(autouse=True, scope="module")
def _remove_run_dirs():
    yield
    for path in Path(rundir.run_root()).glob(JOB_PREFIX + "*"):
        shutil.rmtree(path)


def _eventually(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _start(argv: list[str], env_extra: dict[str, str] | None = None, ranked: bool = False, job_id: str | None = None,
           **extra) -> tuple[str, subprocess.Popen]:
    """The agent of node NODE of a new job (``job_id``, else a new one), started as backends start it (request and
    secrets on stdin); its stdout a pipe the test reads (bytes). ``env_extra``: the agent's environment beside
    LAUNCH_JOB_ID (its run root); ``ranked``: the command is rank 0 (RANK=0), which the agent samples."""
    job_id = job_id or JOB_PREFIX + uuid.uuid4().hex[:8]
    env = {"LAUNCH_JOB_ID": job_id, **({"RANK": "0"} if ranked else {})}
    request = {"job_id": job_id, "node": NODE, "argv": argv, "env": env, "cwd": "/",
               "secrets_on_stdin": True, "grace": 1.0, "sample_s": 0.3, **extra}
    command = render_command(stdin_argv(sys.executable, "agent"), {"LAUNCH_JOB_ID": job_id, **(env_extra or {})}, "/")
    proc = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(request).encode() + b"\n{}\n")
    proc.stdin.close()
    return job_id, proc


def _run_dir(job_id: str) -> Path:
    return Path(rundir.run_root()) / job_id


def _journal(job_id: str) -> list[bytes]:
    return (_run_dir(job_id) / f"node{NODE}.journal").read_bytes().split(b"\n")[:-1]


def _follow(job_id: str, after: int, node: int = NODE, timeout: float = 60) -> tuple[int, list[bytes]]:
    done = subprocess.run(node_argv(sys.executable, "follow", {"job_id": job_id, "node": node, "after": after}),
                          capture_output=True, timeout=timeout)
    return done.returncode, done.stdout.split(b"\n")[:-1]


def _read_until(proc: subprocess.Popen, wanted: str) -> list[bytes]:
    """Lines from the agent's stdout, up to and including the output line ``wanted``."""
    assert proc.stdout is not None
    lines: list[bytes] = []
    while not lines or output_texts(lines[-1:]) != [wanted]:
        line = proc.stdout.readline()
        assert line, f"stdout ended before {wanted!r}: {lines}"
        lines.append(line.rstrip(b"\n"))
    return lines


GATED = """\
import os, sys, time
for i in range(1, 6):
    print(f"line {i}", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]):
    if time.monotonic() > deadline:
        sys.exit("never released")
    time.sleep(0.02)
for i in range(6, 2001):
    print(f"line {i}", flush=True)
"""


def test_a_job_outlives_its_broken_stdout_and_follow_resumes_where_the_reader_stopped(tmp_path: Path) -> None:
    go = tmp_path / "go"
    job_id, proc = _start([sys.executable, "-c", GATED, str(go)])
    seen = _read_until(proc, "line 5")
    assert proc.stdout is not None
    proc.stdout.close()  # the supervisor is gone mid-run
    go.touch()
    assert proc.wait(60) == 0, "the job ran to its end without a reader"
    journal = _journal(job_id)
    assert journal[:len(seen)] == seen, "stdout delivered the journal's first lines, in order"
    assert frame_data(journal[-1]) == {"code": 0} and kind_of_line(journal[-1]) == "exit"
    assert output_texts(journal) == [f"line {i}" for i in range(1, 2001)]
    for after in (len(seen), len(seen) - 2, 0):
        code, lines = _follow(job_id, after)
        assert code == 0 and lines == journal[after:], f"after={after}: exactly lines {after + 1}.. to @exit"
    assert _follow(job_id, len(journal)) == (0, []), "a reader that has @exit gets nothing more"


def test_an_unattended_job_is_ended_by_its_agent_and_the_journal_says_so() -> None:
    job_id, proc = _start([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                          unattended_s=2)
    _read_until(proc, "up")
    assert proc.stdout is not None
    proc.stdout.close()  # nobody reads, nobody follows
    assert proc.wait(60) == 128 + signal.SIGTERM
    assert _eventually(lambda: proctree.job_pids(job_id) == []), "the ranks are gone"
    journal = _journal(job_id)
    assert kind_of_line(journal[-2]) == "unattended" and frame_data(journal[-2])["after_s"] >= 2
    assert frames(journal[-1:], "exit") == [{"code": -15}]


def test_a_follower_keeps_an_unattended_job_in_contact() -> None:
    """The agent's stdout is gone; ``follow`` touching the contact file is the only contact, for longer than
    ``unattended_s``: the job runs to its end, and the follower prints it to its ``@exit``."""
    job_id, proc = _start([sys.executable, "-c", "import time; time.sleep(6); print('done', flush=True)"],
                          unattended_s=2)
    assert proc.stdout is not None and kind_of_line(proc.stdout.readline()) == "started"
    follower = subprocess.Popen(node_argv(sys.executable, "follow", {"job_id": job_id, "node": NODE, "after": 1}),
                                stdout=subprocess.PIPE)
    proc.stdout.close()
    out, _ = follower.communicate(timeout=60)
    assert proc.wait(60) == 0
    journal = _journal(job_id)
    assert not frames(journal, "unattended")
    assert follower.returncode == 0 and out.split(b"\n")[:-1] == journal[1:]
    assert "done" in output_texts(journal) and frames(journal[-1:], "exit") == [{"code": 0}]


def test_past_its_bound_the_journal_keeps_no_more_output_but_the_reader_still_gets_every_line() -> None:
    """Issue 39, item 1: a full journal once blinded the supervisor (output and samples no longer sent either)."""
    program = "import sys, time\nfor i in range(1000):\n    print(f'output line {i:04d} ' + 'x' * 30)\ntime.sleep(1)\nsys.exit(3)"
    job_id, proc = _start([sys.executable, "-c", program], journal_limit=2000, ranked=True)
    assert proc.stdout is not None
    sent = proc.stdout.read().split(b"\n")[:-1]
    assert proc.wait(60) == 3
    journal = _journal(job_id)
    assert [line for line in sent if not line.startswith(b"~")] == journal, "the lines sent plain are the journal's"
    assert output_texts(sent) == [f"output line {i:04d} " + "x" * 30 for i in range(1000)], "every line is sent"
    assert frames([line for line in sent if line.startswith(b"~")], "sample"), "samples go on past the bound"
    assert frames(journal, "journal") == [{"state": "full", "limit": 2000}]
    at = next(k for k, line in enumerate(journal) if kind_of_line(line) == "journal")
    assert len(journal) == at + 2 and frames(journal[-1:], "exit") == [{"code": 3}], \
        "no output nor sample journaled after the frame that says the journal is full"
    kept = output_texts(journal[:at])
    assert kept == [f"output line {i:04d} " + "x" * 30 for i in range(len(kept))] and 10 < len(kept) < 40
    assert len(b"\n".join(journal[:at])) <= 2000
    code, followed = _follow(job_id, 0)
    assert code == 0 and followed == journal, "follow reads back the journal, which holds no live line"


def test_a_journal_on_a_full_disk_is_one_frame_and_the_reader_still_gets_every_line(tmp_path: Path) -> None:
    """Issue 39, item 2: the run root on a 1 MiB tmpfs that the job fills; lines after ENOSPC were lost."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(runtime)], check=True)
    try:
        program = ("import sys, time\nfor i in range(40):\n    print(f'before {i}', flush=True)\n"
                   "try:\n    with open(sys.argv[1], 'wb') as f:\n        while True:\n            f.write(b'x' * 65536)\n"
                   "except OSError as exc:\n    print('filled:', exc.strerror, flush=True)\n"
                   "for i in range(40):\n    print(f'after {i} ' + 'y' * 200, flush=True)\ntime.sleep(1.5)\n")
        job_id, proc = _start([sys.executable, "-c", program, str(runtime / "filler")],
                              env_extra={"XDG_RUNTIME_DIR": str(runtime)}, ranked=True)
        assert proc.stdout is not None
        sent = proc.stdout.read().split(b"\n")[:-1]
        assert proc.wait(60) == 0
        texts = output_texts(sent)
        assert [t for t in texts if t.startswith(("before", "after"))] == \
            [f"before {i}" for i in range(40)] + [f"after {i} " + "y" * 200 for i in range(40)]
        assert "filled: No space left on device" in texts
        stopped = frames(sent, "journal")
        assert len(stopped) == 1 and stopped[0]["state"] == "unwritable" and "No space left" in stopped[0]["error"]
        live = [line for line in sent if line.startswith(b"~")]
        assert frames(live, "sample") and frames(live, "exit") == [{"code": 0}], "samples and the exit are sent live"
        journal = (runtime / "launch" / job_id / f"node{NODE}.journal").read_bytes()
        plain = [line for line in sent if not line.startswith(b"~")]
        assert journal.startswith(b"\n".join(plain) + b"\n"), "the lines sent plain are the journal's whole lines"
    finally:
        subprocess.run(["umount", "-l", str(runtime)], check=False)


def test_follow_says_lost_when_the_agent_died_without_its_exit_and_when_there_is_no_journal() -> None:
    job_id, proc = _start([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"])
    lines = _read_until(proc, "up")
    started = frame_data(lines[0])
    os.kill(started["pid"], signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    code, followed = _follow(job_id, 1)
    assert code == 0 and followed[:-1] == _journal(job_id)[1:] and kind_of_line(followed[-1]) == "lost"
    assert "gone" in frame_data(followed[-1])["reason"]
    assert _eventually(lambda: proctree.job_pids(job_id) == []), "the rank died with its agent (PDEATHSIG)"
    code, followed = _follow(job_id, 0, node=7)
    assert code == 0 and len(followed) == 1 and b"no journal for node 7" in followed[0]
    code, followed = _follow(JOB_PREFIX + "none", 0)
    assert code == 0 and len(followed) == 1 and b"no run directory" in followed[0]


def test_a_job_under_the_old_run_root_is_still_followed_and_cleaned() -> None:
    """Issue 39, item 6: the run root was /tmp/launch-UID, which another user could make first; new jobs go in a
    root found by its owner, and a job whose run directory is in the old one (started by the launch before) is
    still followed by a new reader and cleaned."""
    legacy = Path(rundir.TMP_DIR) / f"launch-{os.getuid()}"
    if legacy.exists() and legacy.lstat().st_uid != os.getuid():
        pytest.skip(f"{legacy} is another user's here")
    job_id = JOB_PREFIX + "old-" + uuid.uuid4().hex[:8]
    old = rundir.job_run_dir(job_id, str(legacy))  # where the launch before made it
    assert Path(rundir.run_root()) != legacy
    job_id, proc = _start([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"], job_id=job_id)
    started = frame_data(_read_until(proc, "up")[0])
    assert started["run_dir"] == old, "the agent of a job whose run directory is there goes on there"
    assert proc.stdout is not None
    proc.stdout.close()  # its supervisor is gone: a new one follows
    follower = subprocess.Popen(node_argv(sys.executable, "follow", {"job_id": job_id, "node": NODE, "after": 1}),
                                stdout=subprocess.PIPE)
    assert follower.stdout is not None
    assert output_texts([follower.stdout.readline().rstrip(b"\n")]) == ["up"]
    os.kill(started["pid"], signal.SIGTERM)
    rest, _ = follower.communicate(timeout=30)
    assert kind_of_line(rest.split(b"\n")[-2]) == "exit" and proc.wait(30) == 128 + signal.SIGTERM
    cleaned = subprocess.run(node_argv(sys.executable, "clean", {"job_id": job_id}), capture_output=True, timeout=60)
    assert json.loads(cleaned.stdout) == {"removed": [job_id], "kept": {}} and not Path(old).exists()


def test_a_followers_lost_reader_ends_the_follower_not_the_job() -> None:
    job_id, proc = _start([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"])
    started = frame_data(_read_until(proc, "up")[0])
    follower = subprocess.Popen(node_argv(sys.executable, "follow", {"job_id": job_id, "node": NODE, "after": 0}),
                                stdout=subprocess.PIPE)
    assert follower.stdout is not None
    assert kind_of_line(follower.stdout.readline()) == "started"
    follower.stdout.close()
    assert follower.wait(30) == 0, "the follower stops quietly once nobody reads it"
    assert proc.poll() is None and proctree.job_pids(job_id), "the job runs on"
    os.kill(started["pid"], signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM


def test_a_stalled_reader_never_blocks_the_writer_and_is_given_up_past_the_lag_bound(tmp_path: Path) -> None:
    """A reader that neither reads nor closes (a sleeping laptop's SSH channel): the relay's writes go on at once,
    into the journal; once stdout is ``behind_limit`` bytes behind it is given up and stops counting as contact."""
    from launcher.node.journal import Journal, Output

    read_end, write_end = os.pipe()
    try:
        out = Output(write_end, behind_limit=1_000_000)
        out.attach(Journal(str(tmp_path), 0))
        line = encode_output(b"y" * 75)
        deadline = time.monotonic() + 30
        for _ in range(200):  # 2 MB: thirty times what the pipe holds
            out.write_lines([line] * 100)
            assert time.monotonic() < deadline, "a write waited for the reader"
        assert out.broken.is_set() and "behind" in out.why_broken
        assert out.contact_age() == float("inf")
        out.event(FrameKind.EXIT, {"code": 0})
        out.close(stall_s=1.0)
        journal = (tmp_path / "node0.journal").read_bytes().split(b"\n")[:-1]
        assert journal[:-1] == [line] * 20000 and frames(journal[-1:], "exit") == [{"code": 0}]
        os.set_blocking(read_end, False)
        try:
            sent = os.read(read_end, 1 << 20)
        except BlockingIOError:
            sent = b""  # the sender had not written yet when stdout was given up
        assert sent == ((line + b"\n") * 20000)[:len(sent)], "stdout had the journal's first bytes (a pipe's worth)"
    finally:
        os.close(read_end)
        os.close(write_end)

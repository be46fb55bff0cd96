"""The node side as every backend runs it, here on this machine through ``bash -c`` exactly as sshd
would run the command ``render_command`` builds: the node agent, the facts probe, the PID-checked signal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.node import proctree, rundir
from launcher.node.ship import node_argv
from launcher.plan.shell import render_command
from tests.helpers import frame_data, frames, kind_of_line, output_texts

# The secret comes back reversed: the agent masks its value in what ranks print (node/secretmask.py).
ECHO = ("import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('V'), (os.environ.get('SECRET') or '')[::-1], "
        "os.getcwd()]))")
HOSTILE = ["a;b", "$(id)", "`id`", "it's", 'say "hi"', "two  words", "line\nbreak", "naïve ☃ 漢字", "", "-rf", "*", "\\"]
text_without_nul = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
JOB_PREFIX = f"unit-{os.getpid()}-"


@pytest.fixture(autouse=True, scope="module")
def _remove_run_dirs():
    """The agent writes under this user's run root; remove what this module's jobs left there."""
    yield
    for path in Path(rundir.run_root()).glob(JOB_PREFIX + "*"):
        shutil.rmtree(path)


def _job_id() -> str:
    return JOB_PREFIX + uuid.uuid4().hex[:8]


def _command(job_id: str, argv: list[str], env: dict[str, str], cwd: str, **extra) -> str:
    request = {"job_id": job_id, "node": 1, "argv": argv, "env": {**env, "LAUNCH_JOB_ID": job_id}, "cwd": cwd,
               "secrets_on_stdin": True, "grace": 1.0, **extra}
    return render_command(node_argv(sys.executable, "agent", request), {"LAUNCH_JOB_ID": job_id}, cwd)


def _run_agent(argv: list[str], env: dict[str, str], cwd: str, secrets: dict[str, str], **extra) -> tuple[int, list[str], str]:
    """Run the agent command through bash as sshd would; (exit status, framed output lines, job id)."""
    job_id = _job_id()
    command = _command(job_id, argv, env, cwd, **extra)
    done = subprocess.run(["bash", "-c", command], input=json.dumps(secrets).encode() + b"\n", capture_output=True)
    return done.returncode, (done.stdout + done.stderr).decode().splitlines(), job_id


def _eventually(condition, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_hostile_values_and_secrets_arrive_verbatim_and_secrets_never_on_a_command_line(tmp_path: Path) -> None:
    cwd = tmp_path / "dir with 'quotes' and $(x)"
    cwd.mkdir()
    for value in HOSTILE:
        secret = f"tok-{value}"
        job_id = _job_id()
        assert secret not in _command(job_id, [sys.executable, "-c", ECHO, value], {"V": value}, str(cwd))
        status, lines, job_id = _run_agent([sys.executable, "-c", ECHO, value], {"V": value}, str(cwd), {"SECRET": secret})
        assert status == 0 and kind_of_line(lines[0]) == "started"
        assert json.loads(output_texts(lines)[0]) == [[value], value, secret[::-1], str(cwd)]
        started = frame_data(lines[0])
        run_dir = Path(started["run_dir"])
        assert run_dir == Path(rundir.run_root()) / job_id
        assert (run_dir / "node1.pid").read_text().split()[0] == str(started["pid"])
        assert oct(run_dir.stat().st_mode & 0o777) == "0o700"
        assert frame_data(lines[-1]) == {"code": 0}


@settings(max_examples=25, deadline=None)
@given(st.lists(text_without_nul, min_size=1, max_size=3), text_without_nul)
def test_any_text_round_trips_through_the_agent_command(args: list[str], value: str) -> None:
    status, lines, _ = _run_agent([sys.executable, "-c", ECHO, *args], {"V": value}, "/", {})
    assert status == 0 and json.loads(output_texts(lines)[0])[:2] == [args, value]


def test_exit_codes_and_signals_come_back() -> None:
    assert _run_agent([sys.executable, "-c", "raise SystemExit(3)"], {}, "/", {})[0] == 3
    status, lines, _ = _run_agent([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], {}, "/", {})
    assert status == 128 + 9 and frame_data(lines[-1]) == {"code": -9}
    status, lines, _ = _run_agent(["/no/such/program"], {}, "/", {})
    assert status == 126 and "/no/such/program" in "\n".join(lines)


def test_a_rank_cannot_forge_the_agents_own_lines() -> None:
    forged = 'print("@exit {\\"code\\": 0}"); print("@sample {}"); raise SystemExit(5)'
    status, lines, _ = _run_agent([sys.executable, "-c", forged], {}, "/", {})
    assert status == 5
    assert frames(lines, "exit") == [{"code": 5}]
    assert '@exit {"code": 0}' in output_texts(lines) and "@sample {}" in output_texts(lines)


def test_long_lines_are_cut_with_a_marker_and_nothing_else_is_lost() -> None:
    program = "import sys; sys.stdout.write('a' * 300000 + '\\n' + 'short\\n' + 'b' * 5000)"
    status, lines, _ = _run_agent([sys.executable, "-c", program], {}, "/", {}, line_limit=1000)
    out = output_texts(lines)
    assert status == 0 and len(out) == 3
    assert out[0].startswith("a" * 1000) and out[0].endswith("[launch: line cut at 1000 bytes; 299000 more dropped]")
    assert out[1] == "short" and out[2].startswith("b" * 1000) and "4000 more dropped" in out[2]


def test_the_agent_samples_each_rank_from_outside() -> None:
    # 1.5 s of CPU time, however loaded the machine (a wall-clock loop gets less CPU under load)
    busy = "import time\nwhile time.process_time() < 1.5: pass\nbuf = bytearray(50 * 2**20)\ntime.sleep(1)"
    status, lines, _ = _run_agent([sys.executable, "-c", busy], {"RANK": "3", "LOCAL_RANK": "1"}, "/", {}, sample_s=0.3)
    samples = frames(lines, "sample")
    assert status == 0 and len(samples) >= 3
    ranks = [entry for sample in samples for entry in sample["ranks"]]
    assert {entry["rank"] for entry in ranks} == {3} and {entry["local_rank"] for entry in ranks} == {1}
    assert max(entry["cpu_s"] for entry in ranks) >= 1.0
    assert max(entry["rss_peak_bytes"] for entry in ranks) >= 50 * 2**20


def test_signalled_agent_ends_its_command_group_and_every_tagged_process() -> None:
    job_id = _job_id()
    script = ("import os, subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(60)']); "
              "print(os.getsid(0) == os.getpid(), flush=True); time.sleep(60)")
    proc = subprocess.Popen(["bash", "-c", _command(job_id, [sys.executable, "-c", script], {}, "/")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdin.write("{}\n")
    proc.stdin.close()
    started = frame_data(proc.stdout.readline())
    assert output_texts([proc.stdout.readline().strip()]) == ["True"], "the command runs in a session of its own"
    assert _eventually(lambda: len(proctree.job_pids(job_id)) >= 2), "the command and its setsid child are tagged"
    signalled = subprocess.run(node_argv(sys.executable, "signal", {"pid": started["pid"], "start_ticks": started["start_ticks"],
                                                                    "signal": int(signal.SIGTERM)}), capture_output=True, text=True)
    assert json.loads(signalled.stdout) == {"sent": True}
    assert proc.wait(30) == 128 + signal.SIGTERM
    assert _eventually(lambda: proctree.job_pids(job_id) == []), "the setsid child escaped the group but not the job tag"


def test_two_nodes_of_one_job_on_one_machine_each_sample_and_end_only_their_own_ranks(tmp_path: Path) -> None:
    """Nodes may share a process table (a test bed's namespace hosts, several nodes on one machine)."""
    job_id, go = _job_id(), tmp_path / "go"
    rank = ("import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
            "print('rank', os.environ['RANK'], 'done', flush=True)")
    nodes, lines = [], {0: [], 1: []}
    for node in (0, 1):
        tag = {"LAUNCH_JOB_ID": job_id, "LAUNCH_NODE": str(node)}
        request = {"job_id": job_id, "node": node, "argv": [sys.executable, "-c", rank, str(go)],
                   "env": {"RANK": str(node), "LOCAL_RANK": "0", **tag}, "cwd": "/", "secrets_on_stdin": True,
                   "grace": 1.0, "sample_s": 0.2}
        proc = subprocess.Popen(["bash", "-c", render_command(node_argv(sys.executable, "agent", request), tag, "/")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        proc.stdin.write("{}\n")
        proc.stdin.close()
        reader = threading.Thread(target=lambda p=proc, n=node: lines[n].extend(p.stdout), daemon=True)
        reader.start()
        nodes.append((proc, reader))

    def sampled(node: int) -> set[int]:
        return {entry["rank"] for data in frames([line.rstrip("\n") for line in list(lines[node])], "sample")
                for entry in data["ranks"]}

    assert _eventually(lambda: sampled(0) and sampled(1)), "both agents sample"
    assert sampled(0) == {0} and sampled(1) == {1}
    started = frame_data(lines[0][0])
    os.kill(started["pid"], signal.SIGTERM)
    assert nodes[0][0].wait(30) == 128 + signal.SIGTERM
    go.touch()
    assert nodes[1][0].wait(30) == 0, "node 0's agent ending its ranks left node 1's alone"
    nodes[1][1].join(5)
    assert "rank 1 done" in output_texts(line.rstrip("\n") for line in lines[1])


def test_a_signal_is_refused_for_a_reused_pid() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        wrong_ticks = proctree.start_ticks(sleeper.pid) + 1
        done = subprocess.run(node_argv(sys.executable, "signal", {"pid": sleeper.pid, "start_ticks": wrong_ticks,
                                                                   "signal": int(signal.SIGTERM)}), capture_output=True, text=True)
        assert json.loads(done.stdout) == {"sent": False} and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_broken_output_pipe_leaves_the_job_running_and_journaling() -> None:
    """The supervisor stops reading (docs/JOURNALS.md): the agent writes no more there, journals on, and the job
    runs until something ends it (here a signal; see test_node_journal.py for the rest)."""
    job_id = _job_id()
    proc = subprocess.Popen(["bash", "-c", _command(job_id, [sys.executable, "-c", "import time; time.sleep(60)"],
                                                    {"RANK": "0"}, "/", sample_s=0.2)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdin.write("{}\n")
    proc.stdin.close()
    started = frame_data(proc.stdout.readline())
    proc.stdout.close()
    journal = Path(started["run_dir"]) / "node1.journal"
    closed_at = len(frames(journal.read_bytes().split(b"\n"), "sample"))
    assert _eventually(lambda: len(frames(journal.read_bytes().split(b"\n"), "sample")) >= closed_at + 3), "samples are journaled"
    assert proc.poll() is None and proctree.job_pids(job_id), "the job runs on"
    os.kill(started["pid"], signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    assert _eventually(lambda: proctree.job_pids(job_id) == [])
    assert frames(journal.read_bytes().split(b"\n")[-2:], "exit") == [{"code": -15}]


def test_another_users_or_an_open_run_root_is_refused(tmp_path: Path) -> None:
    open_root = tmp_path / "open"
    open_root.mkdir(mode=0o777)
    open_root.chmod(0o777)
    with pytest.raises(rundir.RunDirError, match="open to other users"):
        rundir.job_run_dir("job-1", str(open_root))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(rundir.RunDirError, match="not a directory"):
        rundir.job_run_dir("job-1", str(link))
    world = tmp_path / "world"
    world.mkdir()
    world.chmod(0o777)
    with pytest.raises(rundir.RunDirError, match="may be changed by other users"):
        rundir.job_run_dir("job-1", str(world / "root"))
    with pytest.raises(rundir.RunDirError, match="bad job id"):
        rundir.job_run_dir("../x")
    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 12345, 12345)
        with pytest.raises(rundir.RunDirError, match="belongs to uid 12345"):
            rundir.job_run_dir("job-1", str(theirs))


def test_facts_report_modules_workdir_port_interfaces_and_route(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        request = {"modules": ["json", "no_such_module_xyz"], "workdir": str(tmp_path / "missing"),
                   "ifaces": ["lo", "nosuch0"], "port": port, "master": "127.0.0.1"}
        done = subprocess.run(node_argv(sys.executable, "facts", request), capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    assert found["missing"] == ["no_such_module_xyz"] and found["workdir_ok"] is False
    assert found["missing_ifaces"] == ["nosuch0"] and found["port_free"] is False
    assert found["dev"] == "lo" and found["route_error"] is None
    assert found["cpus"] == len(os.sched_getaffinity(0)) and found["executable"] == sys.executable


def test_a_time_limit_warning_reaches_ranks_that_handle_sigusr1_even_once_they_install_the_handler(tmp_path: Path) -> None:
    """Rank 1 handles SIGUSR1 from the start; rank 0 installs its handler only once rank 1 has been warned. The
    agent looks at the ranks in rank order, so it passed rank 0 over (no handler yet) in the round that warned
    rank 1: rank 0's warning can only come from a later round, the one that finds its new handler."""
    warning = tmp_path / "time-warning"
    warning.touch()  # the scheduler warned before the ranks were ready
    rank_1_warned = tmp_path / "rank-1-warned"
    rank = ("import os, signal, sys, time\n"
            "flag, me = sys.argv[1], os.environ['RANK']\n"
            "def handled(*_):\n"
            "    print(f'rank {me}: usr1 handled', flush=True)\n"
            "    open(flag, 'a').close() if me == '1' else None\n"
            "    sys.exit(0)\n"
            "deadline = time.monotonic() + 60\n"
            "while me == '0' and not os.path.exists(flag):  # rank 0 waits, unprotected, for rank 1's warning\n"
            "    if time.monotonic() > deadline:\n"
            "        sys.exit('rank 0: rank 1 was never warned')\n"
            "    time.sleep(0.05)\n"
            "signal.signal(signal.SIGUSR1, handled)\n"
            "time.sleep(60)\n"
            "print(f'rank {me}: never warned', flush=True)\n")
    # torchrun's part: start rank 0, then rank 1 (so rank 0 exists whenever rank 1 does), wait for both
    launcher = ("import os, subprocess, sys\n"
                "ranks = [subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]],\n"
                "                          env={**os.environ, 'RANK': str(r), 'LOCAL_RANK': str(r)}) for r in (0, 1)]\n"
                "sys.exit(max(p.wait() for p in ranks))\n")
    status, lines, _ = _run_agent([sys.executable, "-c", launcher, rank, str(rank_1_warned)], {}, "/", {},
                                  warn_file=str(warning))
    out = output_texts(lines)
    assert status == 0, out
    assert "rank 0: usr1 handled" in out and "rank 1: usr1 handled" in out
    assert not any("never warned" in line for line in out)
    told = [line for line in out if line.startswith("launch: the time limit is near: rank ")]
    assert [line.split()[7] for line in told] == ["1", "0"], told  # rank 0 warned after, and only after, rank 1
    assert all(line.endswith("got SIGUSR1") for line in told), told


def _gone(pid: int, ticks: int) -> bool:
    """Whether the process ``pid`` that started at ``ticks`` has ended (gone, reused, or a zombie nobody reaped yet)."""
    stat = proctree._stat(pid)
    return stat is None or stat[4] != ticks or stat[1] == "Z"


def _read_pid(path: Path) -> tuple[int, int]:
    pid, ticks = path.read_text().split()
    return int(pid), int(ticks)


DAEMON = """\
import os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
if sys.argv[2] == "quiet":
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
ticks = open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[19]
with open(sys.argv[1] + ".tmp", "w") as handle:
    handle.write(f"{os.getpid()} {ticks}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


@pytest.mark.parametrize("output", ["quiet", "holding the output"])
def test_a_daemon_a_rank_starts_with_a_clean_environment_ends_with_the_job(tmp_path: Path, output: str) -> None:
    """``env -i`` drops the job's tag and a double fork leaves the rank's tree: the agent still finds it below itself."""
    pidfile = tmp_path / "daemon.pid"
    rank = ("import os, subprocess, sys\n"
            f"subprocess.run(['env', '-i', sys.executable, '-c', {DAEMON!r}, {str(pidfile)!r}, {output!r}], check=True)\n"
            f"while not os.path.exists({str(pidfile)!r}): pass\n"
            "print('rank done', flush=True)\n")
    job_id = _job_id()
    proc = subprocess.Popen(["bash", "-c", _command(job_id, [sys.executable, "-c", rank], {}, "/")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    daemon = None
    try:
        out, _ = proc.communicate("{}\n", timeout=120)
        daemon = _read_pid(pidfile)
        assert proc.returncode == 0 and "rank done" in output_texts(out.splitlines())
        assert _gone(*daemon), "the daemon outlived its job"
        assert f"launch: node 1: ended 1 process(es) the job left running (pids {daemon[0]})" in output_texts(out.splitlines())
    finally:
        proc.kill()
        if daemon is None and pidfile.exists():
            daemon = _read_pid(pidfile)
        if daemon is not None:
            proctree.signal_if(daemon[0], daemon[1], signal.SIGKILL)


LAUNCHER_LIKE = """\
import subprocess, sys, time
rank = "import os, signal, sys, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" \\
       "ticks = open(f'/proc/{os.getpid()}/stat').read().rsplit(')', 1)[1].split()[19]\\n" \\
       "open(sys.argv[1] + '.tmp', 'w').write(f'{os.getpid()} {ticks}')\\nos.rename(sys.argv[1] + '.tmp', sys.argv[1])\\n" \\
       "time.sleep(600)\\n"
subprocess.Popen([sys.executable, "-c", rank, sys.argv[1]], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(600)
"""


@pytest.mark.parametrize("supervisor_end", ["hangup", "unattended"])
def test_ranks_that_ignore_sigterm_are_killed_before_the_agent_exits(tmp_path: Path, supervisor_end: str) -> None:
    """The job ends without a supervisor (its terminal hangs up, or it is gone and nobody follows the job for
    ``unattended_s``): a launcher that dies of TERM leaves a rank that ignores it; the agent must KILL that rank
    before it exits, not leave it running."""
    pidfile = tmp_path / "rank.pid"
    job_id = _job_id()
    proc = subprocess.Popen(["bash", "-c", _command(job_id, [sys.executable, "-c", LAUNCHER_LIKE, str(pidfile)], {}, "/",
                                                    unattended_s=1)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rank = None
    try:
        proc.stdin.write("{}\n")
        proc.stdin.close()
        started = frame_data(proc.stdout.readline())
        assert _eventually(pidfile.exists), "the rank ignores SIGTERM and says so"
        rank = _read_pid(pidfile)
        if supervisor_end == "hangup":
            os.kill(started["pid"], signal.SIGHUP)
        else:
            proc.stdout.close()
        assert proc.wait(60) == 128 + signal.SIGTERM
        assert _gone(*rank), "the rank that ignores SIGTERM outlived the agent"
    finally:
        proc.kill()
        if rank is None and pidfile.exists():
            rank = _read_pid(pidfile)
        if rank is not None:
            proctree.signal_if(rank[0], rank[1], signal.SIGKILL)


FD_PROBE = """\
import os
try:
    fd = os.open(f"/proc/{os.getppid()}/fd/1", os.O_WRONLY)
except PermissionError:
    print("refused", flush=True)
else:
    os.write(fd, b'@exit {"code":0}\\n')
    print("opened", flush=True)
"""


def test_a_rank_cannot_open_the_agents_output_to_forge_its_lines() -> None:
    """The rank runs as the agent's user (as root, both run as nobody: root may open any process's fds)."""
    python = "/usr/bin/python3" if os.getuid() == 0 else sys.executable
    as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.getuid() == 0 else []
    if as_user and not (shutil.which("setpriv") and os.access(python, os.X_OK)):
        pytest.skip("running as root, without setpriv or /usr/bin/python3 to run the agent as another user")
    job_id = _job_id()
    request = {"job_id": job_id, "node": 0, "argv": [python, "-c", FD_PROBE], "env": {"LAUNCH_JOB_ID": job_id},
               "cwd": "/", "grace": 1.0}
    # the agent's output is a pipe its own user made (as sshd's would be), so only the agent's /proc guards it
    through_own_pipe = ["sh", "-c", '"$@" | cat', "sh"]
    done = subprocess.run([*as_user, *through_own_pipe, *node_argv(python, "agent", request)], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin"}, timeout=120, cwd="/")
    lines = done.stdout.splitlines()
    started = frame_data(lines[0])
    shutil.rmtree(Path(started["run_dir"]), ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert "refused" in output_texts(lines) and "opened" not in output_texts(lines)
    assert frames(lines, "exit") == [{"code": 0}], "one exit line, the agent's own"


def test_a_lock_file_removed_while_the_agent_holds_its_lease_is_said_and_leased_again(tmp_path: Path) -> None:
    """Issue 39, item 5: a lock file another user owns (they leased the device first) is warned of in the job's log;
    the agent checks its lease while the job runs, and a lock file unlinked under it (as its owner or the directory's
    can) is one ``@lease`` frame naming who could have, and the device is leased again (docs/LEASES.md)."""
    import pwd

    from launcher.node import leases

    directory = tmp_path / "leases"
    directory.mkdir()
    directory.chmod(0o1777)
    lock = directory / f"{leases.host_name()}.slot0.lock"
    lock.touch(0o644)
    other = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
    if other is not None:
        os.chown(lock, other.pw_uid, other.pw_gid)
    go = tmp_path / "go"
    rank = f"import os, time\nend = time.time() + 20\nwhile not os.path.exists({str(go)!r}) and time.time() < end: time.sleep(0.05)"
    lease = {"kind": "slot", "count": 1, "capacity": 1, "job": "j", "dir": str(directory)}
    proc = subprocess.Popen(["bash", "-c", _command(_job_id(), [sys.executable, "-c", rank], {}, "/", lease=lease)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("{}\n")
    proc.stdin.close()
    lines = [proc.stdout.readline() for _ in range(3 if other is None else 4)]
    assert [kind_of_line(line) for line in lines[:2]] == ["leased", "started"], lines
    if other is not None:
        assert "launch: node 1: warning: the lock file(s) of slot(s) 0 belong to nobody, who can remove them and so " \
               "let another job lease the same device" in output_texts(lines)[1], lines
    lock.unlink()
    for line in proc.stdout:
        lines.append(line)
        if kind_of_line(line) == "lease":
            break
    go.touch()
    assert proc.wait(30) == 0
    assert frames(lines, "lease") == [{"kind": "slot", "device": 0, "path": str(lock), "what": "removed",
                                       "owners": ["nobody"] if other else [], "leased_again": True}]
    assert lock.exists() and leases.survey("slot", 1, str(directory)).free(False) == [0], "held past the agent's end"


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_the_unattended_watchdog_times_contact_on_the_monotonic_clock_whatever_the_wall_clock_does(tmp_path: Path,
                                                                                                  step_s: float) -> None:
    """Issue 39, item 12: the node's wall clock stepped. Forward (a touch just before the step looks an hour old):
    the attended job was ended as unattended. Back (the last touch looks an hour ahead): the policy was stuck, an
    unattended job never ended. A touch is now a change of the contact file, timed on the monotonic clock."""
    from launcher.node.agent import Agent
    from launcher.node.journal import Output, contact_path
    from launcher.node.protocol import AgentRequest

    out = Output(os.open(os.devnull, os.O_WRONLY))
    out.lose("no reader on stdout: only the contact file tells contact here")
    agent = Agent(AgentRequest(job_id="j", node=0, argv=("true",), unattended_s=1.0), out)
    agent.run_dir = str(tmp_path)
    contact = contact_path(str(tmp_path), 0)
    ended: list[str] = []
    agent.end = ended.append  # type: ignore[method-assign]
    relayed = threading.Event()
    watchdog = threading.Thread(target=agent.watch_contact, args=(relayed,), daemon=True)
    deadline = time.monotonic() + 2.0
    watchdog.start()
    while time.monotonic() < deadline:  # a reader in contact: touches every 0.1 s, with the stepped wall clock
        Path(contact).touch()
        os.utime(contact, (time.time() - step_s,) * 2)
        time.sleep(0.1)
    assert ended == [], "a reader in contact through a clock step was taken for none"
    assert _eventually(lambda: ended == ["unattended"], timeout=5.0), "the reader gone, the job was never ended"
    relayed.set()
    watchdog.join(5)


def _held_probe(job_id: str) -> subprocess.Popen:
    """Preflight's facts probe told to become the agent (``agent_within_s``), run as the SSH backend runs it: through
    bash, tagged with the job, not in the workdir."""
    command = render_command(node_argv(sys.executable, "facts", {"modules": ["json"], "agent_within_s": 60.0}),
                             {"LAUNCH_JOB_ID": job_id, "LAUNCH_NODE": "1"}, replace_shell=False)
    return subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd="/")


def test_preflights_probe_answers_then_becomes_the_agent_in_the_jobs_workdir(tmp_path: Path) -> None:
    job_id = _job_id()
    probe = _held_probe(job_id)
    assert probe.stdout is not None and probe.stdin is not None
    assert json.loads(probe.stdout.readline())["missing"] == [], "the facts answer first"
    parent_cwd = ("import os; parent = os.getppid(); grandparent = open(f'/proc/{parent}/stat').read().rsplit(')', 1)[1].split()[1]; "
                  "print('agent in', os.readlink(f'/proc/{parent}/cwd'), parent, 'under', grandparent, flush=True)")
    request = {"job_id": job_id, "node": 1, "argv": [sys.executable, "-c", parent_cwd], "cwd": str(tmp_path),
               "env": {"LAUNCH_JOB_ID": job_id, "LAUNCH_NODE": "1"}, "secrets_on_stdin": True, "grace": 1.0}
    out, _ = probe.communicate(json.dumps(request).encode() + b"\n{}\n", timeout=60)
    lines = out.decode().splitlines()
    assert probe.returncode == 0, lines
    [started] = frames(lines, "started")
    assert f"agent in {tmp_path} {started['pid']} under {probe.pid}" in output_texts(lines), \
        "the probe's own interpreter (bash's one child) ran it, from the workdir"
    assert frames(lines, "exit") == [{"code": 0}]


def test_a_probe_told_nothing_exits_having_started_nothing_and_one_sent_to_a_missing_workdir_says_so(tmp_path: Path) -> None:
    probe = _held_probe(_job_id())
    out, _ = probe.communicate(b"", timeout=60)
    assert probe.returncode == 0 and len(out.decode().splitlines()) == 1, "the answer, then nothing"
    job_id = _job_id()
    probe = _held_probe(job_id)
    request = {"job_id": job_id, "node": 1, "argv": ["true"], "cwd": str(tmp_path / "gone")}
    out, _ = probe.communicate(json.dumps(request).encode() + b"\n", timeout=60)
    assert probe.returncode == 126
    assert f"launch node agent: cannot enter the job's workdir {tmp_path / 'gone'}: No such file or directory" in out.decode()

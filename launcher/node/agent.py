"""The node agent: runs one node's command of a job and reports what it sees, on every backend.

It makes the job's private run directory (``rundir``), writes the files the plan gives (a DeepSpeed config),
starts the node's command (torchrun, the DeepSpeed launcher, or a container runtime running one)
in a session of its own, and reports one framed line per event (``protocol``: each stamped with the node's
clocks): journaled in the run directory (``journal``: ``node<N>.journal``, bounded), then written to its
stdout, which the backend carries to the supervisor:

    output      a line of the command's output (untrusted: ranks wrote it), cut at the request's line_limit
    started     the agent's and the command's PIDs, the host, the run directory
    sample      every sample_s: each rank's process tree (CPU seconds, RSS, GPU memory/util; ``sampler``)
    unattended  no reader was in contact for ``unattended_s`` seconds: the agent ends the job
    error_file  what torchrun recorded in its structured error file (``torchelastic``), after a failed command
    exit        the command's exit code, once its output is drained

With a ``lease`` in the request (local and SSH clusters), the agent first takes its node's leases
(``leases``: one GPU or CPU slot each, all or none, held until the agent exits; its holder record keeps the job's
step and pace from the step records relayed, ``progress``) and says ``@leased``
(``FrameKind.LEASED``: the devices) or ``@busy`` (who holds them; it then exits ``BUSY_EXIT``, having started
nothing). While it holds them it checks every ``LEASE_CHECK_S`` that each lock path still names the file it locked
(``Lease.verify``): a lock file removed or replaced (by its owner or the directory's) is one ``@lease`` frame
(``FrameKind.LEASE``), leased again where it can be.
With ``go_on_stdin`` it starts the command only once the backend writes ``go`` on its stdin: every
node of the job holds its leases by then, or none starts a rank.

Ranks cannot forge the agent's lines: everything they print is framed as output, and the agent
makes itself undumpable before it starts them, so a rank cannot open ``/proc/<agent>/fd/1`` to
write there. Every rank's line comes whole and behind its ``[rank]:`` prefix, whichever launcher
starts the ranks: torchrun tees each rank's output with the prefix the plan sets; under
DeepSpeed's launcher (whose ranks would all share one pipe, unprefixed, lines merging) the agent
runs that launcher with each rank's output on a pipe of its own (``rankstreams``, ``rankrelay``).

The job does not depend on the reader: when stdout breaks (the supervisor or its connection is
gone) the agent stops writing there and carries on journaling; a reader comes back with the
``follow`` command. A reader in contact touches ``node<N>.contact``; stdout taking the lines counts
too (and is marked there). With ``unattended_s`` set and no contact for that long, the agent ends the job.
Once the node records a newer supervisor generation than the request's (``node<N>.generation``,
`launch attach`), the agent sends its stdout's reader ``@fenced`` (not journaled) and nothing more;
an agent sent by an older generation starts nothing. The request's ``record`` (the job's plan,
specs and attempt) is kept as ``job.json`` in the run directory for `launch attach --cluster`.

The agent is its command's child subreaper (``subreaper``): whatever a rank starts stays below the agent, even a
daemon that dropped the job's tag from its environment (``env -i``) and left its parent. When
the command has exited, or on SIGTERM, SIGINT or SIGHUP, or when it has been unattended too long,
the agent ends the job: TERM to the command's process group, KILL after the grace period, the
job's containers, every process still tagged with the job, then every process still below the
agent; only then does it exit, with the command's status.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from . import leases, proctree, torchelastic
from .follow import RETENTION_S, clean_dirs, sweep_due
from .journal import (
    DEFAULT_LIMIT,
    RECORD_FILE,
    Journal,
    Output,
    contact_path,
    fenced_by,
    pid_path,
    touch,
    write_atomically,
)
from .linecut import READ_CHUNK, bounded_lines
from .progress import StepWatch
from .protocol import AgentRequest, FrameKind, RequestError, output_prefix
from .rankstreams import on_devices, with_rank_streams
from .rundir import RunDirError, job_run_dir, mark_store, private_dir
from .safepath import isolated
from .sampler import Sampler
from .secretmask import masker
from .subreaper import OWN, PR_SET_PDEATHSIG, SPAWN, harden, libc_prctl, reap_orphans, run_cleanup
from .timelimit import forward_warning

REAP_S = 1.0
EXIT_SIGNAL_BASE = 128
ORPHAN_WAIT_S = 5.0
CONTACT_POLL_S = 1.0  # the unattended watchdog looks this often (more often under a short ``unattended_s``)
LEASE_CHECK_S = 1.0  # how often a held lease's lock paths are checked (``Lease.verify``)
RUN_DIR_TOKEN = "${LAUNCH_RUN_DIR}"  # in an env value or an argument: this node's run directory
BUSY_EXIT = 75  # EX_TEMPFAIL: the leases were not free (or another node's were not): nothing was started
RANKS_DIR = "ranks"  # in the run directory: the ranks' own (LAUNCH_RUN_DIR), apart from the agent's control files
HOOKS_DIR = "pyhooks"  # in the run directory: the ranks' start-up hook, first on their PYTHONPATH
TAG_NAMES = ("LAUNCH_JOB_ID", "LAUNCH_NODE")  # always set as they are: they tag the runtime's own processes too


class Fenced(Exception):
    """The node records a newer supervisor generation than the one that sent this agent: it starts nothing."""


def relay(fd: int, out: Output, limit: int, mask: Callable[[bytes], bytes] | None = None,
          steps: StepWatch | None = None) -> None:
    """Copy the command's output to ``out`` as output lines, each cut at ``limit`` bytes (``linecut``) and its
    secrets masked (``mask``: ``secretmask``), before they are journaled; the whole lines of each read go to ``out``
    together, stamped with the node's time of that read. ``steps`` notes the step records among them."""
    for batch in bounded_lines(lambda: os.read(fd, READ_CHUNK), limit):
        if steps is not None:
            steps.feed(batch)
        prefix = output_prefix()
        out.write_lines([prefix + (mask(line) if mask else line) for line in batch])


def write_step_hooks(run_dir: str, files: dict[str, str], pythonpath: str | None) -> str:
    """Write the ranks' step hooks (``sitehook``, ``stephooks``) in the run directory's ``pyhooks`` folder; the
    ranks' ``PYTHONPATH``: that folder first, then ``pythonpath`` (the job's, else the node's) as it was."""
    import py_compile

    folder = private_dir(os.path.join(run_dir, HOOKS_DIR))
    for filename, text in files.items():
        path = os.path.join(folder, os.path.basename(filename))
        write_atomically(path, text)
        # compiled now, for this interpreter: every process of the job imports sitecustomize, and where
        # PYTHONDONTWRITEBYTECODE is set none would keep its compilation (about 2.5 ms a process)
        py_compile.compile(path, doraise=False, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    return folder + (os.pathsep + pythonpath if pythonpath else "")


class Agent:
    """One node's run (see the module docstring). ``req`` is the request the backend sent."""

    def __init__(self, req: AgentRequest, out: Output) -> None:
        self.req = req
        self.out = out
        self.job_id = req.job_id
        node_tag = req.env.get(proctree.NODE_TAG)
        self.node = int(node_tag) if node_tag is not None else None  # this node's processes carry the tag
        self.grace = req.grace
        self.proc: subprocess.Popen[bytes] | None = None
        self.run_dir: str | None = None
        self.subreaper = False
        self.left: list[int] = []  # PIDs still alive once the job was ended (none, unless a KILL failed)
        self._ending = threading.Lock()
        self._ended = False
        self._end_done = threading.Event()
        self._sweeping = threading.Lock()
        self.lease: leases.Lease | None = None
        self.mask: Callable[[bytes], bytes] | None = None  # the job's secrets masked in its output (``start``)
        self._contact_mark: tuple[int, int, int] | None = None  # the contact file as last seen: inode, mtime, ctime
        self._contact_seen: float | None = None  # when it was seen to change (monotonic): a reader touched it

    def take_leases(self, go: Callable[[], bool] | None) -> bool:
        """Take the request's leases (all or none) and wait for ``go`` when given; False (said in ``@busy`` or
        ``@exit``) when they are not free or the backend did not say go: then nothing has started."""
        spec = self.req.lease
        assert spec is not None
        got = leases.acquire(spec.kind, spec.count, spec.capacity,
                             {"job": self.job_id, "from": spec.origin, "max_steps": spec.max_steps},
                             waited=spec.waited, allow_shared=spec.allow_shared, directory=spec.dir)
        if isinstance(got, leases.Busy):
            self.out.event(FrameKind.BUSY, got.as_json(spec.allow_shared))
            return False
        self.lease = got
        self.out.event(FrameKind.LEASED, {"kind": got.kind, "devices": got.devices, "host": leases.host_name()})
        if go is not None and not go():
            self.out.note(f"launch: node {self.req.node}: not started: another node of the job could not take its leases")
            return False
        return True

    def start(self, secrets: dict[str, str]) -> None:
        req = self.req
        self.mask = masker(secrets)
        self.run_dir = run_dir = job_run_dir(self.job_id)
        try:  # the retention of run directories (docs/JOURNALS.md): this user's that no agent used for a week go
            if sweep_due():
                clean_dirs(None, RETENTION_S, skip=self.job_id)
        except OSError:
            pass
        newer = fenced_by(run_dir, req.node, req.generation)
        if newer is not None:
            raise Fenced(f"a newer supervisor (generation {newer['generation']}) is in charge of the job")
        if req.record is not None:  # what `launch attach --cluster` reads back (no secret in it)
            write_atomically(os.path.join(run_dir, RECORD_FILE), json.dumps(req.record))
            store = req.record.get("store")
            if isinstance(store, str):  # the store its supervisor files into: the directory goes once it has filed the job
                with contextlib.suppress(RunDirError, OSError):
                    mark_store(run_dir, store)
        # the pid file first: a reader that finds this attempt's journal finds this agent's pid
        write_atomically(pid_path(run_dir, req.node), f"{os.getpid()} {proctree.start_ticks(os.getpid())}\n")
        self.out.attach(Journal(run_dir, req.node, DEFAULT_LIMIT if req.journal_limit is None else req.journal_limit))
        # the ranks' directory is not the agent's: a rank writing $LAUNCH_RUN_DIR/node0.generation or appending to
        # node0.journal there touches nothing of the agent's
        ranks_dir = private_dir(os.path.join(run_dir, RANKS_DIR))
        planned = {key: value.replace(RUN_DIR_TOKEN, ranks_dir) for key, value in req.env.items()}
        if self.lease is not None and self.lease.kind == "gpu":  # the GPUs leased, in nvidia-smi's (PCI) order
            planned.update(CUDA_VISIBLE_DEVICES=",".join(map(str, self.lease.devices)), CUDA_DEVICE_ORDER="PCI_BUS_ID")
        given = {**planned, **secrets, "LAUNCH_RUN_DIR": ranks_dir}
        for name, (filename, text) in req.files.items():
            path = os.path.join(ranks_dir, os.path.basename(filename))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            given[name] = path
        if req.step_hooks:
            given["PYTHONPATH"] = write_step_hooks(run_dir, req.step_hooks, given.get("PYTHONPATH", os.environ.get("PYTHONPATH")))
        prefix = req.env_prefix
        tag = {key: given[key] for key in TAG_NAMES if key in given}
        env = {**os.environ, **{prefix + key: value for key, value in given.items()}, **tag}
        argv = [arg.replace(RUN_DIR_TOKEN, ranks_dir) for arg in req.argv]
        torchelastic.clear(torchelastic.error_file(ranks_dir, req.node))  # an earlier attempt's is not this one's
        argv = isolated(with_rank_streams(on_devices(argv, self.lease.devices) if self.lease and self.lease.kind == "gpu" else argv))
        prctl = libc_prctl()
        self.subreaper = harden(prctl)
        with SPAWN:
            self.proc = subprocess.Popen(
                argv, cwd=run_dir if req.cleanup else (req.cwd or None), env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=(lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM)) if prctl else None,
            )
            OWN.add(self.proc.pid)
        self.out.event(FrameKind.STARTED, {"pid": os.getpid(), "child": self.proc.pid, "host": socket.gethostname(),
                                   "run_dir": run_dir, "start_ticks": proctree.start_ticks(os.getpid()),
                                   **({"devices": self.lease.devices} if self.lease else {})})
        if self.lease is not None:
            shown = ",".join(map(str, self.lease.devices))
            visible = f" (CUDA_VISIBLE_DEVICES={shown})" if self.lease.kind == "gpu" else ""
            self.out.note(f"launch: node {req.node}: {self.lease.kind}(s) {shown} leased on "
                          f"{leases.host_name()} for the job's life{visible}")
            for why in self.lease.exposed:
                self.out.note(f"launch: node {req.node}: warning: {why} and so let another job lease the same device "
                              "(this agent would see it and say so); on a shared node root runs `launch queue --set-up` "
                              "once (docs/LEASES.md)")

    def end(self, why: str) -> None:
        """End the command and everything of the job on this node, from any thread; a second call waits for
        the first to finish. A container runtime's command starts in the run directory (podman's conmon leaves
        files where it is started) and its container is stopped and removed by the request's ``cleanup`` commands."""
        with self._ending:
            first, self._ended = not self._ended, True
        if not first:
            self._end_done.wait()
            return
        try:
            proc = self.proc
            if proc is not None and proc.poll() is None:
                proctree.end_group(proc.pid, self.grace, alive=lambda: proc.poll() is None)
            run_cleanup([list(command) for command in self.req.cleanup], self.grace)
            proctree.end_job(self.job_id, self.grace, self.node)
            self.sweep()
        finally:
            self._end_done.set()

    def sweep(self) -> list[int]:
        """End every process still below the agent (what the job left, whatever its environment says), then
        reap them; the PIDs ended. One sweep at a time: a second waits for the first (the agent exits after)."""
        with self._sweeping:
            return self._sweep()

    def _sweep(self) -> list[int]:
        if not self.subreaper:
            return []
        helpers = frozenset(OWN - {self.proc.pid} if self.proc is not None else OWN)  # nvidia-smi, clean-up
        ended = [proc.pid for proc in proctree.descendants(os.getpid(), helpers)]
        if ended:
            self.left = proctree.end_descendants(os.getpid(), self.grace, helpers)
            self.out.note(f"launch: node {self.req.node}: ended {len(ended)} process(es) the job left running "
                          f"(pids {' '.join(map(str, ended[:16]))})")
        reap_orphans()
        return ended

    def watch_output(self) -> None:
        """Give stdout up once its reading end is closed (POLLERR/POLLHUP on it), though nothing is being written:
        it no longer counts as contact. The job carries on (its journal keeps the lines). While stdout keeps up,
        its reader's contact is marked in the contact file (`launch attach` reads it); once the node records a
        newer supervisor generation than this agent's, stdout is closed to the older one (``fence_stdout``)."""
        poller = select.poll()
        poller.register(self.out.fileno(), select.POLLERR | select.POLLHUP)
        while not self.out.broken.is_set():
            if poller.poll(1000):
                self.out.lose("the reader of stdout is gone")
            elif self.run_dir is not None:
                newer = fenced_by(self.run_dir, self.req.node, self.req.generation)
                if newer is not None:
                    self.fence_stdout(newer)
                elif self.out.contact_age() < CONTACT_POLL_S:
                    touch(contact_path(self.run_dir, self.req.node))

    def fence_stdout(self, newer: dict) -> None:
        """A newer supervisor took the job: the older one, reading stdout, gets ``@fenced`` (not journaled) after
        the lines queued for it, then nothing more (it stops on that line); the journal says so and goes on."""
        why = (f"a newer supervisor (generation {newer.get('generation')}, process {newer.get('pid')} on "
               f"{newer.get('host')}) took the job")
        self.out.farewell(FrameKind.FENCED, newer, why)
        self.out.note(f"launch: node {self.req.node}: {why}; the older one's stream was told")

    def since_contact(self) -> float:
        """Seconds since a reader was last in contact: stdout taking the lines, or the contact file touched. A touch
        is seen as a change of the file (its times), timed on this node's monotonic clock: the wall clock the times
        are written with may step (NTP, an operator) without ending an attended job or holding an unattended one."""
        age = self.out.contact_age()
        if self.run_dir is not None:
            try:
                info = os.stat(contact_path(self.run_dir, self.req.node))
                mark: tuple[int, int, int] | None = (info.st_ino, info.st_mtime_ns, info.st_ctime_ns)
            except OSError:
                mark = None
            if mark is not None and mark != self._contact_mark:
                self._contact_mark, self._contact_seen = mark, time.monotonic()
            if self._contact_seen is not None:
                age = min(age, time.monotonic() - self._contact_seen)
        return age

    def watch_contact(self, relayed: threading.Event) -> None:
        """With ``unattended_s`` set: once no reader has been in contact for that long, journal ``@unattended``
        and end the job (the command exits, its output drains, ``run`` reports ``@exit`` as always)."""
        limit = self.req.unattended_s
        if limit is None:
            return
        started = time.monotonic()
        while not relayed.wait(min(CONTACT_POLL_S, max(0.05, limit / 10))):
            since = min(self.since_contact(), time.monotonic() - started)  # the agent's start counts as contact
            if since >= limit and not self._ended:
                self.out.event(FrameKind.UNATTENDED, {"after_s": round(since, 1) if math.isfinite(since) else limit})
                self.end("unattended")
                return

    def watch_lease(self, relayed: threading.Event) -> None:
        """While the job runs, say each lock file of its lease that was removed or replaced (``@lease``)."""
        while self.lease is not None and not relayed.wait(LEASE_CHECK_S):
            try:
                moved = self.lease.verify()
            except OSError:  # released meanwhile (the agent is ending)
                return
            for found in moved:
                self.out.event(FrameKind.LEASE, found.as_json())

    def run(self) -> int:
        """Relay and sample until the command exits and its output is drained; the agent's exit status."""
        assert self.proc is not None and self.proc.stdout is not None
        sampler = Sampler(self.job_id, self.node, self.out, self.req.gpus, self.req.sample_s, self.req.rendezvous_port,
                          self.run_dir)
        relayed = threading.Event()
        targets = [sampler.run, self.watch_output, lambda: self._end_orphans(relayed), lambda: self._reap(relayed),
                   lambda: self.watch_contact(relayed), lambda: self.watch_lease(relayed)]
        steps = StepWatch(self.req.lease.max_steps) if self.lease is not None and self.req.lease is not None else None
        if steps is not None and self.lease is not None:  # the job's pace, in its holder record for every user to read
            targets.append(functools.partial(steps.run, relayed, self.lease.note_progress))
        warn_file = self.req.warn_file
        if warn_file:
            targets.append(lambda: forward_warning(self.job_id, self.node, self.out, warn_file, relayed))
        for target in targets:
            threading.Thread(target=target, daemon=True).start()
        relay(self.proc.stdout.fileno(), self.out, self.req.line_limit, self.mask, steps)
        relayed.set()
        code = self.proc.wait()
        sampler.stop.set()
        if self._ended:
            self._end_done.wait()  # an end a signal or a lost supervisor began: ranks that outlive TERM get KILL first
        self.sweep()
        recorded = (torchelastic.read(torchelastic.error_file(os.path.join(self.run_dir, RANKS_DIR), self.req.node))
                    if code and self.run_dir else None)
        if recorded is not None:
            self.out.event(FrameKind.ERROR_FILE, recorded)
        self.out.event(FrameKind.EXIT, {"code": code})
        return EXIT_SIGNAL_BASE - code if code < 0 else code

    def _reap(self, relayed: threading.Event) -> None:
        """Reap the orphans re-parented to the agent while the job runs (each would stay a zombie until it exits)."""
        while self.subreaper and not relayed.wait(REAP_S):
            reap_orphans()

    def _end_orphans(self, relayed: threading.Event) -> None:
        """Once the command has exited, end what it left behind holding its output open (``ORPHAN_WAIT_S``)."""
        assert self.proc is not None
        self.proc.wait()
        if not relayed.wait(ORPHAN_WAIT_S):
            with self._sweeping:
                proctree.end_job(self.job_id, self.grace, self.node)
                self._sweep()


def main(argv: list[str], enter_cwd: bool = False) -> int:
    """``agent REQUEST_JSON`` (``protocol.AgentRequest``); with ``secrets_on_stdin`` the next stdin line is a JSON
    object of secrets. ``enter_cwd``: the agent was started elsewhere (preflight's probe, kept) and first goes to the
    request's ``cwd``, where a backend starts every other agent."""
    try:
        req = AgentRequest.from_json(argv[0])
    except RequestError as exc:
        print(f"launch node agent: {exc}", file=sys.stderr, flush=True)
        return 2
    if enter_cwd and req.cwd:
        try:
            os.chdir(req.cwd)
        except OSError as exc:
            print(f"launch node agent: cannot enter the job's workdir {req.cwd}: {exc.strerror or exc}", file=sys.stderr,
                  flush=True)
            return 126
    secrets = json.loads(sys.stdin.readline() or "{}") if req.secrets_on_stdin else {}
    go = (lambda: sys.stdin.readline().strip() == "go") if req.lease is not None and req.lease.go_on_stdin else None
    return serve(req, Output(sys.stdout.fileno()), secrets, go)


def serve(req: AgentRequest, out: Output, secrets: dict[str, str], go: Callable[[], bool] | None = None) -> int:
    """Run one node's command as ``req`` says, framed lines to ``out`` (closed once they are written there, or
    given up); the agent's exit status. ``go``: with a lease, wait for it before starting (False: do not start)."""
    agent = Agent(req, out)
    try:
        return _serve(agent, go, secrets)
    finally:
        if agent.lease is not None:
            agent.lease.release()
        out.close()


def _serve(agent: Agent, go: Callable[[], bool] | None, secrets: dict[str, str]) -> int:
    req, out = agent.req, agent.out
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: threading.Thread(target=agent.end, args=("signalled",), daemon=True).start())
    try:
        if req.lease is not None and not agent.take_leases(go):
            out.event(FrameKind.EXIT, {"code": BUSY_EXIT})
            return BUSY_EXIT
    except (leases.LeaseError, OSError) as exc:
        out.note(f"launch: node {req.node}: cannot take its leases: {exc}")
        out.event(FrameKind.EXIT, {"code": 126, "error": str(exc)})
        return 126
    try:
        agent.start(secrets)
    except (RunDirError, Fenced, OSError) as exc:
        out.note(f"launch: node {req.node}: cannot start: {exc}")
        out.event(FrameKind.EXIT, {"code": 126, "error": str(exc)})
        return 126
    return agent.run()

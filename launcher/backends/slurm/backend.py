"""The ``slurm`` backend: one ``sbatch`` job per attempt, one step running the node side on every node.

``launch`` runs where Slurm's clients work (a login node); ``workdir`` lies on a filesystem that
every node and this machine mount. Each attempt gets a private directory
``<workdir>/.launch/<job id>/a<N>/`` holding the batch script and everything the nodes and the
supervisor exchange (see ``launcher.node.slurmnode``): the nodes' facts, their run requests, their
agents' framed output. So a detached supervisor needs nothing but these files and ``squeue``; and
the Slurm job, detached by ``sbatch`` itself, survives the submitting shell.

While Slurm holds the job pending, the supervisor records it QUEUED with Slurm's reason and
job id. Once allocated, the nodes' facts are checked as preflight is on SSH (a problem ends the
job FAILED with the same report, and ``scancel``); then the plan is re-made with the nodes'
names, addresses and interfaces and each node's agent starts. A node Slurm declares failed, the
time limit and any other end Slurm decides are reported with Slurm's own words. Cancel is
``scancel`` confirmed by ``squeue`` (the job ended, no step left). The time-limit warning
(``sbatch --signal=B:USR1@N``) reaches the batch shell, which leaves a file the node agents
watch for; they pass SIGUSR1 on to the ranks that handle it.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import time
from pathlib import Path
from typing import ClassVar

from launcher.backends.agents import agent_request
from launcher.backends.base import (
    Backend,
    CommandResult,
    NodeSweep,
    Preflight,
    Stage,
    StageState,
    StartContext,
    SweepOutcome,
    SweepReport,
    unreachable,
)
from launcher.backends.facts import FactsError, NodeFacts
from launcher.backends.nodechecks import FACTS_TIMEOUT_S, facts_request, node_problems
from launcher.backends.slurm import commands as cli
from launcher.backends.slurm.job import POLL_S, SlurmJob, SlurmNode, slurm_lines, step_log_tail
from launcher.backends.slurm.planning import CHECK_NODES, SlurmPlanning, required
from launcher.backends.slurm.spec import SlurmCluster, time_minutes
from launcher.errors import LaunchError, NodeStartError, PreflightError
from launcher.node.protocol import Frame, FrameKind, SlurmRequest, SlurmRun, parse
from launcher.node.ship import node_argv
from launcher.node.slurmnode import ABORT_FILE, write_private
from launcher.plan.netenv import NodeNetwork
from launcher.plan.planner import Plan
from launcher.spec.cluster import NodeSpec

JOB_DIR = ".launch"
WARN_FILE = "time-warning"
SLURM_ID_FILE = "slurm-id"  # in each attempt's directory: which Slurm job `launch attach` follows
STARTED_TIMEOUT_S = 120.0
CONFIRM_TIMEOUT_S = 60.0
SETTLE_S = 10.0  # the sweep lets a job whose agents have exited end by itself this long before scancel
CHECK_QUEUE_WAIT_S = 300.0  # ... and waits this long for each probe's allocation
NOT_YET_SCHEDULED = "None"  # squeue's reason until the scheduler has looked at the job
UNSCHEDULED_QUIET_S = 3.0  # a job the scheduler has not looked at yet is not called queued before this


def job_name(job_id: str) -> str:
    """The Slurm job name of every attempt of a launch job."""
    return f"launch-{job_id}"


def batch_script(node_command: list[str], folder: Path) -> str:
    """The batch script: one step on every node with all the job's CPUs, GPUs and memory there (``--whole``,
    Slurm 21.08+); USR1 (the time-limit warning) leaves WARN_FILE for the agents."""
    step = ["srun", "--ntasks-per-node=1", "--whole", "--kill-on-bad-exit=0", f"--output={folder}/node%n.step.log",
            *node_command]
    return "\n".join([
        "#!/bin/bash",
        "# written by launch: the node side on every node of the allocation (launcher/node/slurmnode.py)",
        f"trap {shlex.quote('touch ' + shlex.quote(str(folder / WARN_FILE)))} USR1",
        f"{shlex.join(step)} &",
        "step=$!",
        'while true; do wait "$step"; code=$?; kill -0 "$step" 2>/dev/null || exit "$code"; done',
        "",
    ])


class SlurmBackend(Backend[SlurmCluster]):
    """Submits each attempt with ``sbatch``; follows it with ``squeue``/``scontrol`` and the job directory."""

    name: ClassVar[str] = "slurm"
    planning_class = SlurmPlanning

    def __init__(self, cluster: SlurmCluster) -> None:
        super().__init__(cluster)
        self.spec = cluster.slurm
        self.partition = required(cluster.slurm.partition, "slurm.partition")
        self.workdir = required(cluster.workdir, "workdir")
        self._jobs: dict[str, SlurmJob] = {}
        self._check_nodes: list[str] | None = None

    def close(self) -> None:
        """Nothing to release: each Slurm command runs on its own, and the job's files stay with the job."""

    # at submit: what the controller answers at once

    def preflight(self, plan: Plan) -> Preflight:
        """Whether the partition exists and can ever hold the job (nodes, GPUs per node, time limit)."""
        spec, problems = self.spec, []
        found = cli.partition(self.partition)
        if found is None:
            return Preflight(problems=[f"slurm.partition: Slurm has no partition '{self.partition}' (`sinfo -s` lists them)"])
        if not found.up:
            problems.append(f"slurm.partition: partition '{self.partition}' is not UP (`scontrol show partition {self.partition}`)")
        limit = min(n for n in (found.total_nodes, found.max_nodes) if n is not None)
        if plan.nnodes > limit:
            problems.append(f"resources.nodes: the job asks for {plan.nnodes} nodes; partition '{self.partition}' "
                            f"can give at most {limit} (TotalNodes={found.total_nodes}, MaxNodes={found.max_nodes or 'UNLIMITED'})")
        wanted = time_minutes(spec.time) if spec.time else None
        if spec.time and found.max_minutes is not None and (wanted is None or wanted > found.max_minutes):
            problems.append(f"slurm.time: {spec.time} is more than partition '{self.partition}' allows "
                            f"(MaxTime {found.max_minutes} min); the job would stay pending forever")
        if spec.gpus_per_node:
            enough: int = sum(count for count, gpus in cli.partition_gpus(self.partition) if gpus >= spec.gpus_per_node)
            if enough < plan.nnodes:
                problems.append(f"slurm.gpus_per_node: {plan.nnodes} nodes with {spec.gpus_per_node} GPUs each wanted; "
                                f"partition '{self.partition}' has {enough} such nodes (`sinfo -p {self.partition} -o %D|%G`)")
        return Preflight(problems=problems)

    # start: submit, wait in the queue, check the allocation, start the agents

    def start(self, plan: Plan, context: StartContext) -> tuple[Plan, list[SlurmNode]]:
        folder = self._attempt_dir(plan.job_id)
        request = SlurmRequest(str(folder), tuple(dataclasses.replace(
            facts_request(plan, index, gpus=bool(self.spec.gpus_per_node), resolve_self=plan.launcher == "torchrun"),
            port=None) for index in range(plan.nnodes)),
                               plan.rendezvous.port, FACTS_TIMEOUT_S)
        script = folder / "job.sh"
        script.write_text(batch_script(node_argv(plan.python, "slurm", request), folder))
        argv = cli.sbatch_argv(self.spec, nodes=plan.nnodes, job_name=job_name(plan.job_id),
                               output=str(folder / "batch.log"), workdir=self.workdir, script=str(script))
        job = SlurmJob(cli.parse_job_id(cli.checked(argv)), folder)
        (folder / SLURM_ID_FILE).write_text(job.slurm_id)
        self._jobs[plan.job_id] = job
        try:
            context.submitted(job.slurm_id)
            self._wait_allocated(plan, job, context)
            found = self._gather_facts(plan, job, context)
            if found.problems:
                raise PreflightError(
                    f"preflight failed on {len(found.problems)} check(s); nothing was started:\n"
                    + "\n".join(f"  {p}" for p in found.problems),
                    hint="fix the nodes or the cluster spec (python, workdir, network); Slurm job "
                         f"{job.slurm_id} was cancelled")
            placed = context.place(plan, found) if context.place else plan
            for node in placed.nodes:
                run = SlurmRun(agent_request(placed, node, context.grace, secrets_on_stdin=False,
                                             generation=context.generation, record=context.record,
                                             warn_file=str(folder / WARN_FILE)), dict(context.secrets))
                write_private(str(folder / f"node{node.index}.run.json"), run.to_json())
            pids = self._wait_started(placed, job, context)
        except BaseException:
            self._abort(job)
            raise
        return placed, [SlurmNode(node.index, node.host, job, pids[node.index]) for node in placed.nodes]

    def follow(self, plan: Plan, index: int, after: int, agent: tuple[int, int | None] | None = None,
               generation: int = 0) -> SlurmNode:
        """`launch attach`: node ``index`` of the job's last Slurm job, its agent's output file read past ``after``
        lines (the file is on the shared job directory, as when the job was started). No generation is checked
        here (the output file is read directly): `attach --takeover` is refused on Slurm."""
        job = self._jobs.get(plan.job_id) or self._last_job(plan.job_id)
        return SlurmNode(index, plan.nodes[index].host, job, agent[0] if agent else None, skip=after)

    def _last_job(self, job_id: str) -> SlurmJob:
        folders = sorted((Path(self.workdir) / JOB_DIR / job_id).glob("a*/" + SLURM_ID_FILE),
                         key=lambda path: int(path.parent.name[1:]) if path.parent.name[1:].isdigit() else -1)
        if not folders:
            raise NodeStartError(f"job {job_id}: no Slurm job of it under {Path(self.workdir) / JOB_DIR / job_id}", 0)
        job = SlurmJob(folders[-1].read_text().strip(), folders[-1].parent)
        self._jobs[job_id] = job
        return job

    def _attempt_dir(self, job_id: str) -> Path:
        base = Path(self.workdir) / JOB_DIR / job_id
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        attempt = 0
        while True:
            folder = base / f"a{attempt}"
            try:
                folder.mkdir(mode=0o700)
                return folder
            except FileExistsError:
                attempt += 1

    def _wait_allocated(self, plan: Plan, job: SlurmJob, context: StartContext) -> None:
        """Until Slurm runs the job: QUEUED with its reason while pending; the start stage once allocated."""
        shown, submitted = None, time.monotonic()
        while True:
            self._check_cancelled(context)
            status = job.status(fresh=True)
            if status.state == cli.SlurmState.PENDING:
                reason = status.reason if status.reason != NOT_YET_SCHEDULED else "submitted, not yet scheduled"
                unscheduled = status.reason == NOT_YET_SCHEDULED and time.monotonic() - submitted < UNSCHEDULED_QUIET_S
                if reason != shown and not unscheduled:
                    context.queued(reason, job.slurm_id)
                    context.stage(Stage.QUEUED, None, "", StageState.RUNNING)
                    shown = reason
            elif status.state.ended:
                raise NodeStartError(f"Slurm job {job.slurm_id} ended {status.state.value} (Reason={status.reason}) "
                                     f"before it started{slurm_lines(job.folder)}", 0)
            elif status.state != cli.SlurmState.CONFIGURING:
                if shown is not None:
                    context.stage(Stage.QUEUED, None, "", StageState.DONE)
                context.allocated(job.slurm_id)
                return
            time.sleep(POLL_S)

    def _gather_facts(self, plan: Plan, job: SlurmJob, context: StartContext) -> Preflight:
        """Every node's facts from the allocation; the problems node_problems finds, and the probed network."""
        answers: dict[int, str] = {}
        for node in plan.nodes:
            context.stage(Stage.PREFLIGHT, node.index, node.host, StageState.RUNNING)
        deadline = time.monotonic() + FACTS_TIMEOUT_S
        while len(answers) < plan.nnodes:
            self._check_cancelled(context)
            for index in set(range(plan.nnodes)) - set(answers):
                path = job.folder / f"node{index}.facts.json"
                if path.exists():
                    answers[index] = path.read_text(errors="replace")
            if len(answers) == plan.nnodes:
                break
            status = job.status()
            if status.state.ended or time.monotonic() > deadline:
                missing = sorted(set(range(plan.nnodes)) - set(answers))
                raise NodeStartError(
                    f"nodes {missing} sent no facts (Slurm job {job.slurm_id} {status.state.value}, "
                    f"Reason={status.reason}): {step_log_tail(job.folder, missing[0])}", missing[0])
            time.sleep(POLL_S)
        problems, nodes, probes, facts = [], [], {}, {}
        for index in range(plan.nnodes):
            try:
                found = NodeFacts.from_json(answers[index])
            except FactsError as exc:
                problems.append(f"node {index}: {exc}")
                context.stage(Stage.PREFLIGHT, index, plan.nodes[index].host, StageState.FAILED)
                continue
            host = found.slurm_node or found.hostname or plan.nodes[index].host
            where = f"node {index} ({host})"
            node_problems_here = node_problems(where, plan, found, plan.nodes[index], self.spec.gpus_per_node)
            problems += node_problems_here
            context.stage(Stage.PREFLIGHT, index, host, StageState.FAILED if node_problems_here else StageState.DONE)
            address = found.source or found.master or host
            nodes.append(NodeSpec(host=host, address=address, gpus=self.spec.gpus_per_node, slots=plan.nproc_per_node))
            probes[index] = NodeNetwork(interface=found.dev or self.cluster.network.interface, address=address,
                                        ib_hcas=found.hcas, memlock_max=found.settable_memlock)
            facts[index] = found
        return Preflight(problems=problems, nodes=nodes, probes=probes, facts=facts)

    def _wait_started(self, plan: Plan, job: SlurmJob, context: StartContext) -> dict[int, int | None]:
        """Each node's agent PID from its ``started`` frame (or its ``exit``: it could not start)."""
        pids: dict[int, int | None] = {}
        deadline = time.monotonic() + STARTED_TIMEOUT_S
        for node in plan.nodes:
            context.stage(Stage.START, node.index, node.host, StageState.RUNNING)
        while len(pids) < plan.nnodes:
            self._check_cancelled(context)
            for node in plan.nodes:
                path = job.folder / f"node{node.index}.out"
                if node.index in pids or not path.exists():
                    continue
                for line in path.read_text(errors="replace").split("\n")[:-1]:  # whole lines only
                    parsed = parse(line)
                    if isinstance(parsed, Frame) and parsed.kind is FrameKind.STARTED:
                        pids[node.index] = parsed.get_int("pid")
                    elif isinstance(parsed, Frame) and parsed.kind is FrameKind.EXIT and node.index not in pids:
                        pids[node.index] = None
                if node.index in pids:
                    context.stage(Stage.START, node.index, node.host, StageState.DONE)
            status = job.status()
            if len(pids) < plan.nnodes and (status.state.ended or time.monotonic() > deadline):
                index = min(set(range(plan.nnodes)) - set(pids))
                raise NodeStartError(f"node {index} ({plan.nodes[index].host}): its agent did not start (Slurm job "
                                     f"{job.slurm_id} {status.state.value}): {step_log_tail(job.folder, index)}", index)
            time.sleep(POLL_S / 5)
        return pids

    def _check_cancelled(self, context: StartContext) -> None:
        if context.cancelled.is_set():
            raise LaunchError("cancelled before the job started")

    # ending and confirming

    def _abort(self, job: SlurmJob) -> None:
        """End a job that did not start. ``scancel`` comes first, so Slurm records it CANCELLED as launch decided
        (the node side, seeing the abort file first, would end it FAILED); the abort file then ends a node side that
        Slurm cannot signal; ``_end`` confirms."""
        try:
            cli.cancel(job.slurm_id)
        except cli.SlurmCommandError:
            pass  # _end asks again, and says so if Slurm still refuses
        (job.folder / ABORT_FILE).touch()
        self._end(job)

    def _end(self, job: SlurmJob, settle: float = 0.0) -> bool:
        """``scancel`` unless it ends by itself within ``settle`` seconds (a job whose agents all exited: its
        batch script ends it COMPLETED); True once squeue confirms it ended with no step left."""
        deadline = time.monotonic() + settle
        while not job.status(fresh=True).state.ended and time.monotonic() < deadline:
            time.sleep(POLL_S / 2)
        if not job.status(fresh=True).state.ended:
            cli.cancel(job.slurm_id)
        deadline = time.monotonic() + CONFIRM_TIMEOUT_S
        while time.monotonic() < deadline:
            if job.status(fresh=True).state.ended and not cli.steps(job.slurm_id):
                return True
            time.sleep(POLL_S / 2)
        return False

    def sweep(self, plan: Plan, grace: float, end: bool = True, generation: int | None = None) -> SweepReport:
        """End (``scancel``) every Slurm job of this launch job and confirm from squeue that each ended with no
        step left; a node Slurm marks down cannot be checked (its processes outlive a dead slurmd), nor can any
        node while Slurm does not answer (unknown is not clean)."""
        unknown: list[str] = []
        try:
            ids = set(cli.jobs_named(job_name(plan.job_id)))
        except cli.SlurmCommandError as exc:
            ids, unknown = set(), [f"Slurm could not be asked which of its jobs are left: {exc}"]
        if plan.job_id in self._jobs:
            ids.add(self._jobs[plan.job_id].slurm_id)
        left = []
        for slurm_id in sorted(ids):
            try:
                still = self._left(plan, slurm_id, end)
            except cli.SlurmCommandError as exc:
                unknown.append(f"Slurm job {slurm_id}: {exc}")
                continue
            left += [still] if still else []
        for stale in (Path(self.workdir) / JOB_DIR / plan.job_id).glob("a*/node*.run.json"):
            stale.unlink(missing_ok=True)  # a run request never read holds the secrets
        hosts = [node.host for node in plan.nodes]
        try:
            down = {name: why for name, why in cli.node_reasons([h for h in hosts if not h.startswith("slurm-node-")]).items()
                    if "down" in why[0] or "*" in why[0]}
        except cli.SlurmCommandError as exc:
            down, unknown = {}, [*unknown, f"Slurm could not be asked about the nodes: {exc}"]
        return SweepReport(tuple(
            NodeSweep(index, host, SweepOutcome.UNREACHABLE, detail=f"Slurm has the node {down[host][0]}: {down[host][1]}")
            if host in down else
            NodeSweep(index, host, SweepOutcome.UNREACHABLE, detail="; ".join(unknown)) if unknown else
            NodeSweep(index, host, SweepOutcome.LEFTOVERS, detail="; ".join(left)) if left else
            NodeSweep(index, host, SweepOutcome.CLEAN)
            for index, host in enumerate(hosts)))

    def _left(self, plan: Plan, slurm_id: str, end: bool) -> str | None:
        """What is left of Slurm job ``slurm_id`` after ending it (with ``end``), or None once it ended with no step."""
        known = self._jobs.get(plan.job_id)
        job = SlurmJob(slurm_id, known.folder if known is not None else Path(self.workdir))
        settle = SETTLE_S if known is not None and known.slurm_id == slurm_id and known.agents_done(plan.nnodes) else 0
        confirmed = self._end(job, settle) if end else job.status().state.ended and not cli.steps(slurm_id)
        if confirmed:
            return None
        return (f"Slurm job {slurm_id} is still {job.status(fresh=True).state.value} "
                f"(steps: {', '.join(cli.steps(slurm_id)) or 'none'})")

    # short commands on a node of a running job (stacks, kernel log)

    def run_on_node(self, plan: Plan | None, index: int, argv: list[str], timeout: float) -> CommandResult:
        """Run ``argv`` on node ``index`` of the job's running allocation (``srun --overlap``)."""
        if plan is None:
            return self._run_checked(index, argv, timeout)
        job = self._jobs.get(plan.job_id)
        host = plan.nodes[index].host
        try:
            if job is None or job.status().state != cli.SlurmState.RUNNING:
                return unreachable(f"node {index}: the job's Slurm allocation is not running")
            done = cli.run(["srun", f"--jobid={job.slurm_id}", "--overlap", "--nodes=1", "--ntasks=1",
                            f"--nodelist={host}", "--quiet", *argv], timeout=timeout + 30)
        except cli.SlurmCommandError as exc:
            return unreachable(f"node {index} ({host}): {exc}")
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def _run_checked(self, index: int, argv: list[str], timeout: float) -> CommandResult:
        """`launch check`'s command on the partition's node ``index`` (of ``check_hosts``), in an allocation of its own."""
        minutes = max(1, math.ceil(timeout / 60))
        try:
            if self._check_nodes is None:
                self._check_nodes = cli.nodes_in_service(self.partition)[:CHECK_NODES]
            done = cli.run([*cli.srun_argv(self.spec, self._check_nodes[index], minutes), *argv],
                           timeout=timeout + CHECK_QUEUE_WAIT_S)
        except cli.SlurmCommandError as exc:
            return unreachable(str(exc))
        return CommandResult(done.returncode, done.stdout, done.stderr)

"""The Ray backend: one placement-group bundle and one node-agent actor per node of the plan.

Preflight places a STRICT_SPREAD placement group (one bundle per node: the
job's CPUs, and its GPUs when the cluster has GPUs), starts one actor
(``launcher.backends.ray.actor``) in each bundle, and asks each for its node's IP
(node 0's is the rendezvous address), hostname and Python (the interpreter
Ray's workers run: the nodes' default when the cluster spec names none), then
runs the node facts probe there; the planner re-plans with those. The group
and the actors are named after the job and detached, so a detached supervisor
(another process) finds them, starts each node's agent through its actor and
pulls its output; the sweep (or ``launch cancel``) ends the processes through
the actors, kills them and removes the group.

Ray is imported only here, inside the class, so the CLI never loads it.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import sys
import threading
import time
from typing import Any, ClassVar

from launcher.backends import stopping
from launcher.backends.agents import agent_start
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
from launcher.backends.ray import actor as rayactor
from launcher.backends.ray.handle import SILENCE_S, RayNode, first_line
from launcher.backends.ray.placement import UNPLACED_HINT, resource_text, why_unplaced
from launcher.backends.ray.planning import RayPlanning
from launcher.backends.ray.spec import RayCluster
from launcher.errors import LaunchError, NodeStartError, PreflightError
from launcher.node.ship import node_argv
from launcher.plan.netenv import AUTO, NodeNetwork
from launcher.plan.planner import NodePlan, Plan
from launcher.spec.cluster import NodeSpec

NAMESPACE = "launch"
CONNECT_TIMEOUT_S = 10.0
ACTOR_TIMEOUT_S = 60.0
WAIT_REPORT_S = 3.0


def group_name(job_id: str) -> str:
    """Name of the job's placement group (in the ``launch`` namespace)."""
    return f"launch-{job_id}"


def actor_name(job_id: str, index: int) -> str:
    """Name of the actor of node ``index`` of the job (it runs that node's agent)."""
    return f"launch-{job_id}-node{index}"


class RayBackend(Backend[RayCluster]):
    """Runs a plan's nodes on an existing Ray cluster (``ray: {address: ...}``).

    Connects on first use, not when created (``ray.init`` installs its own SIGTERM handler in the
    main thread, which is put back as it was).
    """

    name: ClassVar[str] = "ray"
    planning_class = RayPlanning

    def __init__(self, cluster: RayCluster) -> None:
        super().__init__(cluster)
        self._ray: Any = None
        self._owns = False
        self._runs: dict[str, Plan] = {}
        self._connecting = threading.Lock()

    @property
    def ray(self) -> Any:
        """The ``ray`` module, connected to the cluster (at the first call; once, whatever the threads: a sweep's
        fan-out asked from two threads at once and ray.init ran twice)."""
        with self._connecting:
            if self._ray is None:
                self._ray = self._connect()
        return self._ray

    def _connect(self) -> Any:
        import ray
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(rayactor)
        cloudpickle.register_pickle_by_value(stopping)
        if ray.is_initialized():
            return ray
        address = self.cluster.ray.address
        _check_reachable(address)
        previous = signal.getsignal(signal.SIGTERM)
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise PreflightError(
                f"cannot connect to the Ray cluster at '{address}' (cluster.yaml ray.address): {first_line(exc)}",
                hint="start it with `ray start --head`, or use ray://HOST:10001 (Ray Client) or 'auto' on a cluster node",
            ) from None
        finally:
            if previous is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, previous)
        self._owns = True
        return ray

    def preflight(self, plan: Plan) -> Preflight:
        """Place the job's group, start its actors, learn each node's address and network; start no agent."""
        ray = self.ray
        bundle = self._bundle(plan)
        group = ray.util.placement_group(
            [bundle] * plan.nnodes, strategy="STRICT_SPREAD", name=group_name(plan.job_id), lifetime="detached"
        )
        try:
            self._wait_placed(plan, group, bundle)
            actors = self._create_actors(plan, group, bundle)
            found = self._probe(plan, actors)
        except BaseException:
            self._remove(plan)
            raise
        if found.problems:
            self._remove(plan)
        return found

    def _bundle(self, plan: Plan) -> dict[str, float]:
        cpus = self.cluster.ray.cpus_per_node or plan.nproc_per_node
        bundle = {"CPU": float(cpus)}
        if self.ray.cluster_resources().get("GPU", 0) > 0:
            bundle["GPU"] = float(plan.nproc_per_node)
        return bundle

    def _wait_placed(self, plan: Plan, group, bundle: dict[str, float]) -> None:
        ray, timeout = self.ray, self.cluster.ray.placement_timeout
        start = time.monotonic()
        ready = group.ready()
        while True:
            waited = time.monotonic() - start
            done, _ = ray.wait([ready], timeout=min(WAIT_REPORT_S, max(0.0, timeout - waited)))
            if done:
                return
            waited = time.monotonic() - start
            if waited >= timeout:
                raise PreflightError(why_unplaced(ray, plan, bundle, timeout), hint=UNPLACED_HINT)
            sys.stderr.write(
                f"waiting for Ray to place {plan.nnodes} bundle(s) of {resource_text(bundle)}, one per node: "
                f"{waited:.0f} s of {timeout:.0f} s (ray.placement_timeout)\n"
            )
            sys.stderr.flush()

    def _create_actors(self, plan: Plan, group, bundle: dict[str, float]) -> list:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor = self.ray.remote(rayactor.NodeActor)
        return [
            actor.options(
                name=actor_name(plan.job_id, index),
                namespace=NAMESPACE,
                lifetime="detached",
                max_concurrency=4,
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index),
            ).remote(plan.job_id, index, group_name(plan.job_id))
            for index in range(plan.nnodes)
        ]

    def _probe(self, plan: Plan, actors: list) -> Preflight:
        facts = self._gather([actor.describe.remote() for actor in actors], "report their nodes")
        master = facts[0]["ip"]
        python = self.cluster.python or facts[0]["python"]
        probe_route = self.cluster.network.interface == AUTO
        resolve = plan.launcher == "torchrun" and not ipaddress.ip_address(master).is_loopback

        def request(index: int) -> list[str]:
            return node_argv(python, "facts", facts_request(plan, index, master=master if probe_route else None,
                                                             resolve_self=resolve))

        answers = self._gather([actor.run.remote(request(index), FACTS_TIMEOUT_S) for index, actor in enumerate(actors)],
                               "probe their nodes")
        problems: list[str] = []
        found: dict[int, NodeFacts] = {}
        for index, (fact, (code, out, err)) in enumerate(zip(facts, answers)):
            where = f"node {index} ({fact['hostname']}, {fact['ip']})"
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if code != 0 or not lines:
                problems.append(f"{where}: {python} cannot run the node probe: {(err or out).strip()[-300:]} "
                                "(the Ray workers run this Python unless 'python:' is set in the cluster spec)")
                continue
            try:
                found[index] = NodeFacts.from_json(lines[-1])
            except FactsError as exc:
                problems.append(f"{where}: {exc}")
                continue
            problems += node_problems(where, plan.model_copy(update={"python": python}), found[index], plan.nodes[index])
        nodes = [
            NodeSpec(host=fact["hostname"], address=fact["ip"], gpus=fact["gpus"], slots=plan.nproc_per_node)
            for fact in facts
        ]
        networks = {
            index: NodeNetwork(
                interface=answer.dev or self.cluster.network.interface,
                address=answer.source or facts[index]["ip"],
                ib_hcas=answer.hcas,
                memlock_max=answer.settable_memlock,
            )
            for index, answer in found.items()
        }
        return Preflight(problems=problems, nodes=nodes, probes=networks, python=python, facts=found)

    def _gather(self, refs: list, what: str) -> list:
        ray = self.ray
        try:
            return ray.get(refs, timeout=ACTOR_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise PreflightError(f"the job's Ray actors did not {what} within {ACTOR_TIMEOUT_S:.0f} s") from None
        except ray.exceptions.RayError as exc:
            raise PreflightError(f"the job's Ray actors could not {what}: {first_line(exc)}") from None

    def start(self, plan: Plan, context: StartContext) -> tuple[Plan, list[RayNode]]:
        """Start every node's agent through its actor, with the plan's env (and secrets) for the ranks; on a
        failure (an actor gone, silent for ACTOR_TIMEOUT_S, or refusing) end every agent asked to start."""
        ray = self.ray
        self._runs[plan.job_id] = plan
        asked: list[RayNode] = []
        try:
            for node in plan.nodes:
                context.stage(Stage.START, node.index, node.host, StageState.RUNNING)
                actor = self._actor(plan.job_id, node.index)
                if actor is None:
                    raise NodeStartError(f"node {node.index}: its Ray actor is gone (placement group removed?)", node.index)
                handle = RayNode(node.index, actor, None, ray)
                asked.append(handle)
                handle.pid = self._start_agent(plan, node, actor, context)
                context.stage(Stage.START, node.index, node.host, StageState.DONE)
        except BaseException:
            for handle in asked:
                handle.terminate(context.grace)
            raise
        return plan, asked

    def _start_agent(self, plan: Plan, node: NodePlan, actor, context: StartContext) -> int:
        """The PID of ``node``'s agent, started by its actor; NodeStartError naming the node if it was not."""
        ray = self.ray
        start = agent_start(plan, node, context.grace, context.secrets, record=context.record)
        tag = {"LAUNCH_JOB_ID": plan.job_id, "LAUNCH_NODE": str(node.index)}
        where = f"node {node.index} ({node.host})"
        try:
            started = ray.get(actor.start.remote(start.argv, tag, start.stdin, node.cwd, plan.unattended_s, context.grace),
                              timeout=ACTOR_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise NodeStartError(f"{where}: its Ray actor did not start the agent within {ACTOR_TIMEOUT_S:.0f} s",
                                 node.index) from None
        except ray.exceptions.RayError as exc:
            raise NodeStartError(f"{where}: its Ray actor failed: {first_line(exc)}", node.index) from None
        if isinstance(started, str):
            raise NodeStartError(f"{where}: {started}", node.index)
        return started

    def run_on_node(self, plan: Plan | None, index: int, argv: list[str], timeout: float) -> CommandResult:
        """Run a short command on node ``index`` of a placed job, through its actor."""
        if plan is None:
            raise LaunchError("`launch check` needs fixed nodes (local or ssh); on Ray, submit a job and read `launch status`")
        actor = self._actor(plan.job_id, index)
        if actor is None:
            return unreachable(f"node {index}: the job's Ray actor there is gone")
        ray = self.ray
        try:
            code, out, err = ray.get(actor.run.remote(argv, timeout), timeout=timeout + SILENCE_S)
        except ray.exceptions.RayError as exc:
            return unreachable(f"node {index}: its Ray actor did not answer: {first_line(exc)}")
        return CommandResult(code, out, err)

    def sweep(self, plan: Plan, grace: float, end: bool = True, generation: int | None = None) -> SweepReport:
        """End the job's processes on every node through the actors (they stay for a restart; ``close``
        removes them and the group)."""
        self._runs[plan.job_id] = plan
        if self._released(plan):
            said = "its placement group was removed and its actors are gone: Ray ended the job's workers there"
            return SweepReport(tuple(NodeSweep(n.index, n.host, SweepOutcome.CLEAN, detail=said) for n in plan.nodes))
        return super().sweep(plan, grace, end, generation)

    def _released(self, plan: Plan) -> bool:
        """Ray's own word that nothing of the job is left: its group removed (by its actors once unattended, or by a
        close) and none of its actors alive; launch's agents die with their actors' workers (PDEATHSIG)."""
        groups = self.ray.util.placement_group_table().values()
        ours = [g for g in groups if g.get("name") == group_name(plan.job_id)]
        return all(g.get("state") == "REMOVED" for g in ours) and all(
            self._actor(plan.job_id, n.index) is None for n in plan.nodes)

    def _actor(self, job_id: str, index: int):
        """The live actor of a job's node, or None (never created, or gone)."""
        try:
            return self.ray.get_actor(actor_name(job_id, index), namespace=NAMESPACE)
        except ValueError:
            return None

    def _remove(self, plan: Plan) -> None:
        """Kill the job's actors and remove its placement group."""
        ray = self.ray
        for index in range(plan.nnodes):
            actor = self._actor(plan.job_id, index)
            if actor is not None:
                ray.kill(actor, no_restart=True)
        try:
            group = ray.util.get_placement_group(group_name(plan.job_id))
        except ValueError:
            return
        ray.util.remove_placement_group(group)

    def close(self) -> None:
        """Remove the groups and actors of the jobs this backend started or swept, then disconnect.

        A submit that only ran preflight (``--detach``) leaves them to the
        detached supervisor, which finds them by name.
        """
        for plan in self._runs.values():
            self._remove(plan)
        self._runs.clear()
        if self._owns:
            self._ray.shutdown()
            self._owns = False


def _check_reachable(address: str) -> None:
    """Fail fast if a HOST:PORT (or ray://HOST:PORT) address does not accept connections."""
    if address == AUTO:
        return
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise PreflightError(f"ray.address '{address}' is not 'auto', HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise PreflightError(
            f"cannot reach the Ray cluster at '{address}' (cluster.yaml ray.address): {exc}",
            hint="is the head running (`ray status` on it)? GCS port 6379 by default, Ray Client 10001",
        ) from None

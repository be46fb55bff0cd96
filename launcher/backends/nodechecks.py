"""A node checked before launch, the same for every backend: the facts request preflight sends it (the modules, the
workdir, the rendezvous port, the container, torch's build locks) and what its parsed answer says is wrong with it
for a plan.
"""

from __future__ import annotations

from launcher.backends.facts import FactsError, NodeFacts
from launcher.catalog.strategies import get_strategy
from launcher.node.protocol import ContainerCheck, FactsRequest
from launcher.node.ship import facts_argv
from launcher.plan import containers
from launcher.plan.commands import RECIPE_MODULE
from launcher.plan.planner import NodePlan, Plan
from launcher.spec.container import ContainerSpec

FACTS_TIMEOUT_S = 1800.0 + 360.0  # a preflight may pull a container image (launch.node.facts.PULL_TIMEOUT_S)
HOST_MEMORY_SHARE = 0.85  # of a node's memory a job may plan to use (the rest: the OS, page cache, other work)
RUN_ROOT_HINT = ("the run root is $XDG_RUNTIME_DIR/launch, else a /tmp/launch-UID-* directory of this user's "
                 "(docs/JOURNALS.md \"Run directories\")")
STALE_BUILD_LOCK_S = 1800.0  # a torch build lock this old was left by a killed build (DeepSpeed's ops build in minutes)


def facts_request(plan: Plan, index: int, *, ifaces: tuple[str, ...] = (), gpus: bool = False,
                  master: str | None = None, resolve_self: bool = False) -> FactsRequest:
    """The facts request preflight sends to node ``index``: the modules the job needs, its workdir, the
    rendezvous port on node 0, and, for a job in a container, the runtime, the image and the facts of the
    interpreter inside it; a backend adds what it checks (pinned interfaces, GPUs, the route to node 0)."""
    node = plan.nodes[index]
    modules = tuple(required_modules(plan))
    deepspeed = plan.container is None and "deepspeed" in modules  # its ranks load JIT-built ops through torch's
    # build lock (in an image: its own cache)
    return FactsRequest(modules=modules, workdir=node.cwd, run_root=True, port=plan.rendezvous.port if index == 0 else None,
                        ifaces=ifaces, gpus=gpus, master=master, resolve_self=resolve_self,
                        container=container_request(plan, plan.container, index) if plan.container is not None else None,
                        build_locks=deepspeed, extensions_dir=node.env.get("TORCH_EXTENSIONS_DIR") if deepspeed else None)


def container_request(plan: Plan, spec: ContainerSpec, index: int) -> ContainerCheck:
    """How a node checks the job's container (``spec``): runtime usable, image present or pulled, facts inside the image."""
    node = plan.nodes[index]
    probe_name = containers.ContainerName(f"{plan.job_id}-probe", index)
    inside = facts_argv(spec.python, FactsRequest(modules=tuple(required_modules(plan)), workdir=node.cwd))
    # a node that has (or may have) HCAs checks the image with what InfiniBand needs, memlock lowered by the node
    ib = any(containers.IB_DEVICES in option.args for option in node.run_options)
    apptainer = spec.runtime.value == "apptainer"
    return ContainerCheck(
        probe=tuple(containers.probe_argv(spec.runtime)),
        present=tuple(containers.image_present_argv(spec)),
        pull="never" if apptainer else spec.pull.value,
        pull_argv=None if apptainer else tuple(containers.pull_argv(spec)),
        inside=tuple(containers.run_argv(spec, probe_name, inside, [], node.cwd, 0)),
        # put right after `docker run` / `podman run` by the node (not a second copy of the whole argv: the
        # shipped node code in it is most of what a command line may hold)
        ib_options=tuple(arg for option in containers.ib_options(containers.InfiniBand(("?",))) for arg in option.args)
        if ib else None,
    )


def required_modules(plan: Plan) -> list[str]:
    """What the nodes' interpreter must import for this plan: torch, deepspeed under DeepSpeed,
    launch itself for a built-in recipe (a user's program needs only torch)."""
    modules = ["torch"]
    if plan.launcher == "deepspeed" or plan.ds_config:
        modules.append("deepspeed")
    if RECIPE_MODULE in plan.nodes[0].argv:
        modules.append("launcher")
    return modules


def node_problems(host: str, plan: Plan, facts: NodeFacts, node: NodePlan | None = None, gpus: int = 0) -> list[str]:
    """What a node's facts say is wrong with it for this plan (every backend's preflight uses this)."""
    node = node or plan.nodes[0]
    problems = []
    if facts.missing and plan.container is not None:
        problems.append(f"{host}: {plan.container.python} in image {plan.container.image} cannot import "
                        f"{', '.join(facts.missing)} (container.python names the image's interpreter)")
    elif facts.missing:
        problems.append(
            f"{host}: {plan.python} cannot import {', '.join(facts.missing)} "
            "(install it on the node, or point cluster.yaml python at an interpreter that has it)"
        )
    if facts.run_root_error:
        problems.append(f"{host}: the job's run directory cannot be made there: {facts.run_root_error}; {RUN_ROOT_HINT}")
    if not facts.workdir_ok:
        problems.append(f"{host}: workdir '{node.cwd}' does not exist (cluster.yaml workdir, or set sync_workdir)")
    for name in facts.missing_ifaces:
        problems.append(f"{host}: network interface '{name}' (cluster.yaml network.interface) does not exist")
    if facts.port_free is False:
        problems.append(
            f"{host}: rendezvous port {plan.rendezvous.port} is in use on node 0 (a stale job may hold it: "
            "`launch status`; or choose another rendezvous.port)"
        )
    if gpus and not facts.gpus:
        problems.append(f"{host}: cluster.yaml says {gpus} GPUs but nvidia-smi failed: {facts.gpu_error}")
    elif gpus and len(facts.gpus) < gpus:
        problems.append(f"{host}: cluster.yaml says {gpus} GPUs, nvidia-smi lists {len(facts.gpus)}")
    if facts.route_error and not facts.dev:
        problems.append(
            f"{host}: cannot find the interface routing to node 0: {facts.route_error} (pin network.interface in cluster.yaml)"
        )
    box = facts.container
    container = plan.container
    if container is not None and box is not None:
        for what, error in ((f"container runtime {container.runtime.value} is not usable", box.runtime_error),
                            (f"image {container.image}", box.image_error), ("inside the image", box.inside_error)):
            if error:
                problems.append(f"{host}: {what}: {error}")
    offloaded = plan.memory.cpu_gib_per_node if plan.memory and plan.strategy and get_strategy(plan.strategy).offload else None
    total = facts.mem_total_bytes
    if offloaded and total is not None and offloaded * 2**30 > total * HOST_MEMORY_SHARE:
        problems.append(
            f"{host}: {plan.strategy} keeps about {offloaded:.1f} GiB of model states in host memory on each node; "
            f"this node has {total / 2**30:.1f} GiB ({HOST_MEMORY_SHARE:.0%} usable): use more nodes, or zero3"
        )
    for lock in facts.build_locks:
        if lock.age_s >= STALE_BUILD_LOCK_S:
            problems.append(
                f"{host}: torch's build lock {lock.path} is {lock.age_s / 3600:.1f} h old: a build of that op was "
                "killed there, and every DeepSpeed rank loading it would wait on the file for ever "
                "(pytorch/pytorch#189245); remove it if no build is running on the node"
            )
    if facts.hostname_resolves not in (None, True):
        problems.append(
            f"{host}: its hostname '{facts.hostname}' does not resolve ({facts.hostname_resolves}); torchrun's "
            "c10d rendezvous looks it up: add it to /etc/hosts or DNS"
        )
    return problems


def parse_facts(host: str, answer: object) -> tuple[NodeFacts | None, str | None]:
    """A node's facts answer as received, parsed once: (the facts, None), or (None, ``host``'s problem)."""
    try:
        return NodeFacts.parse(answer), None
    except FactsError as exc:
        return None, f"{host}: {exc}"

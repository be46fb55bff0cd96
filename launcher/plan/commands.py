"""Per-node launcher command lines (torchrun, DeepSpeed's per-node launcher), as argv lists."""

from __future__ import annotations

import base64
import json
from typing import Protocol

from launcher.plan.batch import BatchPlan
from launcher.spec.job import PYTHON_NAMES, JobSpec, interpreter_options

TORCHRUN_MODULE = "torch.distributed.run"
DEEPSPEED_MODULE = "deepspeed.launcher.launch"
RECIPE_MODULE = "launcher.recipes.train"
STATIC = "static"  # torchrun's fixed ranks: node N is told it is N
C10D = "c10d"  # torchrun's rendezvous rounds in node 0's store: what elastic jobs need


class RendezvousArgs(Protocol):
    """What torchrun's rendezvous flags are made of (the plan's ``Rendezvous``)."""

    @property
    def backend(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...


def program_args(job: JobSpec, batch: BatchPlan | None, ds_config: dict | None) -> tuple[bool, list[str]]:
    """What each rank runs: (is_python, args). Python programs omit the interpreter.

    An entrypoint whose program is exactly ``python`` or ``python3`` runs under the cluster's
    interpreter (its ``-u``, the one option the spec allows, dropped: output is unbuffered already);
    any other program (``/opt/py38/bin/python3.8``, ``pythonic-tool``) runs as written.
    """
    if job.entrypoint is None:
        assert batch is not None, "the planner makes a batch plan for every recipe"
        return True, ["-m", RECIPE_MODULE, *recipe_args(job, batch, ds_config)]
    argv = list(job.entrypoint)
    if argv[0] in PYTHON_NAMES:
        return True, argv[1 + len(interpreter_options(argv)):]
    return False, argv


def recipe_args(job: JobSpec, batch: BatchPlan, ds_config: dict | None) -> list[str]:
    """Flags of ``python -m launcher.recipes.train`` for a built-in recipe."""
    assert job.recipe is not None, "a job without an entrypoint names a recipe (the spec checks it)"
    args: list[str] = [
        "--recipe", job.recipe,
        "--strategy", job.strategy,
        "--precision", job.precision,
        "--micro-batch", str(batch.micro_batch),
        "--grad-accum", str(batch.grad_accum),
        "--max-steps", str(job.total_steps),
        "--seed", str(job.seed),
        "--metrics-every", str(job.metrics.every),
    ]
    optional = {
        "--model-size": job.model.size,
        "--seq-len": job.model.seq_len,
        "--num-layers": job.model.num_layers,
        "--lr": job.lr,
        "--data-path": job.data.path,
        "--checkpoint-dir": job.checkpoint.dir,
        "--checkpoint-every": job.checkpoint.every_steps or None,
        "--compile-mode": job.compile_mode,
    }
    for flag, value in optional.items():
        if value is not None:
            args += [flag, str(value)]
    if job.checkpoint.resume:
        args.append("--resume")
    if ds_config is not None:
        args += ["--ds-config-json", json.dumps(ds_config, sort_keys=True, separators=(",", ":"))]
    return args


def torchrun_argv(
    python: str,
    nnodes: int,
    nproc: int,
    node_rank: int,
    rendezvous: RendezvousArgs,
    local_addr: str,
    program: tuple[bool, list[str]],
) -> list[str]:
    """``torchrun`` for one node, with a fixed node count.

    ``static`` rendezvous: every node is told its rank, node 0 hosts the store at
    ``--master-addr``/``--master-port`` and the others connect to it (as DeepSpeed's launcher does);
    no rendezvous rounds. ``c10d``: the agents agree on ranks through rounds in node 0's store
    (elastic jobs need it; torchrun ignores ``--node-rank`` there, and ``--local-addr`` names the node
    to the others).
    """
    argv = [
        python, "-m", TORCHRUN_MODULE,
        "--nnodes", str(nnodes),
        "--nproc-per-node", str(nproc),
        "--node-rank", str(node_rank),
    ]
    argv += _RENDEZVOUS_FLAGS[rendezvous.backend](rendezvous, local_addr)
    argv += [
        "--max-restarts", "0",
        "--monitor-interval", "0.5",
        "--tee", "3",
    ]
    return argv + _program_tail(program, no_python="--no-python", module="-m")


def _static_flags(rendezvous: RendezvousArgs, local_addr: str) -> list[str]:
    return ["--rdzv-backend", STATIC, "--master-addr", rendezvous.host, "--master-port", str(rendezvous.port),
            "--rdzv-id", rendezvous.id]


def _c10d_flags(rendezvous: RendezvousArgs, local_addr: str) -> list[str]:
    return ["--rdzv-backend", C10D, "--rdzv-endpoint", f"{rendezvous.host}:{rendezvous.port}",
            "--rdzv-id", rendezvous.id, "--local-addr", local_addr]


# torchrun's flags for each rendezvous the planner may choose (``planner.rendezvous_backend``)
_RENDEZVOUS_FLAGS = {STATIC: _static_flags, C10D: _c10d_flags}


def deepspeed_argv(
    python: str,
    procs_per_node: list[int],
    node_rank: int,
    master_addr: str,
    master_port: int,
    program: tuple[bool, list[str]],
    local_rank_flag: bool = True,
) -> list[str]:
    """DeepSpeed's per-node launcher (what ``deepspeed`` runs on each node through pdsh).

    ``procs_per_node`` lists the processes of each node in node order; it becomes
    ``--world_info`` (keyed ``node0``, ``node1``...: DeepSpeed only counts them). Ranks get
    ``--local_rank=N`` as the ``deepspeed`` command gives it, unless ``local_rank_flag`` is off.
    """
    world = {f"node{index}": list(range(nproc)) for index, nproc in enumerate(procs_per_node)}
    world_info = base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
    argv = [
        python, "-u", "-m", DEEPSPEED_MODULE,
        f"--world_info={world_info}",
        f"--node_rank={node_rank}",
        f"--master_addr={master_addr}",
        f"--master_port={master_port}",
    ]
    if not local_rank_flag:
        argv.append("--no_local_rank")
    return argv + _program_tail(program, no_python="--no_python", module="--module")


def _program_tail(program: tuple[bool, list[str]], no_python: str, module: str) -> list[str]:
    """The program part of a launcher's argv, in that launcher's spelling of its flags."""
    is_python, args = program
    flags = [] if is_python else [no_python]
    if args and args[0] == "-m":
        return flags + [module, *args[1:]]
    return flags + args

"""A small distributed program the tests launch: it reports what each rank saw.

Each rank writes ``rank<R>.json`` (argv, identity env, selected env, hostname,
all_reduce result) into ``$PROBE_OUT``, then trains nothing for ``PROBE_STEPS``
steps while reporting metrics. ``PROBE_FAIL_RANK=R`` makes rank R exit 1
at step ``PROBE_FAIL_AT_STEP`` (default 0), only once when ``PROBE_CKPT`` names a
checkpoint directory (where rank 0 saves the step, and from which every
rank resumes); ``PROBE_OOM_CGROUP`` makes that failure an OOM kill inside the given
memory cgroup; ``PROBE_STEP_S`` sets a step's duration; ``--echo`` prints
the watched env values (to check that `launch` masks secrets in its logs); ``PROBE_FOLLOWER=ID`` marks the job
store ID as following the job on the node, as another store's `launch attach` does (its run directory is kept).
"""

import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from launcher.metrics import Reporter

IDENTITY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "LAUNCH_JOB_ID", "LAUNCH_NODE", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    watched = [k for k in os.environ.get("PROBE_ENV_KEYS", "").split(",") if k]
    out = os.environ.get("PROBE_OUT")
    if out:
        report = {
            "argv": sys.argv[1:],
            "identity": {k: os.environ.get(k) for k in IDENTITY},
            "env": {k: os.environ.get(k) for k in watched},
            "hostname": socket.gethostname(),
            "all_reduce": total.item(),
            "pid": os.getpid(),
        }
        with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
            json.dump(report, handle, ensure_ascii=False)
    print(f"rank {rank} of {dist.get_world_size()} ready, all_reduce={total.item()}", flush=True)
    if "--echo" in sys.argv:
        print("echo: " + " ".join(f"{k}={os.environ.get(k)}" for k in watched), flush=True)
    if os.environ.get("PROBE_FOLLOWER"):  # as another store's `launch attach` would: its run directory outlives the job
        followed = os.path.join(os.environ["LAUNCH_RUN_DIR"], os.pardir, "followed")
        os.makedirs(followed, mode=0o700, exist_ok=True)
        open(os.path.join(followed, os.environ["PROBE_FOLLOWER"]), "w").close()
    fail_at = int(os.environ.get("PROBE_FAIL_AT_STEP", "0"))
    ckpt = os.environ.get("PROBE_CKPT")
    start = _load_step(ckpt)
    if start:
        print(f"rank {rank} resumed from step {start}", flush=True)
    reporter = Reporter(every=int(os.environ.get("PROBE_EVERY", "2")), flops_per_sample=1e6)
    reporter.resume_at(start)
    step_s = float(os.environ.get("PROBE_STEP_S", "0.05"))
    for step in range(start, int(os.environ.get("PROBE_STEPS", "6"))):
        if step == fail_at and os.environ.get("PROBE_FAIL_RANK") == str(rank) and _first_failure(ckpt):
            print(f"rank {rank} failing on purpose at step {step}", flush=True)
            if os.environ.get("PROBE_OOM_CGROUP"):
                _exhaust_memory(os.environ["PROBE_OOM_CGROUP"])
            os._exit(1)
        time.sleep(step_s)
        grad = torch.ones(4)
        dist.all_reduce(grad)
        reporter.step(samples=8, tokens=8 * 16, loss=1.0 / (step + 1))
        if ckpt and rank == 0:
            with open(os.path.join(ckpt, "step.tmp"), "w") as handle:
                handle.write(str(step + 1))
            os.replace(os.path.join(ckpt, "step.tmp"), os.path.join(ckpt, "step"))
    reporter.close()
    dist.destroy_process_group()
    return 0


def _exhaust_memory(cgroup):
    """Join a memory-limited cgroup and allocate past its limit: the kernel's OOM killer ends us."""
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as handle:
        handle.write(str(os.getpid()))
    hog = [bytearray(64 * 1024 * 1024) for _ in range(64)]
    print(f"still alive with {len(hog)} blocks", flush=True)


def _load_step(ckpt):
    """The step saved in the checkpoint directory, or 0."""
    try:
        with open(os.path.join(ckpt, "step")) as handle:
            return int(handle.read())
    except (TypeError, OSError):
        return 0


def _first_failure(ckpt):
    """True the first time it is asked for a checkpoint dir (always without one)."""
    if not ckpt:
        return True
    marker = os.path.join(ckpt, "failed-once")
    if os.path.exists(marker):
        return False
    open(marker, "w").close()
    return True


if __name__ == "__main__":
    sys.exit(main())

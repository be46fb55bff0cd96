"""Every rank's Python stack on this node, taken from outside with py-spy (``py-spy dump``).

py-spy is looked for next to the job's interpreter (it is in the ``launch[train]`` extra, so it is
installed with the node side) and then on PATH. Without it, or without permission to read the
ranks' memory (ptrace: same user and kernel.yama.ptrace_scope 0 or 1 for a parent, or root, or
CAP_SYS_PTRACE in a container), each rank's entry says why there is no stack. NCCL's flight
recorder dumps (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` in the run directory) are listed too.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from . import agent, proctree

DUMP_TIMEOUT_S = 20.0
STACK_LIMIT = 64 * 1024


def py_spy() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def dump(tool: str | None, pid: int) -> tuple[str | None, str | None]:
    """(stack text, None) or (None, why there is none) for one process."""
    if tool is None:
        return None, "py-spy is not installed on this node (pip install py-spy, or the launch[train] extra)"
    try:
        done = subprocess.run([tool, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=DUMP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"py-spy did not answer within {DUMP_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return None, f"cannot run py-spy: {exc}"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return None, lines[-1][:300] if lines else f"py-spy exit {done.returncode}"
    return done.stdout[:STACK_LIMIT], None


def collect(job_id: str, run_dir: str | None, node: int | None = None) -> dict:
    """Each rank's stack (or why not) and the NCCL flight-recorder dumps in ``run_dir``."""
    tool = py_spy()
    trees = proctree.rank_trees(proctree.job_procs(job_id, node))
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(trees)))) as pool:
        dumps = list(pool.map(lambda tree: dump(tool, tree.pid), trees))
    ranks = [{"rank": tree.rank, "local_rank": tree.local_rank, "pid": tree.pid, "stack": stack, "error": error}
             for tree, (stack, error) in zip(trees, dumps)]
    run_dir = run_dir or os.path.join(agent.run_root(), job_id)
    traces = sorted(glob.glob(os.path.join(run_dir, "nccl_trace_rank_*")))
    return {"ranks": ranks, "nccl_traces": traces}


def main(argv: list[str]) -> int:
    req = json.loads(argv[0])
    print(json.dumps(collect(req["job_id"], req.get("run_dir"), req.get("node"))), flush=True)
    return 0

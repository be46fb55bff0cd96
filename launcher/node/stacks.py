"""Every rank's Python stack on this node, taken from outside with py-spy (``py-spy dump``).

py-spy is looked for next to the job's interpreter (it is in the ``launch[train]`` extra, so it is
installed with the node side) and then on PATH. Without it, or without permission to read the
ranks' memory (ptrace: same user and kernel.yama.ptrace_scope 0 or 1 for a parent, or root, or
CAP_SYS_PTRACE in a container), each rank's entry says why there is no stack. NCCL's flight
recorder dumps (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` in the run directory) are listed and sent back
as plain data (``flight``): read by an unpickler that refuses every class (a rank wrote them: they
are untrusted), bounded, their newest entries only. The node's kernel-log lines about GPUs, memory
and hung tasks (``kernel``) come with them. Standard library only: it runs on nodes.
"""

from __future__ import annotations

import glob
import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from . import facts, proctree, rundir
from .protocol import StacksRequest

DUMP_TIMEOUT_S = 20.0
STACK_LIMIT = 64 * 1024
TRACE_FILE_LIMIT = 32 * 1024 * 1024  # a flight-recorder dump larger than this is named, not read
TRACE_ENTRIES = 64  # the newest entries of each rank's dump: where the collectives stopped
TRACE_FRAMES = 8
TRACE_VALUES = 200_000  # values in one converted dump, at most (shared references are not followed twice)
KERNEL_LINES = 8
KERNEL_PROBLEM = re.compile(
    r"NVRM|\bXid\b|fallen off the bus|NVLink|Machine check|\bmce:|hung_task|blocked for more than|"
    r"Out of memory|oom-kill|segfault|NETDEV WATCHDOG|\bmlx5|Link is Down|I/O error", re.I)


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
    """Each rank's stack (or why not), the NCCL flight-recorder dumps in ``run_dir`` and the node's kernel-log
    lines about problems."""
    tool = py_spy()
    trees = proctree.rank_trees(proctree.job_procs(job_id, node))
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(trees)))) as pool:
        dumps = list(pool.map(lambda tree: dump(tool, tree.pid), trees))
    ranks = [{"rank": tree.rank, "local_rank": tree.local_rank, "pid": tree.pid, "stack": stack, "error": error}
             for tree, (stack, error) in zip(trees, dumps)]
    run_dir = run_dir or _run_dir(job_id)
    traces = sorted(glob.glob(os.path.join(run_dir, "ranks", "nccl_trace_rank_*"))) if run_dir else []  # their LAUNCH_RUN_DIR
    flight, problems = {}, []
    for path in traces:
        suffix = path.rsplit("_", 1)[-1]
        if suffix.isdigit():
            trace, problem = read_trace(path)
            if trace is not None:
                flight[suffix] = trace
            else:
                problems.append(f"{os.path.basename(path)}: {problem}")
    kernel = [line[:300] for line in facts.kernel_log() if KERNEL_PROBLEM.search(line)][-KERNEL_LINES:]
    return {"ranks": ranks, "nccl_traces": traces, "flight": flight, "flight_problems": problems, "kernel": kernel}


class _NoClasses(pickle.Unpickler):
    """Plain data only: a dump that names any class or function is refused, never run."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refused: the dump names {module}.{name}")


def read_trace(path: str) -> tuple[dict | None, str | None]:
    """(the dump as plain JSON-able data, its newest entries only, None) or (None, why not)."""
    try:
        if os.path.getsize(path) > TRACE_FILE_LIMIT:
            return None, f"larger than {TRACE_FILE_LIMIT} bytes: not read"
        with open(path, "rb") as handle:
            data = _NoClasses(io.BytesIO(handle.read())).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, RecursionError, MemoryError) as exc:
        return None, f"not readable as a flight-recorder dump: {exc}"[:300]
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        return None, "not a flight-recorder dump (no entries)"
    budget = [TRACE_VALUES]
    try:
        entries = [_trim_entry(entry, budget) for entry in data["entries"][-TRACE_ENTRIES:] if isinstance(entry, dict)]
        return {"version": str(data.get("version", "")), "pg_config": _plain(data.get("pg_config", {}), budget),
                "pg_status": _plain(data.get("pg_status", {}), budget), "entries": entries}, None
    except (ValueError, RecursionError) as exc:
        return None, f"not converted: {exc}"[:300]


def _trim_entry(entry: dict, budget: list[int]) -> dict:
    frames = entry.get("frames")
    trimmed = {**entry, "frames": frames[:TRACE_FRAMES] if isinstance(frames, list) else []}
    return _plain(trimmed, budget)


def _plain(value, budget: list[int], depth: int = 0):
    """JSON-able copy: dicts with text keys, lists for tuples, bytes as text; bounded in size and depth."""
    budget[0] -= 1
    if budget[0] < 0 or depth > 32:
        raise ValueError("the dump is too large or too deep")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, bytes):
        return value[:1000].decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(key): _plain(item, budget, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(item, budget, depth + 1) for item in value]
    return str(value)[:1000]


def _run_dir(job_id: str) -> str | None:
    """The job's run directory on this node, None without one (or one that is not safely this user's)."""
    try:
        return rundir.existing_run_dir(job_id)
    except (rundir.RunDirError, OSError):
        return None


def main(req: StacksRequest) -> int:
    print(json.dumps(collect(req.job_id, req.run_dir, req.node)), flush=True)
    return 0

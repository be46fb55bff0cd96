"""What breaks when nodes run different process counts (``nproc_per_node: auto`` on unlike nodes).

A tensor-parallel group or the inner dimension of a 2-D device mesh must lie within a node; on nodes of
2 and 1 processes a size of 2 straddles the smaller one. Settings that name such a size (the job's
env, the entrypoint's flags, a DeepSpeed config's ``tensor_parallel``) are checked against the smallest node.
"""

from __future__ import annotations

import re

from launcher.spec.job import JobSpec

_SIZE_NAME = re.compile(r"(tensor[_-]?(model[_-]?)?parallel|\btp[_-]?size|\btp\b|mesh[_-]?(shape|dim))", re.I)
_NUMBERS = re.compile(r"\d+")


def uneven_warnings(job: JobSpec, procs: list[int], ds_config: dict | None) -> list[str]:
    """Warnings for the plan when ``procs`` differ: each named size that does not fit the smallest node."""
    if len(set(procs)) < 2:
        return []
    smallest = min(procs)
    named = [(f"env {key}", value) for key, value in job.env.items() if _SIZE_NAME.search(key)]
    args = list(job.entrypoint or [])
    for index, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        if flag.startswith("-") and _SIZE_NAME.search(flag):
            named.append((f"argument {flag}", value or (args[index + 1] if index + 1 < len(args) else "")))
    autotp = ((ds_config or {}).get("tensor_parallel") or {}).get("autotp_size")
    if autotp is not None:
        named.append(("deepspeed tensor_parallel.autotp_size", str(autotp)))
    warnings = []
    for where, value in named:
        sizes = [int(n) for n in _NUMBERS.findall(value)]
        inner = sizes[-1] if sizes else None  # a mesh shape's last dimension is the one within a node
        if inner is not None and inner > 1 and smallest % inner:
            warnings.append(
                f"{where} = {value}: a tensor-parallel group or device-mesh dimension of {inner} does not fit the "
                f"smallest node ({smallest} process(es); nodes have {'+'.join(map(str, procs))}); it would span "
                "nodes or fail to form")
    return warnings

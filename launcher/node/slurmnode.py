"""A node of a Slurm job: its facts out, its plan in, then the node agent, all through the job's directory.

Slurm's step starts this on every allocated node (``srun --ntasks-per-node=1``). The job
directory lies on a filesystem the nodes and the submitting machine share. This node:

1. probes its facts (``facts.collect``) with the route to node 0: the address of the node
   that runs the batch script and srun (``SLURM_LAUNCH_NODE_IPADDR``; node 0 of the job), and
   writes them to ``node<N>.facts.json``;
2. waits for ``node<N>.run.json`` (the agent request and the secrets, written by the
   supervisor once every node's facts are in and preflight passed; read once, then removed)
   or for ``abort`` (preflight failed: the job ends without starting anything);
3. runs the node agent with its framed lines appended to ``node<N>.out``, which the
   supervisor follows.

Standard library only: it runs on nodes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

from . import agent, facts
from .protocol import RequestError, SlurmRequest, SlurmRun

POLL_S = 0.2
ABORT_FILE = "abort"
ABORTED_EXIT = 3


def write_private(path: str, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` atomically, readable by this user only."""
    partial = f"{path}.{os.getpid()}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    os.replace(partial, path)


def wait_for_run(folder: str, index: int, wait_s: float) -> SlurmRun | None:
    """This node's run request once the supervisor wrote it (the file is removed: it holds secrets);
    None if the job was aborted or nothing came within ``wait_s``."""
    path = os.path.join(folder, f"node{index}.run.json")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(folder, ABORT_FILE)):
            return None
        try:
            with open(path, encoding="utf-8") as handle:
                run = json.load(handle)
        except FileNotFoundError:
            time.sleep(POLL_S)
            continue
        os.unlink(path)
        return SlurmRun.from_json(run)
    return None


def main(argv: list[str]) -> int:
    """``slurm REQUEST_JSON`` (``protocol.SlurmRequest``; each node's facts request is by SLURM_NODEID: a container
    probe is named after its node; node 0's rendezvous port is checked free there)."""
    req = SlurmRequest.from_json(argv[0])
    folder = req.dir
    index = int(os.environ.get("SLURM_NODEID", "0"))
    master = os.environ.get("SLURM_LAUNCH_NODE_IPADDR")
    found = facts.collect(dataclasses.replace(req.facts[index], master=master, port=req.port if index == 0 else None))
    found["slurm_node"] = os.environ.get("SLURMD_NODENAME") or found["hostname"]
    found["master"] = master
    write_private(os.path.join(folder, f"node{index}.facts.json"), found)
    try:
        run = wait_for_run(folder, index, req.wait_s)
    except RequestError as exc:
        print(f"launch: node {index}: an unreadable run request: {exc}", file=sys.stderr)
        return ABORTED_EXIT
    if run is None:
        print(f"launch: node {index}: no run request (preflight failed, or the job was ended)", file=sys.stderr)
        return ABORTED_EXIT
    fd = os.open(os.path.join(folder, f"node{index}.out"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    return agent.serve(run.agent, agent.Output(fd), run.secrets)

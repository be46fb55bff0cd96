"""The agent's ``@sample`` events: each rank's process tree (CPU seconds, RSS and its peak, GPU memory and
utilisation from nvidia-smi) measured from outside every SAMPLE_S seconds.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import subprocess
import threading
import time

from . import nccl, proctree, rendezvous
from .journal import Output
from .protocol import FrameKind
from .subreaper import run_helper

SAMPLE_S = 2.0
FIRST_SAMPLE_S = 0.25


class Sampler:
    """Measures the job's ranks from outside every SAMPLE_S seconds and reports them as ``@sample``."""

    def __init__(self, job_id: str, node: int | None, out: Output, gpus: int, every: float = SAMPLE_S,
                 rendezvous_port: int | None = None, run_dir: str | None = None) -> None:
        self.job_id, self.node, self.out, self.gpus, self.every = job_id, node, out, gpus, every
        self.rendezvous_port = rendezvous_port  # node 0's: count the agents that joined while no rank exists
        self.run_dir = run_dir  # where the ranks' NCCL debug files are (GPU nodes)
        self.transport: nccl.Transport | None = None
        self.peaks: dict[int, int] = {}
        self.emptied = False  # an empty sample sent since the last ranks were found
        self.scan = proctree.JobScan(job_id, node)
        self.stop = threading.Event()

    def run(self) -> None:
        """Sample soon after the start (ranks that die young are still seen), then every ``every`` seconds."""
        wait = min(self.every, FIRST_SAMPLE_S)
        while not self.stop.wait(wait):
            self.sample()
            wait = min(self.every, wait * 2)

    def sample(self) -> None:
        trees = proctree.rank_trees(self.scan.procs())
        if not trees:
            if self.rendezvous_port:
                self.out.event(FrameKind.SAMPLE, {"t": time.time(), "ranks": [], "joined": rendezvous.joined(self.rendezvous_port)})
            elif self.peaks and not self.emptied:  # the ranks seen before have exited: said once
                self.out.event(FrameKind.SAMPLE, {"t": time.time(), "ranks": []})
                self.emptied = True
            return
        self.emptied = False
        gpu_mem, gpu_util = _gpu_usage() if self.gpus else ({}, {})
        ranks = []
        for tree in trees:
            self.peaks[tree.rank] = max(self.peaks.get(tree.rank, 0), tree.mem_bytes)
            device = _device(tree)
            ranks.append({
                "rank": tree.rank, "local_rank": tree.local_rank, "pid": tree.pid, "pids": tree.pids[:64],
                "cpu_s": round(tree.cpu_s, 3), "rss_bytes": tree.mem_bytes, "rss_peak_bytes": self.peaks[tree.rank],
                "gpu_mem_bytes": sum(gpu_mem.get(pid, 0) for pid in tree.pids) if self.gpus else None,
                "gpu_util": gpu_util.get(device) if self.gpus and device is not None else None,
            })
        self.out.event(FrameKind.SAMPLE, {"t": time.time(), "ranks": ranks})
        if self.gpus and self.run_dir:
            self.report_transport(self.run_dir)

    def report_transport(self, run_dir: str) -> None:
        """``@nccl`` with the transport NCCL chose here, once its init lines name one and again if it changes."""
        found = nccl.read_dir(run_dir)
        if found is not None and found != self.transport:
            self.transport = found
            self.out.event(FrameKind.NCCL, found.as_json())


def _device(tree: proctree.RankTree) -> int | None:
    """The GPU index a rank uses: its local rank, counted within CUDA_VISIBLE_DEVICES when that is set."""
    local = tree.local_rank or 0
    if not tree.cuda_visible:
        return tree.local_rank
    visible = [item.strip() for item in tree.cuda_visible.split(",")]
    chosen = visible[local] if local < len(visible) else visible[0]
    return int(chosen) if chosen.isdigit() else None


def _gpu_usage() -> tuple[dict[int, int], dict[int, float]]:
    """(bytes of GPU memory per PID, utilisation 0-1 per GPU index) from nvidia-smi; empty if it fails."""
    memory: dict[int, int] = {}
    util: dict[int, float] = {}
    try:
        apps = run_helper(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], 5).stdout
        devices = run_helper(["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"], 5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return memory, util
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            memory[int(parts[0])] = memory.get(int(parts[0]), 0) + int(parts[1]) * 2**20
    for line in devices.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            util[int(parts[0])] = int(parts[1]) / 100.0
    return memory, util

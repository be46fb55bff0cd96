"""The all-reduce bandwidth test that `launch check` runs as a real job across the nodes.

One process a node; gloo on CPUs, NCCL on GPUs. Reports the bus bandwidth
(2(n-1)/n x bytes / time, as nccl-tests count it) through the metrics reporter.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from launcher.metrics import Reporter

SIZE_MB = {"gloo": 16, "nccl": 256}
ITERATIONS = 5


def main() -> None:
    group = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(group)
    world = dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if group == "nccl" else torch.device("cpu")
    numel = SIZE_MB[group] * 2**20 // 4
    tensor = torch.ones(numel, dtype=torch.float32, device=device)
    dist.all_reduce(tensor)
    if group == "nccl":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(ITERATIONS):
        dist.all_reduce(tensor)
    if group == "nccl":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / ITERATIONS
    busbw = 2 * (world - 1) / world * tensor.numel() * 4 / seconds / 1e9
    reporter = Reporter(every=1, extra={"allreduce_busbw_gbps": busbw, "allreduce_mb": SIZE_MB[group]})
    reporter.step(samples=0)
    reporter.close()
    print(f"all_reduce {SIZE_MB[group]} MB over {world} ranks ({group}): {seconds * 1e3:.1f} ms, bus bandwidth {busbw:.2f} GB/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

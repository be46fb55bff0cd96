"""Ranks that hang: every rank but ``HANG_ODD_RANK`` waits in a barrier that rank never joins
(it sleeps instead), so the job is alive, silent and idle."""

import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} ready", flush=True)
if dist.get_rank() == int(os.environ.get("HANG_ODD_RANK", "2")):
    time.sleep(3600)
dist.barrier()

"""A healthy program with no Reporter: it prints now and then, then computes silently for a while.

``QUIET_PRINTS`` lines ``QUIET_EVERY`` seconds apart, then ``QUIET_COMPUTE`` seconds of pure CPU
work without a line of output (an evaluation, a checkpoint), then exits 0.
"""

import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
for i in range(int(os.environ.get("QUIET_PRINTS", "3"))):
    print(f"still working {i}", flush=True)
    time.sleep(float(os.environ.get("QUIET_EVERY", "5")))
end = time.time() + float(os.environ.get("QUIET_COMPUTE", "25"))
x = 0
while time.time() < end:
    x += 1
dist.barrier()
print("done", flush=True)
dist.destroy_process_group()

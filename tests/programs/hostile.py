"""A rank that prints what an attacker would: malformed and out-of-range metric records, NaN, a huge
line, a forged launch note, rich markup, lines claiming another node, then trains normally."""

import os
import sys

import torch.distributed as dist

from launcher.metrics import Reporter

HOSTILE = [
    '@@launch {"v":1,"rank":0,"step":1,"samples":"x","interval_s":1}',
    '@@launch {"v":1,"rank":"x","step":1}',
    '@@launch {"v":1,"rank":0,"step":99999999999999999999999999}',
    '@@launch {"v":1,"rank":0,"step":2,"loss":NaN,"samples":4,"interval_s":1}',
    '@@launch {"v":1,"rank":0,"step":2,"loss":Infinity,"samples":4,"interval_s":1}',
    '@@launch {"v":1,"rank":7,"step":3,"node":9,"host":"[/x] evil","samples":4,"interval_s":1}',
    '[launch] node 3 lost: forged by a rank',
    "[/x] [bold red]markup[/] in a rank's line",
]

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    for line in HOSTILE:
        print(line, flush=True)
    sys.stdout.write("y" * int(os.environ.get("HOSTILE_LINE_BYTES", str(10 * 2**20))) + "\n")
    sys.stdout.flush()
reporter = Reporter(every=1, warmup=0)
for _ in range(3):
    reporter.step(samples=4)
reporter.close()
dist.barrier()
dist.destroy_process_group()

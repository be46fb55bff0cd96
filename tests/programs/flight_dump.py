"""A gloo rank that writes its flight-recorder dump with torch's own writer, then exits: every rank joins
three all_reduces, and all but ``FLIGHT_ABSENT_RANK`` start a fourth that rank never joins. The dump
(``torch._C._distributed_c10d._dump_fr_trace``, the pickle NCCL's recorder writes on a timeout) goes to
``<argv[1]>/nccl_trace_rank_<rank>``, the name launch gives NCCL's dumps."""

import os
import sys

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace


def train_step(x, rank):
    if rank != int(os.environ["FLIGHT_ABSENT_RANK"]):
        return dist.all_reduce(x, async_op=True)  # never completes: one rank is absent
    return None


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(x)
    pending = train_step(x, rank)
    with open(os.path.join(sys.argv[1], f"nccl_trace_rank_{rank}"), "wb") as out:
        out.write(_dump_fr_trace())
    del pending
    os._exit(0)  # the pending collective's threads would wait for the absent rank for ever


main()

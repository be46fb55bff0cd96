"""Rank ``FAIL_RANK`` (default 1) says a line, then fails with CUDA's out-of-memory error without printing it (its
stderr closed, as a program that logs errors to a file would): its own lines do not say what it was. With ``RECORD=1`` its
main is wrapped in torch.distributed.elastic's ``@record``, which writes that file; the other ranks end at once."""

import os

import torch
from torch.distributed.elastic.multiprocessing.errors import record


def main() -> None:
    if os.environ["RANK"] == os.environ.get("FAIL_RANK", "1"):
        print("loading the data", flush=True)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


if __name__ == "__main__":
    (record(main) if os.environ.get("RECORD") == "1" else main)()

"""A rank that checkpoints when warned: it handles SIGUSR1 (what a scheduler's time-limit warning becomes)
by writing ``usr1-rank<R>.json`` into ``$USR1_OUT``, then keeps stepping until it is ended."""

import json
import os
import signal
import socket
import time

import torch.distributed as dist

from launcher.metrics import Reporter


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def warned(signum, frame) -> None:
        path = os.path.join(os.environ["USR1_OUT"], f"usr1-rank{rank}.json")
        with open(path, "w") as handle:
            json.dump({"rank": rank, "host": socket.gethostname(), "t": time.time()}, handle)
        print(f"rank {rank}: SIGUSR1: checkpoint written", flush=True)

    signal.signal(signal.SIGUSR1, warned)
    reporter = Reporter(every=1, warmup=0)
    while True:
        time.sleep(0.5)
        reporter.step(samples=1)


if __name__ == "__main__":
    main()

"""Drives the progress view as a foreground submit will: stages, log lines from several threads, a store.

Usage: python progress_driver.py JOB_ID  (LAUNCH_HOME holds the job and its metric records; the view is
live or plain as stdout decides). Exits 3 if the view's own thread never read the records.
"""

from __future__ import annotations

import sys
import threading
import time

from launcher.store.db import Store
from launcher.views.progress import open_progress

LINES_PER_THREAD = 40


def main(job_id: str) -> int:
    store = Store()
    progress = open_progress(sys.stdout, max_steps=60, nnodes=2)
    for stage in ("preflight", "sync", "start"):
        for node, host in ((0, "lt-h1"), (1, "lt-h2")):
            progress.stage(stage, node, host, "running")
        for node, host in ((0, "lt-h1"), (1, "lt-h2")):
            progress.stage(stage, node, host, "done")
    progress.attach(store, job_id)

    def relay(rank: int) -> None:
        for i in range(LINES_PER_THREAD):
            progress.log(f"{1764536400 + i}.123 [{rank // 2}/{rank}] line {i} of rank {rank}")

    threads = [threading.Thread(target=relay, args=(rank,)) for rank in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    progress.log("[0/0] [bold red]not markup[/] \x1b[32mgreen\x1b[0m \x1b[2J\x1b[Hno clear screen")
    deadline = time.monotonic() + 20
    while (progress.current is None or progress.current.step != 30) and time.monotonic() < deadline:
        time.sleep(0.05)
    read_by_thread = progress.current is not None and progress.current.step == 30
    progress.close()
    return 0 if read_by_thread else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

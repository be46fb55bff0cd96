"""A rank that holds its devices until told: appends its start and end times to $TEST_TIMES (one line each:
``start|end JOB RANK HOST CUDA_VISIBLE_DEVICES TIME``) and exits once the file $TEST_RELEASE exists."""

import os
import socket
import sys
import time

times, release = os.environ["TEST_TIMES"], os.environ.get("TEST_RELEASE", "")
who = f"{os.environ.get('LAUNCH_JOB_ID')} {os.environ.get('RANK')} {socket.gethostname()} " \
      f"{os.environ.get('CUDA_VISIBLE_DEVICES', '-')}"


def note(what: str) -> None:
    with open(times, "a") as handle:
        handle.write(f"{what} {who} {time.time():.3f}\n")


note("start")
print(f"holding: {who}", flush=True)
while release and not os.path.exists(release):
    time.sleep(0.05)
note("end")
sys.exit(0)

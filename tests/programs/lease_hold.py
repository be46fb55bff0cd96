"""A rank that holds its devices until told: appends its start and end times to $TEST_TIMES (one line each:
``start|end JOB RANK HOST CUDA_VISIBLE_DEVICES TIME``) and exits once the file $TEST_RELEASE exists; with
$TEST_REPORT, it reports a step every $TEST_STEP_S (0.1 s) meanwhile (the Reporter), as a training job holding its
GPUs would."""

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
reporter = None
if os.environ.get("TEST_REPORT"):
    from launcher.metrics import Reporter

    reporter = Reporter(every=1)
every = float(os.environ.get("TEST_STEP_S", "0.1"))
stepped = time.monotonic()
while release and not os.path.exists(release):
    time.sleep(0.05)
    if reporter and time.monotonic() - stepped >= every:
        reporter.step(samples=1)
        stepped = time.monotonic()
if reporter:
    reporter.close()
note("end")
sys.exit(0)

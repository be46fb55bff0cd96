#!/usr/bin/env python
"""`launch dashboard` at scale (issue 36's figures, docs/BENCHMARKS.md).

1. The page of a 1,000-rank job (125 nodes x 8) with 50,000 metric records: the server's answers (the page, the
   job's JSON, the first plot data) and, where Debian's chromium and Playwright are here, a headless browser's
   load of the page until its plots are drawn.
2. Following a job that prints 10,000 lines a second (two node logs, 5,000 each): the CPU the dashboard server
   uses while a client follows the stream (share of one core), and that every line arrived.

    .venv/bin/python scripts/bench_dashboard.py [--seconds 10] [--rate 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.backends import cluster_spec, plan_job  # noqa: E402
from launcher.metrics.record import MetricRecord  # noqa: E402
from launcher.spec import JobSpec  # noqa: E402
from launcher.store.db import LAUNCHING, RUNNING, Store  # noqa: E402
from launcher.store.records import Batch  # noqa: E402

RANKS, STEPS = 1000, 50


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_job(home: Path, job_id: str, nodes: int, nproc: int) -> Store:
    store = Store(home)
    spec = JobSpec(name="scale", entrypoint=["python", "t.py"], resources={"nodes": nodes, "nproc_per_node": nproc},
                   batch={"micro_batch": 4})
    store.create_job(plan_job(spec, cluster_spec(name="local"), job_id, rdzv_port=29500), {})
    assert store.transition(job_id, LAUNCHING) and store.transition(job_id, RUNNING)
    return store


def big_job(home: Path) -> str:
    job_id = "scale-00001000"
    store = make_job(home, job_id, 125, 8)
    for step in range(1, STEPS + 1):
        store.add_batch(job_id, 0, Batch(records=[
            MetricRecord(node=rank // 8, rank=rank, step=step, t=1e9 + step, steps=1, interval_s=0.5, step_time_s=0.5,
                         samples=4, samples_per_sec=8.0, loss=1.0 / step, mem_peak_bytes=2**30) for rank in range(RANKS)]))
    assert len(store.metrics(job_id)) == RANKS * STEPS
    return job_id


def serve(home: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "LAUNCH_HOME": str(home), "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-m", "launcher", "dashboard", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/jobs", timeout=2).read()
            return server
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the dashboard did not start")


def timed(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as answer:
        answer.read()
    return time.perf_counter() - start


def first_event(url: str) -> tuple[float, int]:
    """Seconds to a stream's first event, and its size."""
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as answer:
        line = answer.readline()
        while not line.startswith(b"data: "):
            line = answer.readline()
    return time.perf_counter() - start, len(line)


def browser_load(url: str, loads: int = 5) -> dict[str, float] | None:
    """Seconds from navigation until the 4 plots are drawn: the median and fastest of ``loads`` loads, each in a
    fresh page of one browser (one load alone varies by a factor of 2 on a shared machine)."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        took = []
        for _ in range(loads):
            page = browser.new_page()
            start = time.perf_counter()
            page.goto(url)
            page.wait_for_function("document.querySelectorAll('#plots canvas').length >= 4", timeout=60_000)
            took.append(time.perf_counter() - start)
            page.close()
        browser.close()
    return {"median": statistics.median(took), "fastest": min(took)}


def page_figures(home: Path) -> dict[str, object]:
    job_id = big_job(home)
    port = free_port()
    server = serve(home, port)
    base = f"http://127.0.0.1:{port}"
    try:
        timed(f"{base}/jobs/{job_id}")  # warm: the first request imports what a page needs
        page = min(timed(f"{base}/jobs/{job_id}") for _ in range(3))
        detail = min(timed(f"{base}/api/jobs/{job_id}") for _ in range(3))
        series, size = min(first_event(f"{base}/api/jobs/{job_id}/series") for _ in range(3))
        return {"page_s": page, "job_json_s": detail, "series_first_event_s": series, "series_bytes": size,
                "browser_until_plots_drawn_s": browser_load(f"{base}/jobs/{job_id}")}
    finally:
        server.terminate()
        server.wait(timeout=30)


def follow_figures(home: Path, seconds: float, rate: int) -> dict[str, float]:
    job_id = "follow-00000002"
    store = make_job(home, job_id, 2, 1)
    logs = []
    for node in (0, 1):
        path = store.run_dir(job_id) / f"attempt0-node{node}.log"
        path.write_text("")
        store.set_node(job_id, 0, node, host=f"h{node}", state="RUNNING", log_path=str(path))
        logs.append(path)
    port = free_port()
    server = serve(home, port)
    proc = psutil.Process(server.pid)
    received = [0]

    def follow() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/jobs/{job_id}/logs", timeout=seconds + 60) as answer:
            for line in answer:
                if line.startswith(b"data: ["):
                    received[0] += len(json.loads(line[6:]))
                elif line.startswith(b"event: end"):
                    return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    time.sleep(1.0)
    written, per_tick = 0, rate // 2 // 100  # each node's lines every 10 ms
    cpu0, start = proc.cpu_times(), time.perf_counter()
    outs = [path.open("a", encoding="utf-8") for path in logs]
    while time.perf_counter() - start < seconds:
        tick = time.perf_counter()
        for node, out in enumerate(outs):
            out.write("".join(f"[{node}/0] step {written + i} loss 0.123456 samples/s 8.0 lr 3e-4\n"
                              for i in range(per_tick)))
            out.flush()
        written += per_tick
        time.sleep(max(0.0, 0.01 - (time.perf_counter() - tick)))
    elapsed = time.perf_counter() - start
    deadline = time.time() + 30
    while received[0] < written * 2 and time.time() < deadline:
        time.sleep(0.2)
    cpu1 = proc.cpu_times()
    for out in outs:
        out.close()
    used = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    server.kill()  # uvicorn's graceful stop would wait for the open stream
    server.wait(timeout=30)
    return {"lines_per_s": written * 2 / elapsed, "lines_written": written * 2, "lines_received": received[0],
            "server_cpu_share_of_a_core": used / (time.perf_counter() - start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        page = page_figures(Path(tmp) / "page")
        follow = follow_figures(Path(tmp) / "follow", args.seconds, args.rate)
    print(json.dumps({"job_page_1000_ranks_50000_records": page, "follow": follow}, indent=2))


if __name__ == "__main__":
    main()

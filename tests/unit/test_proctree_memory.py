"""A rank's memory measured from outside (``node.proctree``): what its processes use (PSS), its forked workers'
shared pages counted once, a program it runs (a compiler) not counted. Real processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from launcher.node import proctree
from tests.helpers import wait_for

MB = 2**20
RANK = f"""
import os, subprocess, sys, time
data = bytearray(b"x") * (120 * {MB})  # 120 MiB written: the rank's own pages
if os.fork() == 0:  # a DataLoader-style worker: the same pages, shared copy-on-write
    time.sleep(120)
    os._exit(0)
build = 'x = bytearray(b"a") * (100 * {MB}); print("built", flush=True); import time; time.sleep(120)'
compiler = subprocess.Popen([sys.argv[1], "-c", build], stdout=subprocess.PIPE)
compiler.stdout.readline()  # a program the rank runs holds 100 MiB now
print("ready", flush=True)
time.sleep(120)
"""


def test_a_ranks_memory_is_its_processes_pss_without_a_program_it_runs(tmp_path: Path) -> None:
    compiler = shutil.copy(os.path.realpath(sys.executable), tmp_path / "cc1plus")  # another program, as exe says
    job_id = uuid.uuid4().hex[:8]
    env = {**os.environ, proctree.TAG: job_id, "RANK": "0", "LOCAL_RANK": "0"}
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(compiler)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline().strip() == "ready"
        assert wait_for(lambda: len(proctree.job_procs(job_id)) == 3, timeout=10), "the rank, its worker, the compiler"
        procs = proctree.job_procs(job_id)
        [tree] = proctree.rank_trees(procs)
        assert tree.rank == 0 and len(tree.pids) == 3, "the compiler stays in the tree: its CPU time is the rank's work"
        rss = sum(proc.rss_bytes for proc in procs)
        assert rss > 330 * MB, "RSS counts the shared 120 MiB twice, and the compiler's 100 MiB"
        assert 120 * MB <= tree.mem_bytes < 175 * MB, f"PSS of the rank and its worker: {tree.mem_bytes / MB:.0f} MiB"
    finally:
        proctree.end_job(job_id, grace=1.0)
        rank.wait(10)
    assert not proctree.job_pids(job_id)

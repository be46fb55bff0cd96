"""The sampler's scan of the process table (``proctree.JobScan``): a process found not to be the job's is not read
again until the next full scan; the job's own processes, new ones included, are found at every scan. Real processes."""

from __future__ import annotations

import os
import subprocess
import uuid

from launcher.node import proctree


def _sleeper(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], env={**os.environ, **env})


def test_a_scan_skips_what_it_found_not_the_jobs_until_its_next_full_scan() -> None:
    job_id = uuid.uuid4().hex[:8]
    tagged = {proctree.TAG: job_id, proctree.NODE_TAG: "0"}
    other = _sleeper({})
    other_node = _sleeper({**tagged, proctree.NODE_TAG: "1"})
    ours = _sleeper(tagged)
    scan = proctree.JobScan(job_id, node=0, full_every=3)
    later: list[subprocess.Popen] = []
    try:
        assert [proc.pid for proc in scan.procs()] == [ours.pid]
        assert {other.pid, other_node.pid} <= scan.skip and ours.pid not in scan.skip, "the job's own are read again"
        later.append(_sleeper(tagged))  # started after the first scan: a new PID, read at once
        assert sorted(proc.pid for proc in scan.procs()) == sorted([ours.pid, later[0].pid])
        scan.skip.discard(other.pid)
        scan.skip.add(ours.pid)  # as if it had become the job's by an exec since it was looked at
        assert [proc.pid for proc in scan.procs()] == [later[0].pid], "a PID skipped is not read between full scans"
        assert other.pid in scan.skip, "one looked at again and found not the job's is skipped again"
        assert sorted(proc.pid for proc in scan.procs()) == sorted([ours.pid, later[0].pid]), "the full scan reads all"
    finally:
        for proc in (other, other_node, ours, *later):
            proc.kill()
            proc.wait()

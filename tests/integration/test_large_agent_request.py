"""A job whose env is larger than one argument may be (Linux: 128 KiB) still starts: the node agent's
request travels on its stdin, not on its command line (real processes, local backend)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import probe_job, run_cli, status_json

pytestmark = pytest.mark.slow

VALUE_BYTES = 50_000


def test_three_50kb_env_values_reach_every_rank(tmp_path, home):
    out = tmp_path / "out"
    out.mkdir()
    big = {f"BIG_{letter}": letter * VALUE_BYTES for letter in "ABC"}
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=1,
                    env={"PROBE_OUT": str(out), "PROBE_STEPS": "2", "PROBE_ENV_KEYS": ",".join(big), **big})

    result = run_cli(home, "submit", str(job))

    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    assert "Argument list too long" not in result.stderr
    seen = json.loads((out / "rank0.json").read_text(encoding="utf-8"))["env"]
    assert seen == big
    job_id = result.stderr.split()[1].rstrip(":")
    assert status_json(home, job_id)["state"] == "SUCCEEDED"

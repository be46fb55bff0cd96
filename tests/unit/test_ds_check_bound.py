"""DeepSpeed's config check runs beside preflight in a subprocess: a check that hangs (importing deepspeed stuck)
must not hang the submit; it ends as a preflight problem that says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launcher.backends import get_backend
from launcher.errors import PreflightError
from launcher.run import orchestrate
from tests.helpers import write_yaml

# A deepspeed found first on the path whose import never returns, in the check's process only (its marker file
# tells the test the check started; the facts probe reads deepspeed's version from its metadata, not by import).
HANGING = """import os, sys, time
if "dsconfig" in sys.argv[0]:
    open(os.environ["DS_STARTED"], "w").write(str(os.getpid()))
    time.sleep(3600)
"""


def test_a_hanging_deepspeed_check_ends_as_a_preflight_problem(tmp_path: Path, home: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "stub" / "deepspeed").mkdir(parents=True)
    (tmp_path / "stub" / "deepspeed" / "__init__.py").write_text(HANGING)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "stub"))
    monkeypatch.setenv("DS_STARTED", str(tmp_path / "started"))
    monkeypatch.setattr(orchestrate, "DS_CHECK_WAIT_S", 3.0)
    job = write_yaml(tmp_path / "job.yaml", {
        "name": "ds", "entrypoint": ["python", "train.py"], "launcher": "deepspeed",
        "batch": {"micro_batch": 2}, "resources": {"nodes": 1, "nproc_per_node": 1},
    })
    prepared = orchestrate.prepare(str(job), None)
    assert prepared.plan.ds_config is not None
    backend = get_backend(prepared.cluster)
    started = time.monotonic()
    try:
        with pytest.raises(PreflightError) as raised:
            orchestrate.preflight(prepared, backend, run_check=True, warn=None)
    finally:
        backend.close()
    assert time.monotonic() - started < 60
    assert "DeepSpeed's validation did not finish within 3 s" in raised.value.message
    assert "--skip-check" in (raised.value.hint or "")
    pid = int((tmp_path / "started").read_text())
    assert not Path(f"/proc/{pid}").exists(), "the hung check was left running"

"""Users' own programs on two namespaced SSH hosts, under torchrun and DeepSpeed's launcher.

Apart from test_user_programs.py so that only these use the test bed (tests/testbed_fixture.py): the
rest of the users' programs run on either worker of `make test`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, TORCH_EXTENSIONS_DIR, run_cli, write_yaml
from tests.testbed_fixture import needs_root

pytestmark = pytest.mark.slow
PROGRAMS = ROOT / "tests" / "programs"
PYTHON = sys.executable


def _seen(out: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


@needs_root
@pytest.mark.testbed
@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_users_programs_run_on_two_ssh_hosts(tmp_path, home, testbed, launcher):
    cluster = write_yaml(tmp_path / "cluster.yaml", {
        "name": "testbed", "backend": "ssh",
        "ssh": {"user": "root", "key_file": str(testbed.key_file), "known_hosts": str(testbed.known_hosts),
                "config_file": str(testbed.ssh_config)},
        "nodes": [{"host": h.name, "gpus": 0, "slots": 2} for h in testbed.hosts[:2]],
        "python": PYTHON, "workdir": str(tmp_path),
    })
    out = tmp_path / "out"
    out.mkdir()
    if launcher == "torchrun":
        spec = {"entrypoint": ["python", "-u", str(PROGRAMS / "user_ddp.py"), "--out", str(out), "--epochs", "2"]}
    else:
        config = tmp_path / "ds.json"
        config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                                                   "optimizer": {"type": "SGD", "params": {"lr": 0.01}}}))
        spec = {"entrypoint": ["python", "-u", str(PROGRAMS / "user_deepspeed.py"), "--out", str(out), "--steps", "2",
                               "--deepspeed", "--deepspeed_config", str(config)], "launcher": "deepspeed",
                "env": {"TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS_DIR}}
    job = write_yaml(tmp_path / "job.yaml", {"name": f"user-{launcher}", "resources": {"nodes": 2, "nproc_per_node": 1},
                                             **spec})
    result = run_cli(home, "submit", str(job), "--cluster", str(cluster), timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    seen = _seen(out)
    assert sorted(seen) == [0, 1] and {entry["host"] for entry in seen.values()} == {"lt-h1", "lt-h2"}
    assert all(entry["local_rank_arg"] == 0 for entry in seen.values()), "one rank a node: --local_rank 0 on each"

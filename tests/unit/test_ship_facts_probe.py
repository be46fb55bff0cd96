"""The facts probe a container runs ships only some node modules (Linux caps one argument at 128 KiB): it must
still run, every option it can be asked, with what it ships (a module it imports but lacks fails every container job)."""

import json
import subprocess
import sys

from launcher.node.protocol import FactsRequest
from launcher.node.ship import facts_argv


def test_the_container_facts_probe_runs_with_only_the_modules_it_ships(tmp_path):
    request = FactsRequest(modules=("json", "no_such_module_here"), workdir=str(tmp_path), run_root=True, resolve_self=True, kernel_log=True,
                           build_locks=True, extensions_dir=str(tmp_path / "ext"))
    result = subprocess.run(facts_argv(sys.executable, request), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["executable"] == sys.executable
    assert facts["missing"] == ["no_such_module_here"]
    assert facts["workdir_ok"] is True and facts["run_root_error"] is None

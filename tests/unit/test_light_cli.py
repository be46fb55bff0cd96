"""`launch --help` and `launch status` must not import torch, deepspeed or ray."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
from launcher.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "deepspeed", "ray", "transformers") if m in sys.modules)
print("HEAVY:" + ",".join(heavy))
"""


@pytest.mark.parametrize("argv", [["--help"], ["status"], ["status", "--json"], ["submit", "--help"]])
def test_control_plane_commands_stay_light(argv, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", CHECK.format(argv=argv)], capture_output=True, text=True,
        env={"LAUNCH_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, check=True,
    )
    assert result.stdout.strip().endswith("HEAVY:"), result.stdout


def test_every_command_help_shows_an_example(capsys):
    from launcher.cli import cli, main

    for name in cli.commands:
        try:
            main([name, "--help"])
        except SystemExit as exc:
            assert exc.code == 0
        assert "Example" in capsys.readouterr().out, f"`launch {name} --help` has no example"

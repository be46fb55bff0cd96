"""`launch --help` and `launch status` must not import torch, deepspeed or ray."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
from launcher.cli.main import main
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


def test_status_imports_no_other_commands_module(tmp_path):
    """Commands are imported when used: `launch status` loads neither submit's, init's nor the metrics commands'."""
    check = CHECK.replace('("torch", "deepspeed", "ray", "transformers")',
                          '("launcher.cli.submit", "launcher.cli.init", "launcher.cli.metrics", "launcher.cli.specs")')
    for argv in (["status"], ["status", "--json"]):
        result = subprocess.run(
            [sys.executable, "-c", check.format(argv=argv)], capture_output=True, text=True,
            env={"LAUNCH_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, check=True,
        )
        assert result.stdout.strip().endswith("HEAVY:"), result.stdout


def test_every_listed_command_is_imported_under_the_name_it_is_listed_by():
    """A wrong ``module:attribute`` in the command table fails here, not in a user's terminal (tests/unit/test_help.py
    runs every command's --help)."""
    import click

    from launcher.cli.main import cli

    names = cli.list_commands(click.Context(cli))
    assert {"submit", "status", "logs", "cancel", "attach", "queue", "completion"} <= set(names)
    for name in names:
        command = cli.get_command(click.Context(cli), name)
        assert command is not None and command.name == name


def test_status_of_a_running_job_reads_records_without_pydantic(tmp_path):
    """Live summaries read stored records with the standard library: pydantic (~0.1 s) stays out of `status`."""
    from launcher.metrics.record import MetricRecord, ProcessSample
    from launcher.store.db import Store
    from launcher.store.records import Batch

    store = Store(tmp_path)
    store._execute("INSERT INTO jobs (id, name, state, created_at, attempt) VALUES ('live-1', 'live', 'RUNNING', 1.0, 0)")
    store.add_batch("live-1", 0, Batch(records=[MetricRecord(rank=0, node=0, host="h", step=10, samples=8, interval_s=1.0)]))
    store.add_batch("live-1", 0, Batch(samples=[ProcessSample(node=0, rank=1, t=1.0, pid=9, cpu_s=1.0, rss_bytes=5, rss_peak_bytes=5)]))
    store.close()
    check = CHECK.replace('("torch", ', '("pydantic", "torch", ')
    for argv in (["status"], ["status", "--json"], ["status", "live-1"], ["status", "live-1", "--json"]):
        result = subprocess.run(
            [sys.executable, "-c", check.format(argv=argv)], capture_output=True, text=True,
            env={"LAUNCH_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, check=True,
        )
        assert "live-1" in result.stdout and result.stdout.strip().endswith("HEAVY:"), result.stdout

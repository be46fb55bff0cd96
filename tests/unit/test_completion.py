"""Shell completion: the scripts for bash, zsh and fish, and job ids completed from the store."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys

import click
import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.spec import JobSpec
from launcher.store.db import Store
from tests.helpers import ROOT, cli_env, run_cli

IDS = ("cifar-00000001", "cifar-00000002", "bert-00000003")  # made in this order: newest last
JOB_COMMANDS = ("status", "logs", "cancel", "metrics", "compare", "report")


@pytest.fixture
def jobs(home):
    store = Store(home)
    for job_id in IDS:
        job = JobSpec(name=job_id.split("-")[0], entrypoint=["python", "t.py"], batch={"micro_batch": 2})
        store.create_job(plan_job(job, cluster_spec(name="local"), job_id, rdzv_port=29500), {})
    store.close()
    with sqlite3.connect(store.path) as db:  # distinct creation times, one second apart: newest first is IDS reversed
        db.executemany("UPDATE jobs SET created_at = ? WHERE id = ?", [(1000.0 + n, i) for n, i in enumerate(IDS)])
    db.close()
    return home


@pytest.fixture
def launch_on_path(tmp_path):
    """A `launch` executable on PATH, as an installed console script is (the shells' scripts call it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launch = bin_dir / "launch"
    launch.write_text(f'#!/bin/sh\nexec {sys.executable} -m launcher "$@"\n')
    launch.chmod(0o755)
    return bin_dir


def complete(home, shell: str, words: str) -> list[str]:
    """What `launch` answers a shell asking for completions of ``words`` (the last word is the incomplete one)."""
    parts = words.split(" ")
    cword = parts[-1] if shell == "fish" else str(len(parts) - 1)  # fish passes the incomplete word itself
    env = cli_env(home, _LAUNCH_COMPLETE=f"{shell}_complete", COMP_WORDS=words, COMP_CWORD=cword)
    result = subprocess.run([sys.executable, "-m", "launcher"], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line]


@pytest.mark.parametrize(("shell", "marks"), [
    ("bash", ["_LAUNCH_COMPLETE=bash_complete", "complete -o nosort -F _launch_completion launch"]),
    ("zsh", ["#compdef launch", "_LAUNCH_COMPLETE=zsh_complete", "compdef _launch_completion launch"]),
    ("fish", ["_LAUNCH_COMPLETE=fish_complete", 'complete --no-files --command launch']),
])
def test_completion_prints_each_shells_script(home, shell, marks):
    result = run_cli(home, "completion", shell)
    assert result.returncode == 0, result.stderr
    for mark in marks:
        assert mark in result.stdout
    bad = run_cli(home, "completion", "tcsh")
    assert bad.returncode == 2 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in bad.stderr


def test_every_job_argument_completes_job_ids():
    from launcher.cli.completion import JOB_ID
    from launcher.cli.main import cli

    ctx = click.Context(cli)
    commands = {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}
    completing = {name for name, command in commands.items() if any(p.type is JOB_ID for p in command.params)}
    assert completing >= set(JOB_COMMANDS)
    for name, command in commands.items():
        for param in command.params:
            if isinstance(param, click.Argument) and param.name in ("job", "jobs"):
                assert param.type is JOB_ID, f"`launch {name}` {param.name.upper()} does not complete job ids"


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_a_job_id_prefix_completes_to_the_matching_ids_newest_first(jobs, command):
    assert complete(jobs, "bash", f"launch {command} cif") == ["plain,cifar-00000002", "plain,cifar-00000001"]
    assert complete(jobs, "bash", f"launch {command} ") == [f"plain,{i}" for i in reversed(IDS)]
    assert complete(jobs, "bash", f"launch {command} zzz") == []


def test_completion_carries_the_state_for_zsh_and_fish(jobs):
    assert complete(jobs, "zsh", "launch logs bert") == ["plain", "bert-00000003", "PENDING"]
    assert complete(jobs, "fish", "launch logs bert") == ["plain,bert-00000003\tPENDING"]
    assert complete(jobs, "bash", "launch compare cifar-00000001 cifar-00000002 b") == ["plain,bert-00000003"]


def test_completion_without_a_store_offers_nothing_and_creates_nothing(tmp_path):
    home = tmp_path / "no-store"
    assert complete(home, "bash", "launch logs c") == []
    assert not home.exists()


def test_bash_completes_job_ids_through_the_sourced_script(jobs, launch_on_path):
    script = (
        'eval "$(launch completion bash)"\n'
        "complete -p launch\n"
        "COMP_WORDS=(launch status cifar-0); COMP_CWORD=2; _launch_completion launch\n"
        'printf "reply:%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = cli_env(jobs, PATH=f"{launch_on_path}:/usr/bin:/bin")
    result = subprocess.run(["bash", "--norc", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["complete -o nosort -F _launch_completion launch",
                                          "reply:cifar-00000002", "reply:cifar-00000001"]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed here (bash is; the protocol is tested for fish above)")
def test_fish_completes_job_ids_through_the_sourced_script(jobs, launch_on_path):
    env = cli_env(jobs, PATH=f"{launch_on_path}:/usr/bin:/bin")
    result = subprocess.run(["fish", "--no-config", "-c", 'launch completion fish | source; complete -C "launch logs cif"'],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["cifar-00000001\tPENDING", "cifar-00000002\tPENDING"]  # fish sorts


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed here (bash is; the protocol is tested for zsh above)")
def test_zsh_completion_function_offers_job_ids(jobs, launch_on_path):
    # zsh's completion system needs a terminal; the script's function runs with its builtins recorded instead.
    script = (
        "compdef() { print -r -- \"compdef $*\" }\n"
        "_describe() { print -rl -- \"described:${(@P)3}\" }\n"
        "compadd() { print -rl -- \"added:$*\" }\n"
        'eval "$(launch completion zsh)"\n'
        "words=(launch logs cif); CURRENT=3; _launch_completion\n"
    )
    env = cli_env(jobs, PATH=f"{launch_on_path}:/usr/bin:/bin")
    result = subprocess.run(["zsh", "-f", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["compdef _launch_completion launch",
                                          "described:cifar-00000002:PENDING", "cifar-00000001:PENDING"]


def test_completing_imports_nothing_heavy(jobs):
    check = (
        "import sys\n"
        "from launcher.cli.main import main\n"
        "try:\n    main([])\nexcept SystemExit:\n    pass\n"
        "print('LOADED:' + ','.join(m for m in ('torch', 'deepspeed', 'ray', 'rich', 'pydantic', 'yaml') if m in sys.modules))\n"
    )
    env = cli_env(jobs, _LAUNCH_COMPLETE="bash_complete", COMP_WORDS="launch logs cif", COMP_CWORD="2")
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, cwd=ROOT, timeout=30)
    assert result.stdout.splitlines() == ["plain,cifar-00000002", "plain,cifar-00000001", "LOADED:"], result.stderr

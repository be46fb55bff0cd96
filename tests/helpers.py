"""Shared helpers for tests that drive the real `launch` CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "programs" / "rank_probe.py"
# Strings a shell would mangle: every backend must deliver them to the ranks verbatim.
HOSTILE = ["semi;colon", "$(touch /tmp/pwned)", "it's", 'say "hi"', "two words", "line\nbreak", "naïve ☃ 漢字"]
# DeepSpeed builds its CPU ops on first use (about a minute): one cache for the whole suite.
TORCH_EXTENSIONS_DIR = os.environ.get("TORCH_EXTENSIONS_DIR", "/tmp/launch-torch-ext")


# The DeepSpeed ops the suite's CPU ranks load: the shared-memory comm op (every DeepSpeed rank) and
# cpu_adam (zero3_offload's DeepSpeedCPUAdam).
DEEPSPEED_OPS = {"comm": "from deepspeed.comm.torch import build_shm_op; build_shm_op()",
                 "cpu_adam": "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"}


def build_deepspeed_ops(*names: str) -> None:
    """Build DeepSpeed's CPU ops ``names`` (keys of DEEPSPEED_OPS) into TORCH_EXTENSIONS_DIR now, once, on this host.

    Every DeepSpeed rank on CPU loads the comm op at start; in a fresh clone the first job builds it, and two
    containers on two hosts building into the one shared cache at once can leave one of them without the
    library (torch's build lock does not reach across their mount namespaces reliably)."""
    Path(TORCH_EXTENSIONS_DIR).mkdir(parents=True, exist_ok=True)
    for name in names:
        subprocess.run([sys.executable, "-c", DEEPSPEED_OPS[name]],
                       env={**os.environ, "TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS_DIR},
                       check=True, capture_output=True, timeout=600)


def build_deepspeed_ops_before_the_suite() -> None:
    """`make ops`: every op the suite loads, built before any test runs. torch's build lock is a file that a
    killed build leaves behind (an interrupted `make test`), and every later load then waits on it for ever
    (pytorch/pytorch#189245): nothing else uses this cache yet, so such a file is stale and is removed first."""
    for stale in Path(TORCH_EXTENSIONS_DIR).glob("**/lock"):
        stale.unlink(missing_ok=True)
    build_deepspeed_ops(*DEEPSPEED_OPS)


HOLD = ROOT / "tests" / "programs" / "hold"


def hold_env(folder: Path, at_step: int) -> dict[str, str]:
    """A job's ``env:`` that holds each recipe rank of attempt 0 right after it reports ``at_step``, until the
    rank is ended (tests/programs/hold): the test then acts at a known step, however fast the machine trains."""
    folder.mkdir(parents=True, exist_ok=True)
    return {"PYTHONPATH": str(HOLD), "TEST_HOLD_AT_STEP": str(at_step), "TEST_HOLD_DIR": str(folder)}


def all_held(folder: Path, ranks: int) -> bool:
    """Every one of ``ranks`` ranks is held by ``hold_env``'s hook."""
    return all((folder / f"rank{rank}").exists() for rank in range(ranks))


def launch_argv(*args: str) -> list[str]:
    """Argv of the `launch` CLI in this interpreter."""
    return [sys.executable, "-m", "launcher", *args]


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "LAUNCH_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.update(extra)
    return env


def run_cli(home: Path, *args: str, timeout: float = 120, env: dict | None = None, cwd: Path | None = None):
    """Run `launch ARGS` to completion with LAUNCH_HOME=home. Past ``timeout`` it is cancelled as a user would
    (SIGTERM: the supervisor ends its job), then killed, and TimeoutExpired raised: a supervisor killed outright
    would leave its job to the node agents' unattended timeout, running on after the test."""
    proc = subprocess.Popen(launch_argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or cli_env(home), cwd=cwd or ROOT, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as exc:  # the timeout, or pytest-timeout's Failed raised in the middle of the wait
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def probe_job(path: Path, name: str = "probe", nodes: int = 1, nproc: int = 2, args: list[str] | None = None,
              env: dict | None = None, **extra) -> Path:
    """A job spec that runs tests/programs/rank_probe.py."""
    job = {
        "name": name,
        "entrypoint": ["python", str(PROBE), *(args or [])],
        "batch": {"micro_batch": 8},
        "resources": {"nodes": nodes, "nproc_per_node": nproc},
        "env": env or {},
        **extra,
    }
    return write_yaml(path, job)


def cli_json(home: Path | None, *args: str) -> Any:
    """The JSON that `launch ARGS` prints, with LAUNCH_HOME=home (None: this process's), the CLI's own command run in
    this process through click's test runner. Tests poll it while their jobs run: a `launch` process a poll took
    about half a second of the two cores those jobs needed (the CLI as a process is tested in test_cli*.py)."""
    from click.testing import CliRunner

    from launcher.cli.main import cli

    env = {"LAUNCH_HOME": str(home)} if home is not None else {}
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def status_json(home: Path | None, job_id: str) -> dict:
    """`launch status JOB --json`, in this process (``cli_json``)."""
    return cli_json(home, "status", job_id, "--json")


def rank_results(home: Path, job_id: str, attempt: str = "*") -> list[dict]:
    """The ``RESULT {json}`` lines the test programs' ranks printed into the job's node logs, by rank."""
    text = "".join(p.read_text() for p in sorted((home / "runs" / job_id).glob(f"attempt{attempt}-node*.log")))
    return sorted((json.loads(m) for m in re.findall(r"RESULT (\{.*\})", text)), key=lambda r: r["rank"])


def wait_for_state(home: Path, job_id: str, states: tuple[str, ...], timeout: float = 60) -> dict:
    """Poll status until the job is in one of ``states``."""
    deadline = time.monotonic() + timeout
    while True:
        obj = status_json(home, job_id)
        if obj["state"] in states or time.monotonic() > deadline:
            return obj
        time.sleep(0.3)


def wait_for(predicate, timeout: float = 60, interval: float = 0.2):
    """Poll ``predicate`` until it returns something truthy; that value, or None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def kill_supervisor_and_keeper(pid: int) -> None:
    """SIGKILL a detached supervisor and the keeper above it, as a crash of the submitting machine would
    (the supervisor alone is replaced by its keeper: launcher/run/detached.py)."""
    parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    if b"launcher.run.detached" in Path(f"/proc/{parent}/cmdline").read_bytes():
        os.kill(parent, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


def output_texts(lines) -> list[str]:
    """The text of the output lines among a node agent's framed lines (str or bytes; ``launcher.node.protocol``)."""
    from launcher.node.protocol import OutputLine, parse

    return [parsed.text for parsed in map(parse, lines) if isinstance(parsed, OutputLine)]


def frames(lines, kind: str) -> list[dict]:
    """The data of the frames of ``kind`` (``FrameKind`` value: exit, sample...) among framed lines, in order."""
    from launcher.node.protocol import Frame, parse

    return [parsed.data for parsed in map(parse, lines) if isinstance(parsed, Frame) and parsed.kind.value == kind]


def kind_of_line(line) -> str | None:
    """``output``, ``exit``... for one framed line (None: unframed or unknown)."""
    from launcher.node.protocol import kind_of

    kind = kind_of(line if isinstance(line, bytes) else line.encode())
    return kind.value if kind is not None else None


def frame_data(line) -> dict:
    """The data of one framed line that must be a frame (AssertionError otherwise)."""
    from launcher.node.protocol import Frame, parse

    parsed = parse(line.rstrip("\n") if isinstance(line, str) else line.rstrip(b"\n"))
    assert isinstance(parsed, Frame), f"not a frame: {line!r}"
    return parsed.data

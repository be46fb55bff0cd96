"""The compute processes on each GPU, as nvidia-smi lists them (a GPU in use by a process launch did not start
counts as busy: ``launcher.node.leases``). Standard library only: it runs on nodes."""

from __future__ import annotations

import subprocess

NVIDIA_SMI_S = 10.0


def compute_apps() -> dict[int, list[tuple[int, str]]]:
    """Per GPU index, (pid, process name) of each compute process ({} without nvidia-smi)."""
    return parse_compute_apps(_smi(["--query-gpu=index,uuid"]), _smi(["--query-compute-apps=pid,gpu_uuid,process_name"]))


def _smi(query: list[str]) -> str:
    try:
        done = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=NVIDIA_SMI_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def parse_compute_apps(gpus: str, apps: str) -> dict[int, list[tuple[int, str]]]:
    """nvidia-smi's ``index,uuid`` and ``pid,gpu_uuid,process_name`` CSV as (pid, process name) per GPU index."""
    index_of = {}
    for line in gpus.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            index_of[parts[1]] = int(parts[0])
    found: dict[int, list[tuple[int, str]]] = {}
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) == 3 and parts[0].isdigit() and parts[1] in index_of:
            found.setdefault(index_of[parts[1]], []).append((int(parts[0]), parts[2][:120]))
    return found

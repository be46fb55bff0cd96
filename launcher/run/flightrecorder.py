"""PyTorch's own analysis of the NCCL flight recorder's dumps, folded into a hang's verdict.

The nodes send each rank's dump back as plain data (``launcher.node.stacks.read_trace``: the newest
entries, no classes). Here they are given to ``torch.distributed.flight_recorder``'s builder, the
code behind ``fr_trace``, which matches every rank's entries into collectives and says which ranks did
not join which collective. torch is imported only here, and only when there are dumps: `launch
status` and `launch --help` never import it. Where torch is not installed beside launch, or its
analysis fails, the dumps are compared here the simple way (each group's last collective sequence
number per rank) and the verdict says which analysis it shows.

gloo's recorder (torch 2.13) files its default group in ``pg_config`` under an empty name; it is filed
under the name its entries use before the analysis, when that is unambiguous.
"""

from __future__ import annotations

import argparse
import copy
import logging
from collections.abc import Mapping
from typing import Any

SHOWN = 5  # collectives with missing ranks kept in the verdict


def analyse(dumps: Mapping[int, dict], world_size: int | None = None) -> dict[str, Any]:
    """``{"by", "ranks", "collectives": [{"seq", "name", "group", "missing", "joined", "state", "where"}],
    "problem"}`` from each rank's dump (``rank -> dump``)."""
    ranks = sorted(dumps)
    out: dict[str, Any] = {"ranks": ranks, "world_size": world_size, "collectives": [], "problem": None}
    try:
        out["collectives"] = _torch(dumps)
        out["by"] = "torch.distributed.flight_recorder (fr_trace)"
    except ImportError:
        out["by"] = "launch (torch is not installed beside launch: the last collective of each rank compared)"
        out["collectives"] = _simple(dumps)
    except Exception as exc:  # noqa: BLE001 - torch's analysis of dumps ranks wrote may fail in any way
        out["by"] = "launch (the last collective of each rank compared)"
        out["problem"] = f"torch's analysis failed: {type(exc).__name__}: {exc}"[:300]
        out["collectives"] = _simple(dumps)
    return out


def _details(dumps: Mapping[int, dict]) -> dict[str, dict[str, Any]]:
    details = {}
    for rank, dump in dumps.items():
        entries = copy.deepcopy(list(dump.get("entries") or []))
        for entry in entries:
            if isinstance(entry.get("process_group"), list):
                entry["process_group"] = tuple(entry["process_group"])
        details[f"nccl_trace_rank_{rank}"] = {"host_name": f"host_rank{rank}", "rank": int(rank), "entries": entries,
                                              "version": str(dump.get("version", "")),
                                              "pg_config": _named(dict(dump.get("pg_config") or {}), entries)}
    return details


def _named(pg_config: dict[str, Any], entries: list[dict]) -> dict[str, Any]:
    """gloo's dumps file the group under an empty name: file it under the one name its entries use."""
    groups = {tuple(e["process_group"]) for e in entries if isinstance(e.get("process_group"), tuple)}
    if "" in pg_config and len(pg_config) == 1 and len(groups) == 1:
        (name, desc), = groups
        return {name: {**pg_config[""], "name": name, "desc": desc}}
    return pg_config


def _torch(dumps: Mapping[int, dict]) -> list[dict[str, Any]]:
    said = logging.getLogger("Flight Recorder")  # its findings are read from the result, not its log
    was = said.disabled
    said.disabled = True
    try:
        from torch.distributed.flight_recorder.components.builder import build_db

        details = _details(dumps)
        version = next(iter(details.values()))["version"] if details else ""
        args = argparse.Namespace(verbose=False, just_print_entries=False, allow_incomplete_ranks=True, mismatch_cap=10)
        db = build_db(details, args, version)
    finally:
        said.disabled = was
    found = []
    for collective in db.collectives:
        missing = sorted(collective.missing_ranks or ())
        if not missing and collective.pass_check:
            continue
        expected = sorted(collective.expected_ranks or ())
        found.append({"seq": collective.collective_seq_id, "name": collective.collective_name,
                      "group": collective.pg_desc, "missing": missing,
                      "joined": [r for r in expected if r not in missing], "state": collective.collective_state,
                      "where": _where(collective.collective_frames),
                      "mismatch": None if collective.type_of_mismatch is None else str(collective.type_of_mismatch)})
    return found[:SHOWN]


def _where(frames: Any) -> str | None:
    """The innermost frame of the program (not torch's) that called the collective."""
    for frame in frames or []:
        if not isinstance(frame, dict):
            continue
        path = str(frame.get("filename", ""))
        if "site-packages/" in path or "dist-packages/" in path or "/torch/" in path or path.startswith("<"):
            continue
        return f"{frame.get('name')} {path.rsplit('/', 1)[-1]}:{frame.get('line')}"
    return None


def _simple(dumps: Mapping[int, dict]) -> list[dict[str, Any]]:
    """Without torch: in each group, the ranks whose last collective is behind the others' last one."""
    last: dict[str, dict[int, tuple[int, dict]]] = {}
    for rank, dump in dumps.items():
        for entry in dump.get("entries") or []:
            group = entry.get("process_group")
            seq = entry.get("collective_seq_id")
            if entry.get("is_p2p") or not isinstance(group, (list, tuple)) or not isinstance(seq, int):
                continue
            name = ":".join(str(part) for part in group)
            if seq >= last.setdefault(name, {}).get(int(rank), (-1, {}))[0]:
                last[name][int(rank)] = (seq, entry)
    found = []
    for group, by_rank in last.items():
        newest = max(seq for seq, _ in by_rank.values())
        behind = sorted(rank for rank, (seq, _) in by_rank.items() if seq < newest)
        if behind:
            entry = next(entry for seq, entry in by_rank.values() if seq == newest)
            found.append({"seq": newest, "name": entry.get("profiling_name"), "group": group, "missing": behind,
                          "joined": sorted(r for r in by_rank if r not in behind), "state": entry.get("state"),
                          "where": _where(entry.get("frames")), "mismatch": None})
    return found[:SHOWN]

"""The node side's commands: ``facts``, ``agent``, ``follow``, ``fence``, ``record``, ``slurm``, ``list``, ``end``, ``signal``, ``stacks``,
``leases``, ``wait``, ``lease-setup``
(see ``launcher.node.ship``)."""

from __future__ import annotations

import json
import sys

REQUEST_ON_STDIN = "-"  # in place of the request: it is the first line of stdin (too big for one argument)


def main(argv: list[str]) -> int:
    """Run the node command ``argv[0]`` with its request; a request this node side cannot read exits 2, saying why."""
    command, rest = argv[0], argv[1:]
    if rest[:1] == [REQUEST_ON_STDIN]:
        rest = [sys.stdin.readline(), *rest[1:]]
        if not rest[0]:
            return 0  # started ahead of its request (the local backend's warm agent) and not needed after all
    if command == "facts":  # the probe every submit waits for: it compiles no more modules than it reads
        from . import facts

        req = facts.main(rest[0])
        if req is None:
            return 2
        return 0 if req.agent_within_s is None else _become_agent(req.agent_within_s)
    from . import protocol

    try:
        return _run(command, rest)
    except protocol.RequestError as exc:
        print(f"launch node side: {command}: {exc}", file=sys.stderr, flush=True)
        return 2


def _become_agent(within: float) -> int:
    """Preflight's probe, kept: wait ``within`` seconds for an agent request (the first line of stdin; the agent reads
    the rest) and run it in the job's workdir; none (stdin closed, the time passed): exit 0, having started nothing."""
    import select

    if not select.select([sys.stdin], [], [], within)[0]:
        return 0
    line = sys.stdin.readline()
    if not line:
        return 0
    from . import agent

    return agent.main([line], enter_cwd=True)


def _run(command: str, rest: list[str]) -> int:
    from . import protocol

    if command == "agent":
        from . import agent

        return agent.main(rest)
    if command == "slurm":
        from . import slurmnode

        return slurmnode.main(rest)
    if command in ("follow", "fence", "record", "clean"):
        from . import follow

        if command == "clean":
            return follow.clean(protocol.CleanRequest.from_json(rest[0]))
        if command == "follow":
            return follow.follow(protocol.FollowRequest.from_json(rest[0]))
        if command == "fence":
            return follow.fence(protocol.FenceRequest.from_json(rest[0]))
        return follow.record(protocol.RecordRequest.from_json(rest[0]))
    if command in ("leases", "wait", "lease-setup"):
        from . import waiting

        lease = protocol.LeaseRequest.from_json(rest[0])
        if command == "lease-setup":
            return waiting.set_up(lease)
        return waiting.probe(lease) if command == "leases" else waiting.wait(lease)
    if command == "stacks":
        from . import stacks

        return stacks.main(protocol.StacksRequest.from_json(rest[0]))
    if command in ("list", "end", "signal"):
        return _fenced_command(command, rest[0])
    print(f"launch node side: unknown command {command!r}", file=sys.stderr)
    return 2


def _fenced_command(command: str, text: str) -> int:
    """``list``, ``end`` and ``signal``: refused (``{"fenced": record}``) to a supervisor a newer one replaced."""
    from . import follow, proctree, protocol

    req = protocol.SignalRequest.from_json(text) if command == "signal" else protocol.SweepRequest.from_json(text)
    newer = follow.fenced_request(req)
    if newer is not None:  # a newer supervisor is in charge: the older one's signals and sweeps are refused
        print(json.dumps({"fenced": newer}), flush=True)
    elif isinstance(req, protocol.SignalRequest):
        sent = proctree.signal_if(req.pid, req.start_ticks, req.signal)
        print(json.dumps({"sent": sent}), flush=True)
    else:
        from . import subreaper

        failed = subreaper.run_cleanup([list(c) for c in req.cleanup], req.grace) if command == "end" else []
        pids = proctree.job_pids(req.job_id) if command == "list" else proctree.end_job(req.job_id, req.grace)
        print(json.dumps({"pids": pids, "cleanup_failed": failed}), flush=True)
    return 0

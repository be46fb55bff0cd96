"""The node side's commands: ``facts``, ``agent``, ``follow``, ``fence``, ``record``, ``slurm``, ``list``, ``end``, ``signal``, ``stacks``,
``leases``, ``wait``
(see ``launcher.node.ship``)."""

from __future__ import annotations

import json
import sys

REQUEST_ON_STDIN = "-"  # in place of the request: it is the first line of stdin (too big for one argument)


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    if rest[:1] == [REQUEST_ON_STDIN]:
        rest = [sys.stdin.readline(), *rest[1:]]
        if not rest[0]:
            return 0  # started ahead of its request (the local backend's warm agent) and not needed after all
    if command == "facts":
        from . import facts

        return facts.main(rest)
    if command == "agent":
        from . import agent

        return agent.main(rest)
    if command == "slurm":
        from . import slurmnode

        return slurmnode.main(rest)
    if command in ("follow", "fence", "record"):
        from . import follow

        request = json.loads(rest[0])
        return {"follow": follow.follow, "fence": follow.fence, "record": follow.record}[command](request)
    if command in ("leases", "wait"):
        from . import waiting

        request = json.loads(rest[0])
        return waiting.probe(request) if command == "leases" else waiting.wait(request)
    if command == "stacks":
        from . import stacks

        return stacks.main(rest)
    if command in ("list", "end", "signal"):
        from . import follow

        req = json.loads(rest[0])
        newer = follow.fenced_request(req)
        if newer is not None:  # a newer supervisor is in charge: the older one's signals and sweeps are refused
            print(json.dumps({"fenced": newer}), flush=True)
            return 0
    if command in ("list", "end"):
        from . import proctree, subreaper

        failed = subreaper.run_cleanup(req.get("cleanup", []), req["grace"]) if command == "end" else []
        pids = proctree.job_pids(req["job_id"]) if command == "list" else proctree.end_job(req["job_id"], req["grace"])
        print(json.dumps({"pids": pids, "cleanup_failed": failed}), flush=True)
        return 0
    if command == "signal":
        from . import proctree

        sent = proctree.signal_if(req["pid"], req["start_ticks"], req["signal"])
        print(json.dumps({"sent": sent}), flush=True)
        return 0
    print(f"launch node side: unknown command {command!r}", file=sys.stderr)
    return 2

"""torchrun's exit-barrier trace of a node whose ranks all exited 0 is left off the console (kept in the log)."""

from __future__ import annotations

import queue
from pathlib import Path

from launcher.backends.base import NodeHandle
from launcher.backends.follow import Followed
from launcher.node.protocol import encode_output
from launcher.run.watcher import ExitBarrierTrace, NodeWatcher, Relay

# As torchrun 2.x logs it on node 1 when node 0's agent (the store's host) ended first, after a job that succeeded.
TRACE = """\
[I1204 05:08:20.101000 2276 torch/distributed/elastic/agent/server/api.py:986] Local worker group finished (WorkerState.SUCCEEDED). Waiting 300 seconds for other agents to finish
[E1204 05:08:20.639000 2276 torch/distributed/elastic/agent/server/api.py:1008] Error waiting on exit barrier. Elapsed: 0.5370 seconds
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 994, in _exit_barrier
    store_util.barrier(
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/utils/store.py", line 190, in barrier
    synchronize(store, data, rank, world_size, key_prefix, barrier_timeout)
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/utils/store.py", line 73, in synchronize
    agent_data = get_all(store, rank, key_prefix, world_size)
                 ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/utils/store.py", line 41, in get_all
    data = store.get(f"{prefix}{idx}")
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^
torch.distributed.DistNetworkError: failed to recv, got 0 bytes
"""
AFTER = "[I1204 05:08:20.700000 2276 torch/distributed/elastic/agent/server/api.py:1002] Done waiting"


def test_the_exit_barrier_trace_is_quiet_and_nothing_else_is() -> None:
    barrier = ExitBarrierTrace()
    lines = TRACE.splitlines()
    quiet = [barrier.quiet(line) for line in lines]
    assert quiet == [False] + [True] * (len(lines) - 1)  # the barrier's own line and every line of its trace
    assert not barrier.quiet(AFTER) and not barrier.quiet("Traceback (most recent call last):")  # a new trace: shown
    assert not barrier.quiet("ValueError: a rank's own error, reported as usual")


class _Node1(NodeHandle):
    """Node 1's stream as its agent sends it: ``lines`` of output, then its exit 0."""

    index, pid = 1, 4343

    def __init__(self, lines: list[str]) -> None:
        self.followed = Followed("h2")
        self.source = [encode_output(line).decode() for line in lines] + ['@exit {"code": 0}']

    def lines(self):
        yield from self.followed.through(iter(self.source))

    def poll(self):
        return self.followed.code()

    def terminate(self, grace: float) -> None:
        pass


def test_a_watcher_shows_one_line_for_the_trace_and_keeps_it_whole_in_the_nodes_log(tmp_path: Path) -> None:
    echoed: list[str] = []
    relay = Relay(world_size=2, secrets={}, echo=echoed.append, note=lambda text: None,
                  sequence=iter(range(10**6)).__next__, handed=queue.SimpleQueue())
    lines = ["[1]: rank 1 done", *TRACE.splitlines(), AFTER]
    watcher = NodeWatcher(_Node1(lines), "h2", tmp_path / "n1.log", relay)
    watcher.join(10)
    assert echoed[0] == "[1/1] rank 1 done" and echoed[-1] == f"[1] {AFTER}"
    assert echoed[2].startswith("[1] torchrun's exit barrier failed after every rank of this node exited 0")
    assert len(echoed) == 4 and not any("DistNetworkError" in line or "Traceback" in line for line in echoed)
    logged = (tmp_path / "n1.log").read_text()
    assert "Traceback (most recent call last):" in logged and "DistNetworkError: failed to recv" in logged

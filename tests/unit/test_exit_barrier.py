"""torchrun's exit-barrier trace of a node whose ranks all exited 0 is left off the console (kept in the log)."""

from __future__ import annotations

from launcher.run.watcher import ExitBarrierTrace

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

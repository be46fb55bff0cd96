"""A job stuck before its first rank says how many torchrun agents reached node 0's rendezvous store: node 0's
agent counts the connections to the rendezvous port from outside and reports them in its samples."""

from __future__ import annotations

import queue
import shutil
import socket
import sys
from pathlib import Path

from launcher.backends.base import NodeHandle
from launcher.backends.follow import Followed
from launcher.node import rendezvous, rundir
from launcher.run.liveness import Joined
from launcher.run.watcher import NodeWatcher, Relay
from tests.helpers import frames
from tests.unit.test_node_agent import _run_agent


def _connected(count: int):
    """A listening socket on loopback and ``count`` clients connected to it (not yet accepted)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    return server, port, [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]


def test_the_connections_to_the_port_are_counted_and_no_others() -> None:
    server, port, clients = _connected(3)
    other, other_port, stray = _connected(1)
    try:
        assert rendezvous.joined(port) == 3, "each client's connection once (its own end has another local port)"
        assert rendezvous.joined(other_port) == 1
        assert rendezvous.joined(port, tables=("/nonexistent",)) == 0
    finally:
        for sock in [*clients, *stray, server, other]:
            sock.close()


def test_node_0s_agent_reports_the_count_while_no_rank_exists() -> None:
    server, port, clients = _connected(2)
    try:
        # a process of the job with no RANK in its environment: a torchrun agent still in the rendezvous
        status, lines, job_id = _run_agent([sys.executable, "-c", "import time; time.sleep(1.5)"], {}, "/", {},
                                           sample_s=0.3, rendezvous_port=port)
    finally:
        for sock in [*clients, server]:
            sock.close()
    shutil.rmtree(Path(rundir.run_root()) / job_id, ignore_errors=True)
    samples = frames(lines, "sample")
    assert status == 0 and samples, lines
    assert all(sample["ranks"] == [] and sample["joined"] == 2 for sample in samples), samples


class _Node0(NodeHandle):
    """Node 0's stream: ``lines``, then its exit."""

    index, pid = 0, 4242

    def __init__(self, lines: list[str]) -> None:
        self.followed, self.source = Followed("h1"), lines

    def lines(self):
        yield from self.followed.through(iter(self.source))

    def poll(self):
        return self.followed.code()

    def terminate(self, grace: float) -> None:
        pass


def test_node_0s_count_reaches_the_supervisors_liveness_and_a_bad_one_does_not(tmp_path: Path) -> None:
    observed: queue.SimpleQueue = queue.SimpleQueue()
    relay = Relay(world_size=2, secrets={}, echo=lambda line: None, note=lambda text: None,
                  sequence=iter(range(10**6)).__next__, handed=observed)
    lines = ['@sample {"t": 1.0, "ranks": [], "joined": 1}', '@sample {"t": 2.0, "ranks": [], "joined": -4}',
             '@sample {"t": 3.0, "ranks": [], "joined": "2"}', '@sample {"t": 4.0, "ranks": [], "joined": true}',
             '@exit {"code": 0}']
    watcher = NodeWatcher(_Node0(lines), "h1", tmp_path / "n0.log", relay)
    watcher.join(10)
    seen = []
    while not observed.empty():
        seen.append(observed.get())
    assert [item.agents for item in seen if isinstance(item, Joined)] == [1]

"""One attempt's decisions as a pure step: what the supervisor's loop saw -> what it does next.

The loop (``run/supervisor.py``) turns what it observes each round into events, in this order: a node
that answered for a newer supervisor (``Fenced``), each node's exit it had not seen (``Exited``), the
user's cancel (``CancelAsked``), the hang detector's verdict (``Stalled``); it feeds them to ``step``
one at a time and does what the first decision other than ``WATCH`` says. ``step`` reads no clock and
touches no node, store or thread, so the unit tests drive it event by event.

The order of precedence it encodes: a newer supervisor stops this one before anything else; a node's
failure ends the attempt even when the user cancelled in the same round (the failure is the news);
every node's clean exit is a success even then; a cancel outranks a stall.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from launcher.backends.failures import Failure


@dataclass(frozen=True)
class Fenced:
    """A node recorded a newer supervisor generation: ``by`` is its answer (generation, host, pid)."""

    by: Mapping[str, Any]


@dataclass(frozen=True)
class Exited:
    """Node ``node``'s agent ended with ``code`` (LOST_NODE_EXIT for a node called lost)."""

    node: int
    code: int


@dataclass(frozen=True)
class CancelAsked:
    reason: str


@dataclass(frozen=True)
class Stalled:
    """The hang detector's verdict: hung or stalled."""

    failure: Failure


Event = Fenced | Exited | CancelAsked | Stalled


class Do(StrEnum):
    WATCH = "watch"  # nothing decided: keep following the nodes
    STOP = "stop"  # taken over: stop deciding and writing, touch nothing
    FAIL = "fail"  # a node failed: name the first failure, end the others
    SUCCEED = "succeed"  # every node exited 0: drain their output
    CANCEL = "cancel"  # end every node on the user's word
    HANG = "hang"  # take every rank's stack, then end every node


@dataclass(frozen=True)
class Attempt:
    """What the decisions rest on: how many nodes the attempt has, their exit codes so far, and the decision once
    made (later events change nothing)."""

    nodes: int
    exits: Mapping[int, int] = field(default_factory=dict)
    decided: Do = Do.WATCH


def step(state: Attempt, event: Event) -> tuple[Attempt, Do]:
    """The attempt after ``event``, and what the loop does now."""
    if state.decided is not Do.WATCH:
        return state, state.decided
    if isinstance(event, Exited):
        exits = {**state.exits, event.node: event.code}
        failed = any(code != 0 for code in exits.values())
        do = Do.FAIL if failed else Do.SUCCEED if len(exits) == state.nodes else Do.WATCH
        return replace(state, exits=exits, decided=do), do
    do = Do.STOP if isinstance(event, Fenced) else Do.CANCEL if isinstance(event, CancelAsked) else Do.HANG
    return replace(state, decided=do), do

"""Starting a node's agent (``launcher.node.agent``), the same for every backend: its request, its argv and stdin
(``AgentStart``), and what its exit status means as a ``NodeHandle`` code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.node.protocol import AgentRequest, LeaseRequest
from launcher.node.ship import stdin_argv, stdin_request, step_hook_files
from launcher.plan.planner import NodePlan, Plan


def agent_request(plan: Plan, node: NodePlan, grace: float, secrets_on_stdin: bool, lease: LeaseRequest | None = None,
                  generation: int = 0, record: dict | None = None, warn_file: str | None = None) -> AgentRequest:
    """What the node agent needs to run ``node`` of ``plan`` (see ``launcher.node.agent``); ``lease``: what it
    leases first (``launcher.backends.leasing.agent_lease``); ``generation``: its supervisor's; ``record``: the
    job as recorded, kept in the node's run directory (``StartContext.record``); ``warn_file``: a scheduler's
    time-limit warning."""
    return AgentRequest(
        job_id=plan.job_id, node=node.index, argv=tuple(node.argv), env=dict(node.env), cwd=node.cwd,
        files={name: (file[0], file[1]) for name, file in node.files.items()}, gpus=node.gpus, grace=grace,
        secrets_on_stdin=secrets_on_stdin, cleanup=tuple(tuple(c) for c in node.cleanup), env_prefix=node.env_prefix,
        unattended_s=plan.unattended_s, generation=generation, record=record or None,
        rendezvous_port=plan.rendezvous.port if node.index == 0 else None, lease=lease, warn_file=warn_file,
        step_hooks=step_hook_files() if node.step_hooks else {},
    )


@dataclass(frozen=True)
class AgentStart:
    """How a backend starts a node's agent: ``argv`` (no request, no secret in it), then ``stdin`` written to it:
    the request on its first line (the job's env may be larger than one argument may be), the secrets on the second."""

    argv: list[str]
    stdin: bytes


def agent_start(plan: Plan, node: NodePlan, grace: float, secrets: Mapping[str, str],
                lease: LeaseRequest | None = None, generation: int = 0, record: dict | None = None) -> AgentStart:
    """The ``AgentStart`` of ``node`` of ``plan`` under ``plan.python``."""
    request = agent_request(plan, node, grace, secrets_on_stdin=True, lease=lease, generation=generation, record=record)
    return AgentStart(stdin_argv(plan.python, "agent"), stdin_request(request) + json.dumps(dict(secrets)).encode() + b"\n")


def agent_exit_code(status: int) -> int:
    """A node agent's exit status as a NodeHandle code: 128+N (its command died of signal N) becomes -N."""
    return -(status - 128) if 128 < status < 192 else status

"""Ports on the submitting machine: a free one for a job's rendezvous."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port that is free on this machine now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]

"""Backends run a plan's nodes: ``local`` (this machine), ``ssh`` (paramiko), ``ray`` (placement groups)."""

from launcher.backends.base import Backend, NodeHandle, get_backend

__all__ = ["Backend", "NodeHandle", "get_backend"]

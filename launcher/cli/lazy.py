"""A click group whose commands are imported when used.

`launch status` imports the status command's module and nothing of submit, init or metrics; `launch --help`,
which lists every command with its summary, and shell completion of command names import them all.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import click

from launcher.cli.completion import complete_job_arguments


class LazyGroup(click.Group):
    """A group of commands named as ``"module:attribute"``, imported on first use; each JOB argument of a
    command completes job ids (``complete_job_arguments``)."""

    def __init__(self, *args: Any, lazy_commands: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            module, attribute = self.lazy_commands[cmd_name].split(":")
            command = getattr(importlib.import_module(module), attribute)
            complete_job_arguments(command)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

"""`--help` teaches: every command shows real examples, so a command added later cannot forget them."""

from __future__ import annotations

import re

import click
import pytest

from launcher.cli.main import cli, main


def _help(argv: list[str]) -> None:
    """Run `launch ARGV`; a help page exits 0 (click returns, or exits, by its mode)."""
    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None)


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        yield (*prefix, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))


@pytest.mark.parametrize("path", list(_commands(cli)), ids=" ".join)
def test_every_command_help_has_examples(path, capsys, home):
    _help([*path, "--help"])
    text = capsys.readouterr().out
    match = re.search(r"^[ \t]*Examples?:\n((?:[ \t]+\S.*\n?)+)", text, re.M)
    assert match, f"`launch {' '.join(path)} --help` has no Examples block"
    runs = [line for line in match[1].splitlines() if f"launch {path[0]}" in line]
    assert len(runs) >= 2, f"`launch {' '.join(path)} --help` shows {len(runs)} example(s) of itself; give two or three"


def test_the_overview_lists_examples_of_the_main_commands(capsys):
    _help(["--help"])
    text = capsys.readouterr().out
    for command in ("submit", "status", "logs", "cancel"):
        assert f"launch {command} " in text

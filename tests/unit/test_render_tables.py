"""`launch status JOB`'s nodes and ranks tables are laid out without rich's measuring when they fit (a 1,000-rank
job took seconds, docs/BENCHMARKS.md): the characters must be exactly those rich's own Table draws."""

from __future__ import annotations

import io
import re

from rich.console import Console
from rich.text import Text

from launcher.views.jobstatus import _PlainTable


def _drawn(renderable, width: int, color: bool = False) -> str:
    out = io.StringIO()
    Console(file=out, width=width, highlight=False, soft_wrap=True, color_system="truecolor" if color else None,
            force_terminal=color).print(renderable)
    return out.getvalue()


def _table(rows) -> _PlainTable:
    table = _PlainTable("ranks", ("RANK", "NODE", "HOST", "SAMPLES/S", "STEP P50"))
    for row in rows:
        table.add_row(*row)
    return table


ROWS = [("0", "0", Text("sv-h1"), "12.3", "81.0 ms"),
        ("999", "124", Text("节点-漢字-a-much-longer-host"), "-", "-"),
        ("10", "1", Text("red", style="red"), "1234.5", "1.0 ms")]


def test_the_same_characters_as_rich_when_the_table_fits() -> None:
    table = _table(ROWS)
    assert _drawn(table, 250) == _drawn(table.rich_table(), 250)
    # on a terminal: the same characters, the header bold and each cell in its own style (rich also styles the
    # padding of a styled cell, which shows nothing)
    coloured = _drawn(table, 250, color=True)
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == _drawn(table.rich_table(), 250)
    assert "\x1b[1m RANK  NODE" in coloured and "\x1b[31mred\x1b[0m" in coloured


def test_a_table_wider_than_the_console_or_a_cell_of_several_lines_is_riches() -> None:
    narrow = _table(ROWS)
    assert _drawn(narrow, 30) == _drawn(narrow.rich_table(), 30)
    lines = _table([("0", "0", Text("two\nlines"), "1", "2")])
    assert _drawn(lines, 250) == _drawn(lines.rich_table(), 250)
    markup = _table([("[bold]x[/bold]", "0", Text("h"), "1", "2")])
    assert _drawn(markup, 250) == _drawn(markup.rich_table(), 250)


def test_an_empty_table_and_a_thousand_rows() -> None:
    empty = _table([])
    assert _drawn(empty, 250) == _drawn(empty.rich_table(), 250)
    big = _table([(str(r), str(r // 8), Text(f"node{r // 8 + 1}"), "12.3", "81.0 ms") for r in range(1000)])
    assert _drawn(big, 250) == _drawn(big.rich_table(), 250)

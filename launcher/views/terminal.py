"""Untrusted text made safe for a terminal: the one function every view prints rank output through.

A rank's output (and anything it reaches: a failure reason, a host name in the store) may carry
control sequences. A terminal obeys them: OSC sets the window title, writes the clipboard (52) or
makes hyperlinks (8); cursor moves and erases paint over another rank's ``[node/rank]`` prefix.
``safe_text`` keeps plain SGR colour (``ESC [ 1;31 m``) and tabs, and shows every other control
character as a visible escape (``\\x1b``), so nothing of it is interpreted. Bidirectional
overrides and other invisible format characters (U+202E, U+2066..2069, U+200B, U+2028) are shown
the same way, so a line reads as the bytes it holds. ``launch logs --raw`` is the only way to get
the bytes as written.
"""

from __future__ import annotations

import re

# Plain SGR: ESC [ then digits and separators, then 'm'. Nothing else of the escape language survives.
_SGR = re.compile(r"\x1b\[[0-9;:]{0,64}m")
# Characters a terminal acts on, or that change how the text around them reads: C0 (but TAB), DEL, C1,
# bidi embeddings/overrides/isolates, zero-width and line/paragraph separators, the BOM.
_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _visible(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_lines(text: str, *, colour: bool = True) -> str:
    """``safe_text`` line by line: the newlines of a multi-line text launch wrote (a failure reason) stay."""
    return "\n".join(safe_text(line, colour=colour) for line in text.split("\n"))


def safe_text(text: str, *, colour: bool = True) -> str:
    """``text`` with every control sequence but plain SGR colour made visible (with ``colour=False``, SGR too)."""
    if not _UNSAFE.search(text):
        return text
    out, pos = [], 0
    for match in _UNSAFE.finditer(text):  # an SGR's own characters are never unsafe: matches stay after pos
        start = match.start()
        out.append(text[pos:start])
        sgr = _SGR.match(text, start) if colour and match.group() == "\x1b" else None
        out.append(sgr.group() if sgr is not None else _visible(match.group()))
        pos = sgr.end() if sgr is not None else match.end()
    out.append(text[pos:])
    return "".join(out)

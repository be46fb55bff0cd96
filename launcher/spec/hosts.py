"""What a host may be called in a cluster spec, and jump hosts (``[user@]host[:port]``, comma-separated).

A host is an IPv4 or IPv6 literal, or a name of dot-separated labels of 1-63
letters, digits, ``-`` or ``_`` (not starting with ``-``), 253 characters at most.
That is RFC 1123 plus ``_``, which internal DNS zones and ~/.ssh/config aliases
use. An alias follows the same rule: longer labels or other characters could not
be looked up as a network name anyway, and a leading ``-`` would read as an
option to ssh-like tools. Every check raises ValueError with a sentence saying
what is wrong; callers add which field or file it came from.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

MAX_HOST_LENGTH = 253
MAX_LABEL_LENGTH = 63
_LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


def is_ip_literal(value: str) -> bool:
    """An IPv4 or IPv6 address; an IPv6 zone id (``fe80::1%eth0``, any text after ``%``) is not one here."""
    if "%" in value:
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def check_host(value: str) -> str:
    """``value`` if it is a valid host name, alias or address; else ValueError saying why."""
    if is_ip_literal(value):
        return value
    if not value:
        raise ValueError("a host name cannot be empty")
    if "%" in value:
        raise ValueError(f"{value[:60]!r}: an IPv6 zone id ('%' and an interface) is not accepted; give the address "
                         "without it (a link-local address is not reachable from the other nodes anyway)")
    if len(value) > MAX_HOST_LENGTH:
        raise ValueError(f"a host name is at most {MAX_HOST_LENGTH} characters; this one has {len(value)}")
    for label in value.removesuffix(".").split("."):
        if len(label) > MAX_LABEL_LENGTH:
            raise ValueError(
                f"the label {label[:20]!r}... is {len(label)} characters; each dot-separated part of a host name "
                f"has 1-{MAX_LABEL_LENGTH}"
            )
        if not _LABEL.fullmatch(label):
            raise ValueError(
                f"{value!r} is not a host name or address: each dot-separated part is 1-{MAX_LABEL_LENGTH} letters, "
                "digits, '-' or '_', not starting with '-' (or give an IPv4/IPv6 address)"
            )
    return value


def check_port(text: str) -> int:
    """A TCP port written as text; ValueError unless it is a number from 1 to 65535."""
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"port {text!r} is not a number from 1 to 65535")
    return int(text)


@dataclass(frozen=True)
class Hop:
    """One jump host: ``port`` and ``user`` are None where the hop does not give them."""

    host: str
    port: int | None = None
    user: str | None = None


def parse_jump_hosts(text: str) -> list[Hop]:
    """``[user@]host[:port]`` hops, comma-separated, in order (``ssh://`` allowed; ``none``: no hop)."""
    if text.strip().lower() == "none":
        return []
    return [_parse_hop(hop.strip()) for hop in text.split(",")]


def _parse_hop(hop: str) -> Hop:
    rest = hop.removeprefix("ssh://")
    if not rest:
        raise ValueError("a jump host cannot be empty (two commas, or a trailing one?)")
    user, at, rest = rest.rpartition("@")
    if at and (not user or any(ch.isspace() or not ch.isprintable() for ch in user)):
        raise ValueError(f"jump host {hop!r}: the user before '@' must be a name without spaces")
    if rest.startswith("["):
        host, bracket, tail = rest[1:].partition("]")
        if not bracket or not is_ip_literal(host) or (tail and not tail.startswith(":")):
            raise ValueError(f"jump host {hop!r}: '[...]' holds an IPv6 address, optionally followed by :PORT")
        port = tail[1:] if tail else None
    elif rest.count(":") > 1:
        host, port = rest, None
        if not is_ip_literal(host):
            raise ValueError(f"jump host {hop!r}: an IPv6 address with a port is written [ADDRESS]:PORT")
    else:
        host, colon, port_text = rest.partition(":")
        port = port_text if colon else None
    try:
        return Hop(check_host(host), check_port(port) if port is not None else None, user or None)
    except ValueError as exc:
        raise ValueError(f"jump host {hop!r}: {exc}") from None

"""How many torchrun agents have joined the rendezvous store that node 0 hosts: counted from outside.

Before any rank exists, every torchrun agent holds one TCP connection to the rendezvous store on node 0
(static rendezvous: node 0's agent serves it, itself connected as a client too). Node 0's launch agent
counts the established connections whose local port is the rendezvous port, from the kernel's socket
tables of its network namespace, so a job stuck before its first rank can say how many agents came.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

ESTABLISHED = "01"  # the state column of /proc/net/tcp
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def joined(port: int, tables: tuple[str, ...] = TABLES) -> int:
    """Established TCP connections to local ``port`` on this node (IPv4 and IPv6)."""
    count = 0
    for table in tables:
        try:
            with open(table, encoding="ascii") as rows:
                next(rows, None)  # the header
                for row in rows:
                    fields = row.split()
                    if len(fields) > 3 and fields[3] == ESTABLISHED and _port(fields[1]) == port:
                        count += 1
        except OSError:
            continue
    return count


def _port(address: str) -> int | None:
    """The port of a ``HEXADDR:HEXPORT`` column; None when it is not one."""
    try:
        return int(address.rsplit(":", 1)[1], 16)
    except (IndexError, ValueError):
        return None

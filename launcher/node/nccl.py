"""Which transport NCCL chose on this node, read from what NCCL says at communicator init.

The plan sets ``NCCL_DEBUG=INFO`` for the ``INIT`` and ``NET`` subsystems only, with ``NCCL_DEBUG_FILE`` in the
node's run directory (``nccl.<host>.<pid>.log``, one file a rank process), so the user's log is not flooded. The
lines read (their format strings in NVIDIA/nccl, every line prefixed ``<host>:<pid>:<tid> [<dev>] NCCL INFO ``):

- ``NCCL version 2.21.5+cuda12.4`` (``src/init.cc``, the version string, rank 0 of a communicator)
- ``Using network IB`` / ``Using network Socket`` (``src/init.cc``: the network plugin chosen, ``IBext_v8`` for a
  plugin)
- ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.0.0.1<0>`` (``src/transport/net_ib.cc``,
  ``"NET/IB : Using%s %s; OOB %s:%s"``, each device ``" [%d]%s:%d/%s"`` with the link layer IB or RoCE)
- ``NET/Socket : Using [0]eth0:10.0.0.1<0>`` (``src/transport/net_socket.cc``, ``"NET/Socket : Using%s"``)
- ``Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA`` (``src/transport/net.cc``, ``"... via NET/%s/%d%s%s"``:
  the network, the device index, ``/GDRDMA`` when GPUDirect RDMA is used)
- ``Channel 00/02 :    0   1`` (``src/graph/rings.cc``, ``"Channel %02d/%02d :"``: the ring channels of rank 0) and
  ``2 coll channels, ...`` (``src/init.cc``): the number of channels

Rank output is untrusted: files and lines are read with bounds, names kept to what NCCL prints.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import glob
import os
import re
import socket
from collections.abc import Iterable
from dataclasses import asdict, dataclass

FILE_PREFIX = "nccl."  # NCCL_DEBUG_FILE's name in the run directory: nccl.%h.%p.log
MAX_FILES = 64
MAX_BYTES = 1 << 20  # of each file
MAX_LINE = 4096
MAX_DEVICES = 32
MAX_CHANNELS = 1024
_NAME = re.compile(r"[\w.:@+-]{1,80}")

_INFO = " NCCL INFO "
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+[\w.+-]{0,40})")
_NETWORK = re.compile(r"Using network ([A-Za-z][\w.-]{0,40})")
_IB_USING = re.compile(r"NET/IB : Using(.*?); OOB ")
_IB_DEVICE = re.compile(r"\[\d+\]([\w.-]{1,64}):(\d+)/(IB|RoCE)")
_SOCKET_USING = re.compile(r"NET/Socket : Using(.*)")
_SOCKET_DEVICE = re.compile(r"\[\d+\]([\w.@-]{1,64}):")
_VIA = re.compile(r"via NET/([A-Za-z][\w.-]{0,40})/(\d+)(/GDRDMA)?")
_GDR = re.compile(r"GPU Direct RDMA Enabled")
_RING = re.compile(r"Channel \d+/(\d+) :")
_COLL = re.compile(r"(\d+) coll channels")

IB, ROCE, SOCKET = "IB", "RoCE", "Socket"


@dataclass(frozen=True)
class Transport:
    """What NCCL chose on one node: ``kind`` IB, RoCE, Socket (or a network plugin's name), the HCAs
    (``mlx5_0:1``) or interfaces it uses, whether GPUDirect RDMA is on, its version and channel count."""

    kind: str
    devices: tuple[str, ...] = ()
    gdr: bool = False
    version: str | None = None
    channels: int | None = None

    @property
    def sockets(self) -> bool:
        return self.kind == SOCKET

    def as_json(self) -> dict:
        return {**asdict(self), "devices": list(self.devices)}

    @classmethod
    def from_json(cls, data: object) -> Transport | None:
        """A transport as ``as_json`` wrote it, None for anything else (frames and events are read, never trusted)."""
        if not isinstance(data, dict):
            return None
        kind, devices, gdr = data.get("kind"), data.get("devices"), data.get("gdr")
        version, channels = data.get("version"), data.get("channels")
        if not isinstance(kind, str) or not _NAME.fullmatch(kind) or not isinstance(devices, list) or type(gdr) is not bool:
            return None
        if not all(isinstance(d, str) and _NAME.fullmatch(d) for d in devices) or len(devices) > MAX_DEVICES:
            return None
        if version is not None and not (isinstance(version, str) and _NAME.fullmatch(version)):
            return None
        if channels is not None and not (type(channels) is int and 0 <= channels <= MAX_CHANNELS):
            return None
        return cls(kind, tuple(devices), gdr, version, channels)

    def describe(self) -> str:
        """``IB mlx5_0:1,mlx5_1:1 GDR, NCCL 2.21.5, 4 channels``."""
        where = f" {','.join(self.devices)}" if self.devices else ""
        parts = [f"{self.kind}{where}{' GDR' if self.gdr else ''}"]
        if self.version:
            parts.append(f"NCCL {self.version}")
        if self.channels is not None:
            parts.append(f"{self.channels} channels")
        return ", ".join(parts)


def read(lines: Iterable[str]) -> Transport | None:
    """The transport NCCL's INFO lines name, None when they name none (no communicator initialised yet)."""
    version = network = via = None
    ib: list[tuple[str, str]] = []
    interfaces: list[str] = []
    gdr = False
    channels: int | None = None
    for raw in lines:
        line = raw[:MAX_LINE]
        if _INFO not in line:
            continue
        text = line.split(_INFO, 1)[1]
        if (found := _VERSION.match(text)) and version is None:
            version = found.group(1)
        elif found := _NETWORK.match(text):
            network = found.group(1)
        elif found := _IB_USING.match(text):
            ib = [(f"{name}:{port}", link) for name, port, link in _IB_DEVICE.findall(found.group(1))][:MAX_DEVICES]
        elif found := _SOCKET_USING.match(text):
            interfaces = _SOCKET_DEVICE.findall(found.group(1))[:MAX_DEVICES]
        elif (found := _VIA.search(text)) and text.startswith("Channel"):
            via = found.group(1)
            gdr = gdr or bool(found.group(3))
        elif _GDR.search(text):
            gdr = True
        elif found := _RING.match(text):
            channels = max(channels or 0, int(found.group(1)))
        elif found := _COLL.match(text):
            channels = max(channels or 0, int(found.group(1)))
    chosen = via or network or (IB if ib else SOCKET if interfaces else None)
    if chosen is None:
        return None
    if chosen.startswith("IB"):  # the built-in IB transport or an IB plugin (IBext_v8): IB or RoCE by link layer
        links = {link for _, link in ib}
        kind = ROCE if links == {ROCE} else IB if ib or chosen == IB else chosen
        return Transport(kind, tuple(name for name, _ in ib), gdr, version, channels)
    if chosen == SOCKET:
        return Transport(SOCKET, tuple(interfaces), False, version, channels)
    return Transport(chosen, (), gdr, version, channels)


def read_dir(run_dir: str, host: str | None = None) -> Transport | None:
    """The transport of this node's ranks, from the NCCL debug files of ``host`` (this one) in its run directory
    (bounded; hosts that share /tmp keep their own files apart by name)."""
    lines: list[str] = []
    pattern = f"{FILE_PREFIX}{glob.escape(host or socket.gethostname())}.*.log"
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), pattern)))[:MAX_FILES]:
        try:
            with open(path, "rb") as handle:
                lines += handle.read(MAX_BYTES).decode("utf-8", "replace").splitlines()
        except OSError:
            continue
    return read(lines)

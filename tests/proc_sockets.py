"""Which process holds which TCP connection, read from ``/proc`` (what ``ss -tnp`` shows).

A clean Debian has no ``ss`` (iproute2) nor ``lsof``; ``/proc`` is always
there, and reading it needs no privilege for our own processes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Set

_ESTABLISHED = "01"


def established_inodes(port: int, peer_port: int = 0) -> Set[str]:
    """Socket inodes of the established TCP connections whose local port is ``port`` (and peer's ``peer_port``)."""
    inodes: Set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _ESTABLISHED and _port(fields[1]) == port and peer_port in (0, _port(fields[2])):
                inodes.add(fields[9])
    return inodes


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)


def established_by_pid(port: int) -> Dict[int, int]:
    """How many established connections on ``port`` each process holds."""
    inodes = {f"socket:[{inode}]" for inode in established_inodes(port)}
    counts: Dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            held = sum(_link(f"/proc/{entry}/fd/{fd}") in inodes for fd in _list(f"/proc/{entry}/fd"))
            if held:
                counts[int(entry)] = held
    return counts


def sockets_held(pid: int) -> int:
    """How many sockets (of any kind) the process ``pid`` has open."""
    return sum(_link(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in _list(f"/proc/{pid}/fd"))


def _list(directory: str) -> List[str]:
    try:
        return os.listdir(directory)
    except OSError:  # the process ended, or is not ours to read
        return []


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # that descriptor closed meanwhile
        return ""

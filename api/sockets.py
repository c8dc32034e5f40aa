"""The listening sockets the master binds and its workers adopt.

One plain socket shared by every worker balances badly: Linux wakes the last
waiter first and Twisted accepts up to ~100 connections per wake-up, so one
worker took 64 of 64 connections in a test here. Instead the master binds one
``SO_REUSEPORT`` socket per worker slot; the kernel spreads new connections
over them by a hash of the address pair. The master keeps every slot's socket
open, so connections queued for a slot wait for a respawned worker instead of
being refused.
"""

from __future__ import annotations

import errno
import ipaddress
import resource
import socket
from typing import List

# The accept queue of each slot; the kernel caps it at net.core.somaxconn.
BACKLOG = 4096


class BindError(Exception):
    """The address is malformed, not local, or taken; the message says which."""


def bind_listeners(host: str, port: int, count: int) -> List[socket.socket]:
    """``count`` listening sockets on one address, bound with ``SO_REUSEPORT``."""
    family = _family(host)
    if port != 0:
        _ensure_free(family, host, port)
    listeners: List[socket.socket] = []
    try:
        for _ in range(count):
            listener = _listener(family, host, port)
            port = listener.getsockname()[1]  # port 0: every slot on the port the first got
            listeners.append(listener)
    except BaseException:
        for listener in listeners:
            listener.close()
        raise
    return listeners


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard one; returns the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _family(host: str) -> socket.AddressFamily:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise BindError(f"{host!r} is not an IPv4 or IPv6 address") from None
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


def _ensure_free(family: socket.AddressFamily, host: str, port: int) -> None:
    # SO_REUSEPORT would let us share a port with another process of the same
    # user (a second Jetway); a probe bound without it fails if anyone listens.
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _dual_stack(probe, host)
        _bind(probe, host, port)


def _listener(family: socket.AddressFamily, host: str, port: int) -> socket.socket:
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        _dual_stack(listener, host)
        _bind(listener, host, port)
        listener.listen(BACKLOG)
        listener.setblocking(False)
        listener.set_inheritable(True)
    except BaseException:
        listener.close()
        raise
    return listener


def _dual_stack(sock: socket.socket, host: str) -> None:
    if host == "::":
        # Accept IPv4 too (as ::ffff:a.b.c.d), whatever net.ipv6.bindv6only says.
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)


def _bind(sock: socket.socket, host: str, port: int) -> None:
    try:
        sock.bind((host, port))
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise BindError(f"{_show(host)}:{port} is already in use") from None
        if error.errno == errno.EADDRNOTAVAIL:
            raise BindError(f"{host} is not an address of this machine") from None
        if error.errno == errno.EACCES:
            raise BindError(f"port {port} needs privileges to bind") from None
        raise BindError(f"cannot bind {_show(host)}:{port}: {error.strerror}") from None


def _show(host: str) -> str:
    return f"[{host}]" if ":" in host else host

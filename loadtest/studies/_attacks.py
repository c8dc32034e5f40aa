"""Hostile clients, and what they cost a server's processes.

Shared by the suite (``tests/process/test_hostile_clients.py``, which keeps the
bounds true) and ``python -m loadtest.studies._hostile`` (which measures them at full
size and writes the report). Every client here talks to 127.0.0.1 only,
and every loop is bounded in time.
"""

from __future__ import annotations

import os
import select
import socket
import time
from pathlib import Path
from typing import List, Optional, Sequence

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """A process's resident memory, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used so far (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def children(pid: int) -> List[int]:
    """The processes ``pid`` started (a master's workers)."""
    return sorted(int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())


def cpu_share(pids: Sequence[int], seconds: float) -> float:
    """The share of one core ``pids`` used together over the next ``seconds``."""
    before = sum(cpu_seconds(pid) for pid in pids)
    time.sleep(seconds)
    return (sum(cpu_seconds(pid) for pid in pids) - before) / seconds


def get_request(path: str, token: Optional[str] = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"GET {path} HTTP/1.1\r\nHost: jetway\r\n{auth}\r\n".encode()


def connect(port: int, receive_buffer: int = 0) -> socket.socket:
    """A non-blocking client socket; a small ``receive_buffer`` makes the server's output back up sooner."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


def send_for(sock: socket.socket, data: bytes, seconds: float) -> int:
    """Send ``data`` over and over for ``seconds`` without reading; the bytes the kernel took."""
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    view = memoryview(data)
    offset = sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not poller.poll(50):
            continue  # the server stopped reading: its back-pressure at work
        try:
            count = sock.send(view[offset:])
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            break  # the server closed it
        sent += count
        offset = (offset + count) % len(data)
    return sent


def pipeline_without_reading(port: int, request: bytes, seconds: float) -> socket.socket:
    """Pipeline ``request`` for ``seconds`` and never read; the open socket is the caller's to close."""
    sock = connect(port, receive_buffer=64 * 1024)
    send_for(sock, request * 64, seconds)
    return sock


def partial_body(port: int, path: str, size: int, sent: int, token: Optional[str] = None) -> socket.socket:
    """A PUT announcing ``size`` bytes of body and sending the first ``sent``; the socket stays open."""
    sock = connect(port)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"PUT {path} HTTP/1.1\r\nHost: jetway\r\n{auth}Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    ).encode()
    payload = head + b" " * sent
    view = memoryview(payload)
    offset = 0
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    end = time.monotonic() + 10
    while offset < len(payload) and time.monotonic() < end:
        if not poller.poll(50):
            continue
        try:
            offset += sock.send(view[offset:])
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            break  # refused and closed: the caller reads the answer
    return sock


def answered(sock: socket.socket, wait: float) -> bytes:
    """What the server sent on ``sock`` within ``wait`` seconds (b"" if nothing)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    received = b""
    end = time.monotonic() + wait
    while time.monotonic() < end:
        if not poller.poll(int(max(0.0, end - time.monotonic()) * 1000)):
            break
        try:
            chunk = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            break
        if not chunk:
            break
        received += chunk
        if b"\r\n\r\n" in received:
            head, _, body = received.partition(b"\r\n\r\n")
            if len(body) >= content_length(head):
                break
    return received


def content_length(head: bytes) -> int:
    """The ``Content-Length`` of a response head (0 without one)."""
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0

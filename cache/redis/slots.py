"""Where a command goes in a Redis Cluster: its key's hash slot, and the slot's master.

A key's slot is CRC16 (XMODEM) of the key, or of the part between the
first ``{`` and the next ``}`` when that is not empty (a hash tag), modulo
16384. A command's key is its first argument, or for a script call the
first key after ``numkeys``; ``CLUSTER SLOTS`` says which master serves
each slot, and a ``MOVED``/``ASK`` reply names the node to go to instead.
``cache.redis.cluster`` routes by them.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from twisted.internet import defer
from twisted.python.failure import Failure

from cache.redis.address import Node
from cache.redis.link import Arg, Command

SLOTS = 16384
_SCRIPT_CALLS = frozenset((b"EVAL", b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO", b"FCALL", b"FCALL_RO"))
_KEYLESS = frozenset((b"PING", b"ECHO", b"TIME", b"INFO", b"SCRIPT", b"CLUSTER", b"PUBLISH", b"ASKING"))


def _crc16_table() -> List[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
        table.append(crc)
    return table


_CRC16 = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ byte) & 0xFF]
    return crc


def hashed_part(key: bytes) -> bytes:
    """What of ``key`` its slot is the hash of: its ``{hash tag}``'s content, or the whole key without one."""
    start = key.find(b"{")
    if start != -1:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def key_slot(key: bytes) -> int:
    """The hash slot of ``key``, honouring a ``{hash tag}``."""
    return crc16(hashed_part(key)) % SLOTS


def command_key(command: Command) -> Optional[bytes]:
    """The key a command is routed by, or None when any node will do."""
    name = arg_bytes(command[0]).upper()
    if name in _SCRIPT_CALLS:
        return arg_bytes(command[3]) if len(command) > 3 and int(command[2]) > 0 else None
    if name in _KEYLESS or len(command) < 2:
        return None
    return arg_bytes(command[1])


def arg_bytes(arg: Arg) -> bytes:
    if isinstance(arg, bytes):
        return arg
    return arg.encode() if isinstance(arg, str) else b"%d" % arg


def slot_owners(reply: Any, node: Node) -> List[Optional[Node]]:
    """The master of each slot, from ``node``'s ``CLUSTER SLOTS`` reply (None: no master serves it)."""
    owners: List[Optional[Node]] = [None] * SLOTS
    for start, end, master, *_replicas in reply:
        # An empty host means "the address you reached me at".
        owner = (_text(master[0]) or node[0], int(master[1]))
        owners[int(start) : int(end) + 1] = [owner] * (int(end) - int(start) + 1)
    return owners


def redirection(message: str, replied_by: Node) -> Tuple[int, Node]:
    """``MOVED 3999 127.0.0.1:6381`` → ``(3999, ("127.0.0.1", 6381))``."""
    _, slot, where = message.split(" ", 2)
    host, _, port = where.rpartition(":")
    return int(slot), (host or replied_by[0], int(port))


def first_success(pending: List[defer.Deferred]) -> defer.Deferred:
    """Fires with the first result among ``pending``, or the first failure if all fail."""
    done = defer.Deferred()
    failures: List[Failure] = []

    def succeeded(result: Any) -> None:
        if not done.called:
            done.callback(result)

    def failed(failure: Failure) -> None:
        failures.append(failure)
        if len(failures) == len(pending) and not done.called:
            done.errback(failures[0])

    for deferred in pending:
        deferred.addCallbacks(succeeded, failed)
    return done


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

"""Which slots' sockets the kernel gives new connections to: only those whose worker serves.

The master keeps a dead worker's socket open (``api.sockets``), so the
kernel goes on queueing that slot's share of new connections there, and
they waited until the respawned worker had started and warmed: seconds
(``loadtest/studies/_slot_wait.py``). While a slot has no serving worker,
the master attaches a classic BPF program to the ``SO_REUSEPORT`` group
that picks a serving slot's socket for every new connection (by the
packet's flow hash, modulo the serving slots); once every slot serves
again it detaches it, and the kernel's own spread by the address pair
applies as before. Connections already queued on the dead slot's socket
when its worker died are handed to the serving workers (``api.handoff``).

Linux only (``SO_ATTACH_REUSEPORT_CBPF``, 4.5+); where it fails the master
logs it once and connections wait as they did.
"""

from __future__ import annotations

import ctypes
import errno
import socket
from typing import List, Sequence

# <asm-generic/socket.h>
SO_ATTACH_REUSEPORT_CBPF = 51
SO_DETACH_REUSEPORT_BPF = 68
# <linux/filter.h>: ld [abs], mod #k, jeq #k, ret #k; the flow hash as ancillary data.
_LD_ABS_WORD = 0x20
_MOD_K = 0x94
_JEQ_K = 0x15
_RET_K = 0x06
_SKF_AD_RXHASH = (-0x1000 + 32) & 0xFFFFFFFF


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Instruction))]


def program(serving: Sequence[int]) -> List[_Instruction]:
    """A group's choice: the flow hash modulo ``len(serving)`` names the serving slot whose socket takes it."""
    instructions = [_Instruction(_LD_ABS_WORD, 0, 0, _SKF_AD_RXHASH), _Instruction(_MOD_K, 0, 0, len(serving))]
    for position, slot in enumerate(serving[:-1]):
        instructions += [_Instruction(_JEQ_K, 0, 1, position), _Instruction(_RET_K, 0, 0, slot)]
    return [*instructions, _Instruction(_RET_K, 0, 0, serving[-1])]


def steer(listener: socket.socket, slots: int, serving: Sequence[int]) -> None:
    """New connections to the group of ``listener`` (``slots`` sockets, bound in slot order) go to ``serving`` only.

    Every slot, or none: the kernel's own spread (with none, connections wait for a worker anyway).
    """
    if not serving or len(serving) == slots:
        try:
            listener.setsockopt(socket.SOL_SOCKET, SO_DETACH_REUSEPORT_BPF, 0)
        except OSError as error:
            if error.errno != errno.ENOENT:  # nothing attached
                raise
        return
    instructions = program(sorted(serving))
    array = (_Instruction * len(instructions))(*instructions)
    fprog = _Program(len(instructions), ctypes.cast(array, ctypes.POINTER(_Instruction)))
    listener.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, bytes(fprog))  # the kernel copies it

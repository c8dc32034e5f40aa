"""The gate's busy phase: both sides loaded to saturation at once by wrk, worker CPU per request.

The locust scenario's ~500 requests/s leave the workers mostly idle, so its
CPU per request (~660-950 µs) is timers, idle connections, collections and
compilation spread over few requests; a request's own cost (20-40 µs) is a
few percent of it, and a 60 µs burn per request hid in its noise (issue
49). Here wrk keeps every worker busy with the two hottest operations
(``loadtest/busy.lua``: four 100 B reads to one PUT, token on), so a
request's own cost is nearly all of the figure and a 20 µs rise moves it by
tens of percent. Both sides run at the same time, as in the locust phase,
so whatever else loads the machine falls on both alike.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from typing import Dict, List, Sequence, Tuple

from loadtest._gate import Side, cpu_seconds
from loadtest._token import ROOT

SCRIPT = ROOT / "loadtest" / "busy.lua"
DOCS = 50
PATH_PREFIX = "/v1/gate/d"
BODY = b'{"name":"Ada Lovelace","email":"ada@example.com","tags":["math","engines"],"score":97.5}'
CONNECTIONS = 16
# wrk past this has not ended by itself: give up on the round rather than hang.
WRK_SLACK_SECONDS = 30
# The warm-up's slices: until two in a row agree within SETTLED on every side, at most WARM_SLICES.
WARM_SLICE_SECONDS = 2.0
WARM_SLICES = 10
SETTLED = 0.15
# Runs of one measured slice whose requests met errors before the phase gives up: a fresh worker on a
# loaded machine can stall past wrk's 2 s timeout once (a CI run: 16 timeouts and 21 statuses of 400 or
# more, on the side without the burn), and a slice with errors is not counted (_summary says why).
SLICE_TRIES = 3


class BusyErrors(RuntimeError):
    """A slice's wrk met failed requests: its figure would mean nothing."""


def wrk_path() -> str:
    found = shutil.which("wrk")
    if not found:
        raise RuntimeError("the gate's busy phase needs wrk: make loadtest-packages installs it")
    return found


def seed(side: Side) -> None:
    """The documents the busy phase reads, written once (a read of a missing one would be a 404)."""
    for number in range(DOCS):
        request = urllib.request.Request(f"{side.base}{PATH_PREFIX}{number}", data=BODY, method="PUT")
        request.add_header("Content-Type", "application/json")
        if side.token:
            request.add_header("Authorization", f"Bearer {side.token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()


def warm_up(sides: Sequence[Side]) -> List[List[float]]:
    """Busy load, not counted, until every side's figure has settled; the figures seen, slice by slice.

    A fresh worker spends its first seconds of this mix compiling it (its own warm-up stops at 5 s,
    and on a loaded machine that is before it has compiled everything): one worker measured
    308, 99, 27, 31, 25 µs per request in its first five 4 s slices, its twin 191, 116, 42, 31, 26.
    Whichever side compiles later looks dearer, so no round starts before both are flat.
    """
    seen: List[List[float]] = []
    for _ in range(WARM_SLICES):
        try:
            seen.append(measure_busy(sides, WARM_SLICE_SECONDS, slices=1, tries=1))
        except BusyErrors:
            continue  # not counted, and not settled: a worker still compiling may time a request out
        if len(seen) >= 2 and all(abs(now - then) <= SETTLED * then for then, now in zip(seen[-2], seen[-1])):
            break
    return seen


def measure_busy(sides: Sequence[Side], seconds: float, slices: int = 2, tries: int = SLICE_TRIES) -> List[float]:
    """Worker CPU µs per request of each side (in ``sides``' order), wrk on all of them at once.

    ``seconds`` cut into ``slices`` whose wrk processes start in turns (A B, then B A): one side's
    start or scheduling luck then falls on both alike, and a round's figure is its slices' CPU
    over their requests. A slice whose requests met errors is run again, ``tries`` times in all,
    then ``BusyErrors``.
    """
    cpu = [0.0] * len(sides)
    served = [0] * len(sides)
    for number in range(slices):
        order = list(range(len(sides))) if number % 2 == 0 else list(range(len(sides)))[::-1]
        for index, (spent, requests) in zip(
            order, _slice_without_errors([sides[i] for i in order], seconds / slices, tries)
        ):
            cpu[index] += spent
            served[index] += requests
    return [spent * 1e6 / max(requests, 1) for spent, requests in zip(cpu, served)]


def _slice_without_errors(sides: Sequence[Side], seconds: float, tries: int) -> List[Tuple[float, int]]:
    for _ in range(tries - 1):
        try:
            return _slice(sides, seconds)
        except BusyErrors as error:
            print(f"busy phase: a slice run again ({error})", flush=True)
    return _slice(sides, seconds)  # the last try: its errors are the phase's


def _slice(sides: Sequence[Side], seconds: float) -> List[Tuple[float, int]]:
    """Each side's worker CPU seconds and wrk's completed requests over one run of ``seconds``."""
    before = [cpu_seconds(side.master_pid) for side in sides]
    started = [_start_wrk(side, seconds) for side in sides]
    outputs = []
    try:
        for process in started:
            out, _ = process.communicate(timeout=seconds + WRK_SLACK_SECONDS)
            outputs.append(out)
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [
        (cpu_seconds(side.master_pid) - cpu_before, _summary(side, out)["requests"])
        for side, cpu_before, out in zip(sides, before, outputs)
    ]


def _start_wrk(side: Side, seconds: float) -> subprocess.Popen:
    command = [wrk_path(), "-t1", f"-c{CONNECTIONS}", f"-d{seconds:g}s", "-s", str(SCRIPT), side.base]
    env = {**os.environ, "GATE_TOKEN": side.token, "GATE_DOCS": str(DOCS), "GATE_PATH_PREFIX": PATH_PREFIX}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


def _summary(side: Side, out: str) -> Dict[str, int]:
    lines = [line for line in out.splitlines() if line.startswith("BUSY ")]
    if not lines:
        raise RuntimeError(f"wrk against {side.name} printed no summary: {out[-500:]}")
    summary: Dict[str, int] = json.loads(lines[-1][5:])
    errors = {kind: summary[kind] for kind in ("connect", "read", "write", "status", "timeout") if summary[kind]}
    if errors:
        # A failed request costs a different amount than a served one: the figure would mean nothing.
        raise BusyErrors(f"the busy phase against {side.name} had errors: {errors}")
    return summary

"""Where the writes a planned Sentinel failover loses fall in the failover (issue #56): a study.

Runs the consistency harness's ``failover`` scenario (``run.record_history``,
unchanged) while a sampler of its own, in another process, records on the
same clock (``time.monotonic_ns``, system-wide on Linux) every ~10 ms each
Redis's ``INFO replication`` (role, offsets, link, full sync in progress),
every sentinel's announcements (``PSUBSCRIBE *``) and the load average.
Then, per failover, relative to the moment ``SENTINEL FAILOVER`` was sent:
Sentinel's steps, each server's role changes, how far behind the promoted
replica was (its offset at promotion is the new master's
``second_repl_offset``), the workers' fence and switch (their log, wall
clock mapped onto the monotonic one), and the acknowledged writes missing
from the new master's feed (as ``feed.check`` counts them), by their
acknowledgement times::

    python -m tests.consistency.failover_timeline --histories 3 --ops 2000
    python -m tests.consistency.failover_timeline --histories 3 --ops 2000 --early-end
    python -m tests.consistency.failover_timeline --histories 3 --ops 2000 --coordinated

Each failover is over (and the history with it) once the demoted primary
has resynced from the new one, as the harness's own is. ``--early-end``:
as the harness's was before, once it says it is a replica, before its full
resync; so the next failover promotes a replica that has none of the
next history's writes. ``--coordinated``: instead of ``SENTINEL FAILOVER`` alone, Redis's own
``FAILOVER TO <replica>`` on the master (writes paused until the replica has
every byte, then the roles swapped), then ``SENTINEL FAILOVER`` at once, so
that the sentinels name the new master (the replica they promote already is
one) before they notice the swap themselves.

Everything started here (the stack, the sampler) is stopped by pid, also
when the run fails. The timeline is written to ``--out`` as JSON and
printed as a table.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import redis

from tests.consistency import run as harness
from tests.consistency.faults import SCENARIOS, Fault, _replica_synced, _wait
from tests.consistency.feed import DONE
from tests.consistency.stack import Stack
from tests.multinode import SERVICE
from tests.support import ROOT

INFO_FIELDS = (
    "role",
    "master_replid",
    "master_replid2",
    "master_repl_offset",
    "second_repl_offset",
    "slave_repl_offset",
    "master_link_status",
    "master_sync_in_progress",
    "master_last_io_seconds_ago",
    "master_link_down_since_seconds",
    "master_failover_state",
    "connected_slaves",
    "slave0",
)
# Sentinel's steps of a failover, in order, and what the workers log (cache/redis/sentinel_watch.py).
STEPS = (
    "+try-failover",
    "+elected-leader",
    "+failover-state-select-slave",
    "+selected-slave",
    "+failover-state-send-slaveof-noone",
    "+failover-state-wait-promotion",
    "+promoted-slave",
    "+failover-state-reconf-slaves",
    "+failover-end",
    "+switch-master",
    "+convert-to-slave",
)
WORKER_LINES = {"failing over: no command to the old master": "workers fenced", "switched master": "workers switched"}


# --- the sampler (its own process) ---------------------------------------------------------------------------


def sample(out: Path, ports: List[int], sentinels: List[int], period: float) -> None:
    """JSON lines into ``out`` until SIGTERM: INFO replication of ``ports``, announcements of ``sentinels``."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    with open(out, "a", buffering=1 << 16) as sink:
        lock = threading.Lock()

        def write(entry: Dict[str, Any]) -> None:
            with lock:
                sink.write(json.dumps(entry) + "\n")

        threads = [threading.Thread(target=_listen, args=(port, write, stopping), daemon=True) for port in sentinels]
        for thread in threads:
            thread.start()
        _poll(ports, write, stopping, period)
        stopping.set()
        for thread in threads:
            thread.join(3)


def _listen(port: int, write: Callable[[Dict[str, Any]], None], stopping: threading.Event) -> None:
    """One sentinel's announcements, each with the time it arrived."""
    while not stopping.is_set():
        try:
            with redis.Redis("127.0.0.1", port, socket_timeout=2) as client:
                pubsub = client.pubsub()
                pubsub.psubscribe("*")
                write({"t": time.monotonic_ns(), "sentinel": port, "subscribed": True})
                while not stopping.is_set():
                    message = pubsub.get_message(timeout=0.2)
                    if message and message["type"] == "pmessage":
                        channel, data = message["channel"].decode(), message["data"].decode()
                        write({"t": time.monotonic_ns(), "sentinel": port, "event": channel, "data": data})
        except (OSError, redis.RedisError) as error:
            write({"t": time.monotonic_ns(), "sentinel": port, "error": str(error)})
            time.sleep(0.2)


def _poll(ports: List[int], write: Callable[[Dict[str, Any]], None], stopping: threading.Event, period: float) -> None:
    """Every ``period``: each server's INFO replication; every second the wall clock beside this one, and the load."""
    clients = {port: redis.Redis("127.0.0.1", port, socket_timeout=1) for port in ports}
    next_clock = 0.0
    while not stopping.is_set():
        began = time.monotonic()
        if began >= next_clock:
            load = Path("/proc/loadavg").read_text().split()[:3]
            write({"t": time.monotonic_ns(), "wall": time.time_ns(), "load": [float(x) for x in load]})
            next_clock = began + 1.0
        for port, client in clients.items():
            before = time.monotonic_ns()
            try:
                info = client.info("replication")
                entry = {k: info[k] for k in INFO_FIELDS if k in info}
            except (OSError, redis.RedisError) as error:
                entry = {"error": str(error)}
            after = time.monotonic_ns()
            write({"t": (before + after) // 2, "took": after - before, "port": port, **entry})
        time.sleep(max(0.0, period - (time.monotonic() - began)))
    for client in clients.values():
        client.close()


class Sampler:
    """The sampler's process, started and stopped (by pid) by its owner."""

    def __init__(self, out: Path, ports: List[int], sentinels: List[int], period: float = 0.01) -> None:
        self.out = out
        command = [sys.executable, "-m", "tests.consistency.failover_timeline", "--sample", str(out)]
        command += ["--ports", ",".join(map(str, ports)), "--sentinel-ports", ",".join(map(str, sentinels))]
        command += ["--period", str(period)]
        self.command = command
        self.wanted = {*ports, *sentinels}
        self.process: Optional[subprocess.Popen] = None

    def __enter__(self) -> Sampler:
        self.out.unlink(missing_ok=True)
        self.process = subprocess.Popen(self.command, cwd=ROOT)
        try:
            _wait(self._ready, 120)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _ready(self) -> bool:
        """Every sentinel subscribed to and every server sampled (a loaded machine takes seconds to start PyPy)."""
        if not self.out.exists():
            return False
        seen = set()
        for line in self.out.read_text().splitlines()[:-1]:
            entry = json.loads(line)
            seen.add(entry.get("port") if "port" in entry else entry.get("sentinel") if "subscribed" in entry else 0)
        return self.wanted <= seen

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


# --- the faults -------------------------------------------------------------------------------------------------


def _info(port: int) -> Dict[str, Any]:
    with redis.Redis("127.0.0.1", port, socket_timeout=2) as client:
        return client.info("replication")


class EarlyEndFault(Fault):
    """The harness's failover before the fix: over as soon as the demoted primary says it is a replica.

    Its full resync is still to come then (Redis holds a diskless one back
    5 s), and the next history's failover promotes it with none of that
    history's writes.
    """

    def _failover(self) -> None:
        sentinels = self.stack.sentinel
        assert sentinels is not None
        before, at, switched, _ = self.sentinel_failover()
        self.note("SENTINEL FAILOVER", at, switched=switched, old=before, new=sentinels.master_address())


class CoordinatedFault(Fault):
    """``FAILOVER TO`` the replica on the master (Redis's coordinated failover), then ``SENTINEL FAILOVER``."""

    def _failover(self) -> None:
        sentinels = self.stack.sentinel
        assert sentinels is not None
        self.wait_for(0.3)
        before = sentinels.master_address()
        replica = next(p.port for p in (sentinels.master, sentinels.replica) if p.port != before[1])
        at = time.monotonic_ns()
        with redis.Redis("127.0.0.1", before[1], socket_timeout=5) as client:
            client.execute_command("FAILOVER", "TO", "127.0.0.1", replica, "TIMEOUT", 5000)
        _wait(lambda: _info(replica)["role"] == "master" and _info(before[1])["role"] == "slave", 10)
        swapped = time.monotonic_ns()
        with sentinels.sentinels[0].client() as client:
            client.execute_command("SENTINEL", "FAILOVER", SERVICE)
        asked = time.monotonic_ns()
        _wait(lambda: sentinels.master_address() != before, 30)
        switched = time.monotonic_ns()
        _wait(lambda: _replica_synced(before[1]), 60)
        self.note(
            "FAILOVER TO, then SENTINEL FAILOVER",
            at,
            swapped=swapped,
            sentinel_failover=asked,
            switched=switched,
            resynced=time.monotonic_ns(),
            old=before,
            new=sentinels.master_address(),
        )


# --- the run ------------------------------------------------------------------------------------------------------


def run_study(args: argparse.Namespace) -> Path:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    scenario = SCENARIOS["failover"]
    home = out / "stack"
    shutil.rmtree(home, ignore_errors=True)  # a fresh Redis for each run
    settings = argparse.Namespace(
        seed=args.seed, docs=args.docs, clients=args.clients, ops=args.ops, seconds=args.seconds
    )
    histories: List[str] = []
    # record_history builds its fault by this name: the study's variants stand in for it.
    if args.coordinated:
        harness.Fault = CoordinatedFault  # type: ignore[misc]
    elif args.early_end:
        harness.Fault = EarlyEndFault  # type: ignore[misc]
    with Stack(home, scenario.topology, scenario.relay, scenario.env) as stack:
        assert stack.sentinel is not None
        ports = [stack.sentinel.master.port, stack.sentinel.replica.port]
        with Sampler(out / "samples.jsonl", ports, [s.port for s in stack.sentinel.sentinels]):
            for number in range(args.histories):
                path = harness.record_history(stack, scenario, number, settings, out)
                histories.append(str(path))
                print(f"history {number}: {path}", flush=True)
            time.sleep(0.5)
        log = (home / "jetway.log").read_text(errors="replace")
    summary = analyze(out / "samples.jsonl", histories, log)
    summary.update(command=" ".join(sys.argv), early_end=args.early_end, coordinated=args.coordinated, ports=ports)
    target = out / "timeline.json"
    target.write_text(json.dumps(summary, indent=1))
    return target


# --- the analysis -------------------------------------------------------------------------------------------------


def _load(samples: Path) -> Tuple[Dict[int, List[Dict[str, Any]]], List[Dict[str, Any]], List[Dict[str, Any]]]:
    infos: Dict[int, List[Dict[str, Any]]] = {}
    events: List[Dict[str, Any]] = []
    clocks: List[Dict[str, Any]] = []
    for line in samples.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # the last line, cut by the stop
        if "port" in entry:
            infos.setdefault(entry["port"], []).append(entry)
        elif "event" in entry:
            events.append(entry)
        elif "wall" in entry:
            clocks.append(entry)
    return infos, events, clocks


def _worker_lines(log: str, clocks: List[Dict[str, Any]]) -> List[Tuple[int, str]]:
    """The workers' fence and switch, their wall-clock times mapped onto the monotonic clock."""
    if not clocks:
        return []
    offset = sorted(c["wall"] - c["t"] for c in clocks)[len(clocks) // 2]
    found = []
    for line in log.splitlines():
        for text, what in WORKER_LINES.items():
            if text in line:
                stamp = re.search(r'"time": "([^"]+)"', line)
                if stamp:
                    wall = int(datetime.fromisoformat(stamp.group(1)).timestamp() * 1e9)
                    found.append((wall - offset, what))
    return found


def _ms(t: Optional[int], zero: int) -> Optional[float]:
    return None if t is None else round((t - zero) / 1e6, 1)


def _at(series: List[Dict[str, Any]], t: int) -> Optional[Dict[str, Any]]:
    """The last sample of a server taken at or before ``t``."""
    last = None
    for entry in series:
        if entry["t"] > t:
            break
        last = entry
    return last


def analyze(samples: Path, histories: List[str], log: str) -> Dict[str, Any]:
    infos, events, clocks = _load(samples)
    workers = _worker_lines(log, clocks)
    failovers = []
    for path in histories:
        history = json.loads(Path(path).read_text())
        for fault in history["faults"]:
            failovers.append(_one_failover(history, fault, infos, events, clocks, workers))
    return {"failovers": failovers}


def _one_failover(
    history: Dict[str, Any],
    fault: Dict[str, Any],
    infos: Dict[int, List[Dict[str, Any]]],
    events: List[Dict[str, Any]],
    clocks: List[Dict[str, Any]],
    workers: List[Tuple[int, str]],
) -> Dict[str, Any]:
    t0 = fault["at"]
    old_port, new_port = fault["old"][1], fault["new"][1]
    window_end = fault["until"] + 2_000_000_000
    old, new = infos.get(old_port, []), infos.get(new_port, [])
    timeline: List[Tuple[Optional[float], str]] = []
    # Sentinel's steps: the first sentinel to announce each.
    for step in STEPS:
        times = [e["t"] for e in events if e["event"] == step and t0 - 2e9 <= e["t"] <= window_end]
        if times:
            timeline.append((_ms(min(times), t0), f"sentinel {step}"))
    for what in dict.fromkeys(WORKER_LINES.values()):
        times = sorted(t for t, w in workers if w == what and t0 - 2e9 <= t <= window_end)
        if times:
            timeline.append((_ms(times[0], t0), f"{what} (first worker)"))
            timeline.append((_ms(times[-1], t0), f"{what} (last worker)"))
    # Role changes, as sampled.
    for port, series, name in ((old_port, old, "old master"), (new_port, new, "replica")):
        role = (_at(series, t0 - 2_000_000_000) or {}).get("role")
        for entry in series:
            if t0 - 2e9 <= entry["t"] <= window_end and entry.get("role") and entry["role"] != role:
                timeline.append((_ms(entry["t"], t0), f"{name} ({port}) role {entry['role']}"))
                role = entry["role"]
    # The old master's offset as it rose while it was a master (Jetway's writes; and the sentinels' hellos, every
    # 2 s, ~150 bytes each), from half a second before the command.
    rises = [
        (_ms(later["t"], t0), later["master_repl_offset"] - earlier["master_repl_offset"])
        for earlier, later in zip(old, old[1:])
        if t0 - 5e8 <= later["t"] <= window_end
        and later.get("role") == earlier.get("role") == "master"
        and later.get("master_repl_offset", 0) > earlier.get("master_repl_offset", 0)
    ]
    if rises:
        timeline.append((rises[-1][0], f"old master's offset rose for the last time (+{rises[-1][1]} bytes)"))
    # The replica when the command was sent, and at its promotion.
    replica_then, master_then = _at(new, t0), _at(old, t0)
    state: Dict[str, Any] = {}
    if replica_then and master_then:
        state["replica_at_command"] = {k: replica_then.get(k) for k in INFO_FIELDS if k in replica_then}
        state["master_at_command"] = {k: master_then.get(k) for k in INFO_FIELDS if k in master_then}
        if replica_then.get("master_replid") == master_then.get("master_replid"):
            state["lag_bytes_at_command"] = master_then["master_repl_offset"] - replica_then.get("slave_repl_offset", 0)
    promoted = next((e for e in new if e["t"] >= t0 and e.get("role") == "master"), None)
    if promoted is not None:
        offset = promoted.get("second_repl_offset", -1) - 1  # the offset it had when it stopped replicating
        state["promotion_offset"] = offset
        same = [e for e in old if e.get("master_replid") == promoted.get("master_replid2") and e["t"] >= t0 - 60e9]
        state["promoted_from_same_history"] = bool(same)  # its data descends from the old master's replication
        reached = next((e["t"] for e in same if e.get("master_repl_offset", -1) >= offset), None)
        master_at_promotion = _at(old, promoted["t"])
        if master_at_promotion is not None:
            state["lag_bytes_at_promotion"] = master_at_promotion.get("master_repl_offset", 0) - offset
        if reached is not None and offset > 0:
            timeline.append((_ms(reached, t0), "old master reached the offset the replica was promoted at"))
            state["promoted_state_as_of_ms"] = _ms(reached, t0)
    # The writes: acknowledged, and missing from the new master's feed.
    acked, lost = _lost_writes(history)
    lost_rets = sorted(w["ret"] for w in lost)
    first_write = min((w["ret"] for w in acked), default=None)
    timeline.append((_ms(history["started"], t0), "history's clients started"))
    if first_write is not None:
        timeline.append((_ms(first_write, t0), "first acknowledged write"))
    if lost_rets:
        timeline.append((_ms(lost_rets[0], t0), f"first lost write acknowledged ({len(lost)} lost)"))
        timeline.append((_ms(lost_rets[-1], t0), "last lost write acknowledged"))
    timeline.append((0.0, "SENTINEL FAILOVER sent" if "swapped" not in fault else "FAILOVER TO sent"))
    for key, what in (("swapped", "FAILOVER TO done (roles swapped)"), ("sentinel_failover", "SENTINEL FAILOVER sent")):
        if key in fault:
            timeline.append((_ms(fault[key], t0), what))
    timeline.sort(key=lambda row: (row[0] is None, row[0]))
    before_command = [w for w in acked if w["ret"] < t0 and "delete" not in w["kind"]]
    load = _at(clocks, t0)
    return {
        "history": history["collection"],
        "fault": fault["what"],
        "old": old_port,
        "new": new_port,
        "load_at_command": load["load"] if load else None,
        "acknowledged_writes": len(acked),
        "acknowledged_before_command": len(before_command),
        "lost": len(lost),
        "lost_acknowledged_ms": [_ms(lost_rets[0], t0), _ms(lost_rets[-1], t0)] if lost_rets else None,
        "lost_before_command": sum(1 for t in lost_rets if t < t0),
        "timeline_ms": timeline,
        "old_master_rises_ms_bytes": rises,
        **state,
    }


def _lost_writes(history: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """Acknowledged writes, and those of them with no event in the feed (``feed.check``'s count)."""
    writes = [r for r in history["records"] if r["kind"] in DONE]
    acked = [r for r in writes if r["status"] in DONE[r["kind"]]]
    events = {(e["id"], e.get("etag")) for e in history["feed"] if e["op"] != "delete"}
    lost = [w for w in acked if "delete" not in w["kind"] and (w["doc"], w["etag"]) not in events]
    return acked, lost


def show(summary: Dict[str, Any]) -> str:
    lines = []
    for failover in summary["failovers"]:
        lines.append(
            f"\n{failover['history']}: {failover['fault']} {failover['old']} -> {failover['new']}; "
            f"load {failover['load_at_command']}; {failover['lost']} of {failover['acknowledged_writes']} "
            f"acknowledged writes lost ({failover['lost_before_command']} acknowledged before the command)"
        )
        for key in ("lag_bytes_at_command", "lag_bytes_at_promotion", "promoted_state_as_of_ms"):
            if key in failover:
                lines.append(f"  {key}: {failover[key]}")
        replica = failover.get("replica_at_command", {})
        fields = ("role", "master_link_status", "master_sync_in_progress", "master_link_down_since_seconds")
        lines.append("  replica at the command: " + ", ".join(f"{k}={replica.get(k)}" for k in fields))
        lines.append("  | ms after the command | what |")
        lines.append("  | ---: | --- |")
        for at, what in failover["timeline_ms"]:
            lines.append(f"  | {at} | {what} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    prog = "python -m tests.consistency.failover_timeline"
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--histories", type=int, default=3, help="one failover each, back and forth")
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--docs", type=int, default=5)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    p.add_argument("--early-end", action="store_true", help="the failover over once the old primary is a replica")
    p.add_argument("--coordinated", action="store_true", help="FAILOVER TO on the master, then SENTINEL FAILOVER")
    p.add_argument("--out", default=str(ROOT / "var" / "failover-timeline"))
    p.add_argument("--analyze", help="only analyze this earlier run's directory (its timeline.json is rewritten)")
    # The sampler's own process.
    p.add_argument("--sample", help=argparse.SUPPRESS)
    p.add_argument("--ports", help=argparse.SUPPRESS)
    p.add_argument("--sentinel-ports", help=argparse.SUPPRESS)
    p.add_argument("--period", type=float, default=0.01, help=argparse.SUPPRESS)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    if args.sample:
        ports = [int(p) for p in args.ports.split(",")]
        sample(Path(args.sample), ports, [int(p) for p in args.sentinel_ports.split(",")], args.period)
        return 0
    if args.analyze:
        directory = Path(args.analyze)
        earlier = json.loads((directory / "timeline.json").read_text())
        histories = sorted(str(p) for p in directory.glob("failover-*.json"))
        log = (directory / "stack" / "jetway.log").read_text(errors="replace")
        summary = {**earlier, **analyze(directory / "samples.jsonl", histories, log)}
        target = directory / "timeline.json"
        target.write_text(json.dumps(summary, indent=1))
    else:
        target = run_study(args)
        summary = json.loads(target.read_text())
    print(show(summary))
    print(f"\n{target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 44's attacks, before and after, measured the same way against the issue's targets.

    .venv-loadtest/bin/python -m loadtest.studies._trust --tree DIR [--tree DIR2] [--rounds 3] [--only NAME ...]

For each tree (a checkout, e.g. a ``git worktree`` of an old commit with
``.venv`` linked in, as ``loadtest/ab_cpu.sh`` makes them), a private
redis-server and a server of that tree's code (``python -m api serve``, 2
workers, production defaults: authorization on, access log on; the master in
a session of its own, so ``kill -HUP -PGID`` reaches it and its workers
only), an admin token made with the tree's own CLI, then each attack of
``loadtest.studies._trust_attacks`` repeated ``--rounds`` times while
``loadtest.studies._trust_monitor`` probes ``/healthz`` on several keep-alive
connections and samples each worker's RSS every 20 ms, and a loopback
listener records any connection. 10 s after an attack's last request its
monitor stops: one row per attack and tree, judged against the issue's
targets (no /healthz gap over 100 ms, no 5xx, no crash, no connection out,
each worker's RSS back within 50 MB of its start). A server whose worker died,
that answered a 5xx (or nothing) or that stopped answering is replaced before
the next attack, so that no row inherits an earlier attack's damage. An ``idle`` row (no
attack) shows what this machine's load alone does to the gaps.

Writes ``loadtest/results/trust.md`` and prints it. Traffic goes to
127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set

from loadtest._servers import Processes, free_port, http_ok, stop_on_sigterm, wait_until
from loadtest._token import ROOT
from loadtest.studies._trust_attacks import ATTACKS, Attack, Outcome, Target, call
from loadtest.studies._trust_monitor import Listener, Monitor, pids_alive, worker_pids

OUTPUT = ROOT / "loadtest" / "results" / "trust.md"
WORKERS = 2
GAP_TARGET_MS = 100.0
RSS_TARGET_MB = 50.0
SETTLE = 10.0  # seconds after an attack before its RSS is read "after"
ATTACK_DEADLINE = 240.0  # no new round starts past this


@dataclass
class Row:
    """One attack against one tree, as measured."""

    attack: str
    tree: str
    statuses: Dict[str, int]
    gap_ms: float
    net_gap_ms: float
    long_gaps: int
    slowest_s: float
    rss: Dict[int, List[float]]  # pid -> [start, peak, after]
    initial: List[int]
    crashed: int
    restarted: int
    connections: int
    probed: str
    figures: Dict[str, object]
    expect_reload: bool = False


def status_summary(statuses: Dict[str, int]) -> str:
    return " ".join(f"{status} x{count}" for status, count in sorted(statuses.items())) or "-"


def rss_cell(row: Row) -> str:
    """start/peak/after of the worker that rose the most (the worker is the same one in all three)."""
    known = [row.rss[pid] for pid in row.initial if pid in row.rss]
    if not known:
        return "-"
    start, peak, after = max(known, key=lambda sizes: (sizes[1] - sizes[0], sizes[2] - sizes[0]))
    return f"{start:.0f}/{peak:.0f}/{after:.0f}"


def misses(row: Row, idle_net_ms: Optional[float] = None) -> List[str]:
    """Each target this row misses, with its figure (and, for a gap, the same tree's idle row's beside it)."""
    found = []
    if row.net_gap_ms > GAP_TARGET_MS:
        floor = f" (idle: {idle_net_ms:.0f})" if idle_net_ms is not None and row.attack != "idle" else ""
        found.append(f"/healthz gap {row.net_gap_ms:.0f} ms net of CPU waits > {GAP_TARGET_MS:.0f}{floor}")
    server_errors = sum(count for status, count in row.statuses.items() if status.startswith("5"))
    if server_errors:
        found.append(f"{server_errors} 5xx")
    lost = sum(row.statuses.get(kind, 0) for kind in ("timeout", "error"))
    if lost:
        found.append(f"{lost} requests without an answer")
    if row.crashed and not row.expect_reload:
        found.append(f"{row.crashed} worker(s) died")
    if row.connections:
        found.append(f"{row.connections} connection(s) to the listener")
    if not row.expect_reload:
        for pid in row.initial:
            start, _, after = row.rss.get(pid, [0.0, 0.0, 0.0])
            if after - start > RSS_TARGET_MB:
                found.append(f"worker RSS +{after - start:.0f} MB after {SETTLE:.0f} s")
    found += _figure_misses(row.figures)
    return found


def _figure_misses(figures: Dict[str, object]) -> List[str]:
    """The attack's own figures (each a list, one value a round) against their targets."""
    found = []
    accepted = sum(figures.get("invalid bodies accepted (2xx)", []))  # type: ignore[arg-type]
    if accepted:
        found.append(f"{accepted} invalid bodies stored")
    ends = figures.get("stream end after the CLI returned (s)", [])
    late = [end for end in ends if end is None or (isinstance(end, float) and end > 1.0)]  # type: ignore[union-attr]
    if late:
        found.append(f"{len(late)} stream(s) open > 1 s after revocation")
    unopened = [end for end in ends if isinstance(end, str)]  # type: ignore[union-attr]
    if unopened:
        found.append(f"{len(unopened)} stream(s) not opened")
    failed = [one for one in figures.get("failed requests", []) if not str(one).startswith("0 ")]  # type: ignore[union-attr]
    if failed:
        found.append(f"failed requests ({', '.join(map(str, failed))})")
    for operations in figures.get("batch operations", []):  # type: ignore[union-attr]
        if isinstance(operations, str) or any(status >= 500 for status in operations):
            found.append(f"a batch not answered per operation ({operations})")
            break
    return found


def verdict(row: Row, idle_net_ms: Optional[float] = None) -> str:
    found = misses(row, idle_net_ms)
    return "meets" if not found else "misses: " + "; ".join(found)


def figures_cell(figures: Dict[str, object]) -> str:
    return "; ".join(f"{name}: {_short(value)}" for name, value in figures.items()) or ""


def _short(value: object) -> str:
    if isinstance(value, list):
        return ", ".join(_short(one) for one in value)
    if value is None:
        return f"open (>{15:d} s)"
    return str(value)


def table(rows: Sequence[Row]) -> List[str]:
    lines = [
        "| attack | tree | statuses | slowest request s | longest /healthz gap ms | net of CPU waits ms | gaps > 100 ms"
        " | worker RSS MB start/peak/after | crashes | connections out | workers probed | other figures | verdict |",
        "|---|---|---|---:|---:|---:|---:|---|---|---:|---|---|---|",
    ]
    idle = {row.tree: row.net_gap_ms for row in rows if row.attack == "idle"}
    for row in rows:
        crashes = f"{row.crashed} died, {row.restarted} new" if row.crashed or row.restarted else "0"
        if row.expect_reload:
            crashes += " (reload expected)"
        lines.append(
            f"| {row.attack} | {row.tree} | {status_summary(row.statuses)} | {row.slowest_s:.2f} | {row.gap_ms:.0f}"
            f" | {row.net_gap_ms:.0f}"
            f" | {row.long_gaps} | {rss_cell(row)}"
            f" | {crashes} | {row.connections} | {row.probed} | {figures_cell(row.figures)}"
            f" | {verdict(row, idle.get(row.tree))} |"
        )
    return lines


class Server:
    """One tree's Jetway (2 workers, production defaults), restartable, in a session of its own."""

    def __init__(self, processes: Processes, tree: Path, redis_url: str) -> None:
        self.processes, self.tree, self.redis_url = processes, tree, redis_url
        self.python = tree / ".venv" / "bin" / "python"
        self.process: Optional[subprocess.Popen] = None
        self.port = 0
        self.starts = 0

    def start(self) -> None:
        self.port = free_port()
        self.starts += 1
        log = open(self.processes.directory / f"jetway-{self.starts}.log", "ab")  # noqa: SIM115
        env = {**os.environ, "REDIS_URL": self.redis_url, "JETWAY_ACCESS_LOG": "on", "JETWAY_AUTH": "on"}
        command = [str(self.python), "-m", "api", "serve", "--port", str(self.port), "--workers", str(WORKERS)]
        with log:
            self.process = subprocess.Popen(
                command, cwd=self.tree, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.processes.started.append(self.process)
        wait_until(self.serving, 120, f"{self.tree} on port {self.port}")

    def serving(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"the server of {self.tree} exited")
        return len(worker_pids(self.process.pid)) == WORKERS and http_ok(f"http://127.0.0.1:{self.port}/healthz")

    def healthy(self, workers: Set[int]) -> bool:
        """Still the same workers, each answering at once (several fresh connections reach both)."""
        if self.process is None or self.process.poll() is not None:
            return False
        if set(worker_pids(self.process.pid)) != workers or pids_alive(workers) != workers:
            return False
        try:
            return all(_quick_health(self.port) for _ in range(6))
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is None:
            return
        group = self.process.pid
        self.processes.stop(self.process)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)  # a worker the master left behind
        self.process = None


def _quick_health(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    finally:
        connection.close()


def admin_token(server: Server) -> str:
    made = subprocess.run(
        [str(server.python), "-m", "api", "keys", "create", "--name", "trust-admin", "--scope", "admin"],
        cwd=server.tree,
        env={**os.environ, "REDIS_URL": server.redis_url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if made.returncode != 0:
        raise RuntimeError(f"keys create: {made.stderr.strip()}")
    return made.stdout.strip().splitlines()[-1]


def warm_up(target: Target) -> None:
    """A few hundred ordinary requests, so the JIT has compiled the common paths before anything is measured."""
    for number in range(200):
        call(target, "PUT", f"/v1/warm/w{number % 20}", b'{"n":%d}' % number)
        call(target, "GET", f"/v1/warm/w{number % 20}")


def measure(server: Server, target: Target, listener: Listener, attack: Optional[Attack], rounds: int) -> Row:
    """One attack (or none: the idle row) ``rounds`` times under the monitor, and what it saw."""
    listener_start = time.monotonic()
    assert server.process is not None
    initial = worker_pids(server.process.pid)
    outcomes: List[Outcome] = []
    with Monitor(server.port, server.process.pid) as monitor:
        time.sleep(1.0)  # the probes connected and answered before the attack starts
        deadline = time.monotonic() + ATTACK_DEADLINE
        target.slowest = 0.0
        for number in range((attack.rounds or rounds) if attack else 0):
            if time.monotonic() > deadline:
                break
            outcomes.append(attack.run(target, number))  # type: ignore[union-attr]
        time.sleep(SETTLE if attack else 5.0)
    found = monitor.found
    rss = found["rss"]
    seen = {int(pid) for pid in rss}
    alive = pids_alive(set(initial))
    figures: Dict[str, object] = {}
    for outcome in outcomes:
        for name, value in outcome.figures.items():
            figures.setdefault(name, []).append(value)  # type: ignore[union-attr]
    if found["bad_answers"]:
        figures["/healthz not 200"] = found["bad_answers"]
    return Row(
        attack=attack.name if attack else "idle",
        tree="",
        statuses=dict(Counter(status for outcome in outcomes for status in outcome.statuses)),
        gap_ms=found["longest_gap"] * 1000,
        net_gap_ms=found["net_gap"] * 1000,
        long_gaps=found["gaps_over_100ms"],
        slowest_s=target.slowest,
        rss={int(pid): sizes for pid, sizes in rss.items()},
        initial=initial,
        crashed=len(set(initial) - alive),
        restarted=len(seen - set(initial)),
        connections=listener.since(listener_start),
        probed=f"{len(set(found['workers_probed']) & set(initial))}/{len(initial)}",
        figures=figures,
        expect_reload=bool(attack and attack.name == "hup-pgid"),
    )


def run_tree(tree: Path, attacks: Sequence[Attack], rounds: int, log: Callable[[str], None]) -> List[Row]:
    label = _label(tree)
    rows: List[Row] = []
    listener = Listener()
    with tempfile.TemporaryDirectory(prefix="trust-") as scratch, Processes(Path(scratch)) as processes:
        redis_url = processes.redis()
        server = Server(processes, tree, redis_url)
        server.start()
        master = server.process.pid  # type: ignore[union-attr]
        target = Target(server.port, master, admin_token(server), tree, server.python, redis_url, listener.port)
        warm_up(target)
        prepared: Set[object] = set()
        for attack in [None, *attacks]:
            if attack is not None and attack.prepare is not None and attack.prepare not in prepared:
                attack.prepare(target)
                prepared.add(attack.prepare)
            row = measure(server, target, listener, attack, rounds)
            row.tree = label
            rows.append(row)
            log(table([row])[-1])
            if row.expect_reload or damaged(row) or not server.healthy(set(row.initial)):
                log(f"  {label}: replacing the server after {row.attack}")
                server.stop()
                server.start()
                target.port, target.master = server.port, server.process.pid  # type: ignore[union-attr]
                warm_up(target)
        server.stop()
    listener.close()
    return rows


def damaged(row: Row) -> bool:
    """Whether the server answered a 5xx, or none, to this attack: the next one gets a new server."""
    return any(status.startswith("5") or status in ("timeout", "error") for status in row.statuses)


def _label(tree: Path) -> str:
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return commit.stdout.strip() or tree.name


def report(rows: Sequence[Row], command: str, loads: List[str]) -> str:
    lines = [
        "# Issue 44's attacks, measured the same way on each tree",
        "",
        f"`{command}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average (1, 5, 15 min)"
        f" during the run: {'; '.join(loads)}; {os.cpu_count()} cores.",
        "",
        f"Targets: longest gap between two /healthz answers on any probe connection ≤ {GAP_TARGET_MS:.0f} ms,"
        f" no 5xx, no crash, no connection out, each worker's RSS ≤ {RSS_TARGET_MB:.0f} MB over its start"
        f" {SETTLE:.0f} s after the attack. `timeout`: the client gave up after 30 s; `error`: the connection broke.",
        "",
        "On a shared machine a gap is mostly time that the worker, or the probing process, spent runnable but"
        " waiting for a CPU (/proc/PID/schedstat): the *net* column is each gap less those waits (the largest"
        " over all gaps), and the verdict judges it; the raw longest gap and the count of gaps over 100 ms are"
        " shown beside it, and the `idle` row (no attack) is what the machine's load alone does.",
        "",
        *table(rows),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.studies._trust", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", required=True, help="a checkout with .venv in it")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", action="append", choices=[attack.name for attack in ATTACKS])
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    stop_on_sigterm()
    attacks = [attack for attack in ATTACKS if not args.only or attack.name in args.only]
    rows: List[Row] = []
    loads = [_load()]
    for tree in args.tree:
        rows += run_tree(tree.resolve(), attacks, args.rounds, lambda line: print(line, flush=True))
        loads.append(_load())
    command = "python -m loadtest.studies._trust " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    text = report(rows, command, loads)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0


def _load() -> str:
    return " ".join(f"{load:.1f}" for load in os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())

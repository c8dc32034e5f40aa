"""``make loadtest-check``: this tree against the baseline commit, side by side, in alternating rounds.

On this shared machine the same build's p95 moves by tens of percent from
one run to the next, so figures recorded on another day either catch
nothing or fail on noise. The gate runs both builds now instead: the
baseline commit (``loadtest/baseline.json``'s ``commit``, checked out in a
git worktree under ``var/``) and this tree, each with its own Redis, under
the same locust scenario, both loaded at the same time in each round (each
by its own locust, started in turns A B, B A, ...), so whatever else loads
the machine falls on both alike. It compares, per round, this tree's
figures to the baseline's taken beside them, and judges the median ratio:

- worker CPU per request under the busy load (``loadtest._busy``: wrk
  keeps every worker busy with reads and PUTs, both sides at once): a
  request's own cost is nearly all of it, so this is the figure that
  discriminates (a 20 µs burn, about half a request's cost, fails it). It
  also fails when this tree is *cheaper* than the baseline beyond the
  noise: a stale baseline is slack a regression hides in, so the check
  says so with the command that moves it;
- worker CPU per request under the locust scenario: the workers' user+system
  time (``/proc``) over the requests the server itself counted
  (``/metrics``). At the scenario's rate idle costs dominate it (~250-900
  µs against a request's 30), so beside a busy figure it is shown, not
  judged: it failed an unchanged check at 1.25x at a load average of 11;
- each request's p50 latency: a regression that waits rather than computes
  (a lock, a timer, a round trip), held to 2x and an absolute slack, since
  loopback latencies are a few milliseconds, in 4 of 5 rounds, since a
  request's p50 follows the machine's load (``LATENCY_ROUNDS_SHARE``);
- failures: any failed request fails the check.

``verdict`` is the pure part (and what the tests hold to its rules).
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from loadtest import _baseline, _token
from loadtest._servers import Processes
from loadtest._token import ROOT

BURN_VARIABLE = "JETWAY_DEBUG_BURN_US"
DEFAULT_CPU_TOLERANCE = 0.25
DEFAULT_BUSY_TOLERANCE = 0.20
DEFAULT_STALE_TOLERANCE = 0.20
RECORD_COMMAND = "make loadtest-record && git commit loadtest/baseline.json"
DEFAULT_LATENCY_TOLERANCE = 1.0
DEFAULT_LATENCY_SLACK_MS = 2.0
# A p50 fails only when it rose in this share of the rounds: a wait added to a request (a timer, a
# lock, a round trip) shows in every round, a loaded machine's spike in one or two (an unchanged
# check at a load average of 11 saw one request's median ratio at 2.31x, 16 -> 37 ms).
LATENCY_ROUNDS_SHARE = 0.8
# Requests seen fewer times than this in a round have too noisy a p50 to judge.
MIN_REQUESTS = 50
# The workers flush their counts to /metrics once a second (api/worker.py).
METRICS_SETTLE_SECONDS = 1.3
CPU_LABEL = "worker CPU per request"
BUSY_LABEL = "busy worker CPU per request"


@dataclass
class Round:
    """One side's figures in one round."""

    cpu_us_per_request: float
    requests: Dict[str, _baseline.Figures] = field(default_factory=dict)
    busy_cpu_us_per_request: float = 0.0  # 0: no busy phase measured


@dataclass
class Limits:
    cpu_tolerance: float = DEFAULT_CPU_TOLERANCE
    latency_tolerance: float = DEFAULT_LATENCY_TOLERANCE
    latency_slack_ms: float = DEFAULT_LATENCY_SLACK_MS
    min_requests: int = MIN_REQUESTS
    busy_tolerance: float = DEFAULT_BUSY_TOLERANCE
    stale_tolerance: float = DEFAULT_STALE_TOLERANCE


def verdict(baseline: Sequence[Round], current: Sequence[Round], limits: Limits) -> Tuple[List[str], List[str]]:
    """The report's lines and the failures (each naming the request and the figure); no failure: pass."""
    lines = [f"{'figure':44} {'baseline':>10} {'this tree':>10} {'ratio':>7} {'bound':>7}  verdict"]
    failures: List[str] = []
    busy_measured = all(side.busy_cpu_us_per_request > 0 for side in (*baseline, *current))
    if busy_measured:
        busy = [(then.busy_cpu_us_per_request, now.busy_cpu_us_per_request) for then, now in zip(baseline, current)]
        _cpu(BUSY_LABEL, busy, limits.busy_tolerance, limits.stale_tolerance, lines, failures)
    cpu = [(then.cpu_us_per_request, now.cpu_us_per_request) for then, now in zip(baseline, current)]
    # Without a busy phase this is the only CPU figure, and judged; beside one, shown only (idle costs).
    _cpu(CPU_LABEL, cpu, limits.cpu_tolerance, None, lines, failures if not busy_measured else [])
    for request in sorted({name for side in (*baseline, *current) for name in side.requests}):
        line, failure = _latency(request, baseline, current, limits)
        if line:
            lines.append(line)
        if failure:
            failures.append(failure)
    return lines, failures


def _cpu(
    label: str,
    pairs: Sequence[Tuple[float, float]],
    tolerance: float,
    stale_tolerance: Optional[float],
    lines: List[str],
    failures: List[str],
) -> None:
    """One CPU figure judged by the median of the rounds' ratios: too high fails; too low, with a
    ``stale_tolerance``, fails too and says how to move the baseline."""
    ratios = [now / then for then, now in pairs]
    ratio = statistics.median(ratios)
    then = statistics.median(then for then, _ in pairs)
    now = statistics.median(now for _, now in pairs)
    bound = 1 + tolerance
    stale = stale_tolerance is not None and ratio < 1 - stale_tolerance
    why = "REGRESSION" if ratio > bound else "STALE BASELINE" if stale else "ok"
    each = ", ".join(f"{r:.2f}" for r in ratios)
    lines.append(
        f"{label + ' (µs)':44} {then:10.1f} {now:10.1f} {ratio:7.2f} {bound:7.2f}  "
        f"{why} (median of the rounds' ratios: {each})"
    )
    if ratio > bound:
        failures.append(
            f"{_baseline.AGGREGATED}: {label} rose to {ratio:.2f}x the baseline's "
            f"({now:.1f} against {then:.1f} µs; allowed {bound:.2f}x)"
        )
    elif stale:
        failures.append(
            f"{_baseline.AGGREGATED}: {label} fell to {ratio:.2f}x the baseline's ({now:.1f} against {then:.1f} µs; "
            f"below {1 - stale_tolerance:.2f}x the baseline is stale, slack a regression could hide in): "
            f"re-record it: {RECORD_COMMAND}"
        )


def _latency(
    request: str, baseline: Sequence[Round], current: Sequence[Round], limits: Limits
) -> Tuple[Optional[str], Optional[str]]:
    failed = sum(side.requests.get(request, {}).get("failures", 0) for side in current)
    if failed:
        return f"{request:44} failed {failed:.0f} times", f"{request}: {failed:.0f} requests failed"
    pairs = [
        (then.requests[request], now.requests[request])
        for then, now in zip(baseline, current)
        if request in then.requests
        and request in now.requests
        and min(then.requests[request]["requests"], now.requests[request]["requests"]) >= limits.min_requests
    ]
    if not pairs:
        return None, None  # too rare to judge: failures only
    ratio = statistics.median(now["p50_ms"] / max(then["p50_ms"], 1e-3) for then, now in pairs)
    then_ms = statistics.median(then["p50_ms"] for then, _ in pairs)
    now_ms = statistics.median(now["p50_ms"] for _, now in pairs)
    bound = 1 + limits.latency_tolerance
    risen = sum(1 for then, now in pairs if _risen(then["p50_ms"], now["p50_ms"], bound, limits.latency_slack_ms))
    needed = math.ceil(LATENCY_ROUNDS_SHARE * len(pairs))
    ok = risen < needed
    why = "ok" if ok else "REGRESSION"
    line = f"{request + ' p50 ms':44} {then_ms:10.2f} {now_ms:10.2f} {ratio:7.2f} {bound:7.2f}  {why}"
    line += f" (risen in {risen} of {len(pairs)} rounds)"
    if ok:
        return line, None
    return line, (
        f"{request}: p50 rose to {ratio:.2f}x the baseline's ({now_ms:.2f} against {then_ms:.2f} ms; "
        f"past {bound:.2f}x and {limits.latency_slack_ms:g} ms in {risen} of {len(pairs)} rounds)"
    )


def _risen(then_ms: float, now_ms: float, bound: float, slack_ms: float) -> bool:
    return now_ms > bound * then_ms and now_ms - then_ms > slack_ms


# --- running the two sides -------------------------------------------------------


@dataclass
class Side:
    name: str
    tree: Path
    env: Dict[str, str]
    base: str = ""
    master_pid: int = 0
    token: str = ""
    redis_url: str = ""


def baseline_tree(commit: str) -> Path:
    """The baseline commit checked out in ``var/loadtest-baseline`` (a git worktree, sharing ``.venv``)."""
    tree = ROOT / "var" / "loadtest-baseline"
    if not (tree / ".git").exists():
        tree.parent.mkdir(parents=True, exist_ok=True)
        _git("worktree", "prune")
        _git("worktree", "add", "--detach", "--force", str(tree), commit)
    else:
        _git("-C", str(tree), "checkout", "--quiet", "--detach", commit)
    venv = tree / ".venv"
    if not venv.exists():
        venv.symlink_to(ROOT / ".venv")
    return tree


def start(side: Side, processes: Processes, workers: int, python: Path) -> None:
    side.redis_url = processes.redis(name=f"redis-{side.name}")
    settings = (("JETWAY_ACCESS_LOG", "on"), *side.env.items())
    side.base = processes.jetway(side.name, python, side.redis_url, workers, settings=settings, cwd=side.tree)
    side.master_pid = processes.named[side.name].pid
    side.token = _token.resolve(str(python), side.redis_url, os.environ.get("JETWAY_TOKEN", "")).token or ""


def cpu_seconds(master_pid: int) -> float:
    """User+system CPU of the master's workers so far."""
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    ticks = 0
    for pid in children:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def requests_served(base: str) -> float:
    """Every request the server counted, over all its workers (``jetway_requests_total``)."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("jetway_requests_total"))


def measure_together(runs: Sequence[Tuple[Side, List[str], Path]]) -> List[Round]:
    """One locust run against each side, all at once, with each server's CPU and request counts around it.

    At once, not one after the other: a job that starts or ends on the
    machine mid-round then loads both sides alike, where in turns it fell
    on one of them (measured: an unchanged tree judged 1.20x the CPU per
    request, and 1.75x the p50, at a load average of 6).
    """
    before = [(cpu_seconds(side.master_pid), requests_served(side.base)) for side, _, _ in runs]
    started: List[subprocess.Popen] = []
    try:
        for side, command, _ in runs:
            env = {**os.environ, "REDIS_URL": side.redis_url, "JETWAY_TOKEN": side.token}
            env.pop(BURN_VARIABLE, None)
            started.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL))
        codes = [process.wait() for process in started]
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    for (side, _, _), code in zip(runs, codes):
        if code not in (0, 1):
            raise RuntimeError(f"locust exited with {code} against {side.name}")
    time.sleep(METRICS_SETTLE_SECONDS)
    rounds = []
    for (side, _, results), (cpu_before, served_before) in zip(runs, before):
        cpu = cpu_seconds(side.master_pid) - cpu_before
        served = requests_served(side.base) - served_before - 1  # less this scrape's own request
        rounds.append(Round(cpu * 1e6 / max(served, 1.0), _baseline.load_stats(results)))
    return rounds


def _git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True)

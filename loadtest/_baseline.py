"""The figures of a locust run, the recorded baseline, and the check against it.

The figures of one request name (``METHOD name``, as locust reports it, plus
``Aggregated``) are its requests per second over the measured window, its
p50/p95/p99 in milliseconds and its failure ratio, computed from locust's
``--json-file`` stats the way locust computes its own percentiles.

The check fails, naming the request and the figure, when

- any request failed;
- a request's throughput fell more than ``tolerance`` under the baseline's;
- its p95 or p99 rose more than ``tolerance`` over the baseline's *and* by more
  than ``latency_slack_ms``: loopback latencies are a millisecond or two, and a
  20% rise of 1 ms is scheduler noise on a shared machine, not a regression;
- a request of the baseline was not made at all.

Requests the baseline saw fewer than ``min_requests`` times are checked for
failures only: their rates and tails are too noisy to hold to 20%.

``python -m loadtest._baseline check STATS.json --baseline BASELINE.json``
checks the stats of a run that was already made; ``make loadtest-check``
(``loadtest._run``) makes the run first. Standard library only: this runs on
PyPy in the test suite as well as in the load test's CPython environment.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

AGGREGATED = "Aggregated"
PERCENTILES = {"p50_ms": 0.50, "p95_ms": 0.95, "p99_ms": 0.99}
DEFAULT_TOLERANCE = 0.20
DEFAULT_MIN_REQUESTS = 100
DEFAULT_LATENCY_SLACK_MS = 2.0

Figures = Dict[str, float]


def percentile(response_times: Mapping[Any, int], count: int, fraction: float) -> float:
    """The response time that ``fraction`` of the requests finished within (locust's rule)."""
    allowed_over = int(count * fraction)
    processed = 0
    for bucket in sorted(response_times, key=float, reverse=True):
        processed += response_times[bucket]
        if count - processed <= allowed_over:
            return float(bucket)
    return 0.0


def figures_of(entries: Sequence[Mapping[str, Any]]) -> Dict[str, Figures]:
    """Per ``METHOD name`` (and ``Aggregated``): rps, percentiles, failure ratio."""
    active = [entry for entry in entries if entry["num_requests"] or entry["num_failures"]]
    if not active:
        return {}
    started = min(entry["start_time"] for entry in active)
    ended = max(entry["last_request_timestamp"] or entry["start_time"] for entry in active)
    window = max(ended - started, 1e-9)
    result = {f"{entry['method']} {entry['name']}": _figures(entry, window) for entry in active}
    merged: Dict[str, int] = {}
    for entry in active:
        for bucket, count in entry["response_times"].items():
            key = str(float(bucket))
            merged[key] = merged.get(key, 0) + count
    total = {
        "num_requests": sum(entry["num_requests"] for entry in active),
        "num_failures": sum(entry["num_failures"] for entry in active),
        "response_times": merged,
    }
    result[AGGREGATED] = _figures(total, window)
    return result


def _figures(entry: Mapping[str, Any], window: float) -> Figures:
    requests = entry["num_requests"]
    times = entry["response_times"]
    answered = sum(times.values())
    figures: Figures = {"requests": requests, "rps": round(requests / window, 2)}
    for name, fraction in PERCENTILES.items():
        figures[name] = round(percentile(times, answered, fraction), 2)
    figures["failure_ratio"] = round(entry["num_failures"] / requests, 6) if requests else 1.0
    figures["failures"] = entry["num_failures"]
    return figures


def load_stats(path: Path) -> Dict[str, Figures]:
    return figures_of(json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class Finding:
    """One figure of one request against the baseline."""

    request: str
    figure: str
    baseline: Optional[float]
    current: Optional[float]
    limit: Optional[float]
    failed: bool
    why: str = ""

    def line(self) -> str:
        return f"{self.request}: {self.why}"


@dataclass(frozen=True)
class Limits:
    tolerance: float = DEFAULT_TOLERANCE
    min_requests: int = DEFAULT_MIN_REQUESTS
    latency_slack_ms: float = DEFAULT_LATENCY_SLACK_MS


def compare(baseline: Mapping[str, Figures], current: Mapping[str, Figures], limits: Limits) -> List[Finding]:
    """Every figure checked, in baseline order; ``failed`` marks a regression."""
    findings: List[Finding] = []
    for request, base in baseline.items():
        now = current.get(request)
        if now is None:
            missing = base["requests"] >= limits.min_requests
            why = "made in the baseline run, not made in this one"
            findings.append(Finding(request, "requests", base["requests"], 0, None, missing, why))
            continue
        findings.append(_failures(request, now))
        if base["requests"] < limits.min_requests:
            why = f"only {base['requests']:.0f} in the baseline: rate and tail not compared"
            findings.append(Finding(request, "rps", base["rps"], now["rps"], None, False, why))
            continue
        findings.append(_throughput(request, base["rps"], now["rps"], limits))
        for figure in ("p95_ms", "p99_ms"):
            findings.append(_latency(request, figure, base[figure], now[figure], limits))
    for request in current:
        if request not in baseline:
            why = "not in the baseline: not compared (re-record to include it)"
            findings.append(Finding(request, "requests", None, current[request]["requests"], None, False, why))
    return findings


def _failures(request: str, now: Figures) -> Finding:
    failed = now["failures"] > 0
    why = f"{now['failures']:.0f} of {now['requests']:.0f} requests failed ({now['failure_ratio']:.2%})"
    return Finding(request, "failure_ratio", 0.0, now["failure_ratio"], 0.0, failed, why if failed else "")


def _throughput(request: str, base: float, now: float, limits: Limits) -> Finding:
    floor = round(base * (1 - limits.tolerance), 2)
    failed = now < floor
    why = (
        f"throughput fell to {now:.3g} req/s, under the {floor:.3g} allowed "
        f"(baseline {base:.3g} req/s - {limits.tolerance:.0%})"
    )
    return Finding(request, "rps", base, now, floor, failed, why if failed else "")


def _latency(request: str, figure: str, base: float, now: float, limits: Limits) -> Finding:
    ceiling = round(max(base * (1 + limits.tolerance), base + limits.latency_slack_ms), 2)
    failed = now > ceiling
    label = figure.split("_")[0]
    why = (
        f"{label} rose to {now:.3g} ms, over the {ceiling:.3g} ms allowed "
        f"(baseline {base:.3g} ms + {limits.tolerance:.0%}, at least +{limits.latency_slack_ms:g} ms)"
    )
    return Finding(request, figure, base, now, ceiling, failed, why if failed else "")


def report(findings: Iterable[Finding]) -> str:
    """A table of every figure checked, then each regression on its own line."""
    findings = list(findings)
    rows = [("request", "figure", "baseline", "this run", "limit", "verdict")]
    for finding in findings:
        verdict = "REGRESSION" if finding.failed else ("note" if finding.why else "ok")
        rows.append(
            (
                finding.request,
                finding.figure,
                _number(finding.baseline),
                _number(finding.current),
                _number(finding.limit),
                verdict,
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    notes = [f"note: {finding.line()}" for finding in findings if finding.why and not finding.failed]
    failures = [f"FAIL: {finding.line()}" for finding in findings if finding.failed]
    return "\n".join([*lines, "", *notes, *failures])


def _number(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.4g}" if isinstance(value, float) and value < 1 else f"{value:,.1f}".replace(",", "")


def check(baseline_path: Path, current: Mapping[str, Figures], limits: Optional[Limits] = None) -> int:
    """Print the comparison; 0 when nothing regressed, 1 otherwise."""
    baseline = json.loads(Path(baseline_path).read_text())
    limits = limits or Limits(tolerance=baseline.get("tolerance", DEFAULT_TOLERANCE))
    findings = compare(baseline["requests"], current, limits)
    print(report(findings))
    regressions = [finding for finding in findings if finding.failed]
    if regressions:
        print(f"loadtest-check: {len(regressions)} regression(s) against {baseline_path}", file=sys.stderr)
        for finding in regressions:
            print(f"  {finding.line()}", file=sys.stderr)
        return 1
    print(f"loadtest-check: no regression against {baseline_path} (tolerance {limits.tolerance:.0%})")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest._baseline", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("figures", help="print the figures of a locust --json-file")
    show.add_argument("stats", type=Path)
    checking = commands.add_parser("check", help="check a locust --json-file against a baseline")
    checking.add_argument("stats", type=Path)
    checking.add_argument("--baseline", type=Path, required=True)
    checking.add_argument("--tolerance", type=float, help="default: the baseline's, else 0.2")
    checking.add_argument("--min-requests", type=int, default=DEFAULT_MIN_REQUESTS)
    checking.add_argument("--latency-slack-ms", type=float, default=DEFAULT_LATENCY_SLACK_MS)
    args = parser.parse_args(argv)
    current = load_stats(args.stats)
    if args.command == "figures":
        print(json.dumps(current, indent=2))
        return 0
    tolerance = args.tolerance
    if tolerance is None:
        tolerance = json.loads(args.baseline.read_text()).get("tolerance", DEFAULT_TOLERANCE)
    return check(args.baseline, current, Limits(tolerance, args.min_requests, args.latency_slack_ms))


if __name__ == "__main__":
    sys.exit(main())

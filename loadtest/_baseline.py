"""The figures of a locust run: per request, its rate, percentiles and failures.

The figures of one request name (``METHOD name``, as locust reports it, plus
``Aggregated``) are its requests per second over the measured window, its
p50/p95/p99 in milliseconds and its failure ratio, computed from locust's
``--json-file`` stats the way locust computes its own percentiles.
``loadtest._gate`` judges them (``make loadtest-check``). Standard library
only: this runs on PyPy in the test suite as well as in the load test's
CPython environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Mapping, Sequence

AGGREGATED = "Aggregated"
PERCENTILES = {"p50_ms": 0.50, "p95_ms": 0.95, "p99_ms": 0.99}

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

"""The load-test tooling: its figures, the baseline check, the bench's pieces.

The pure parts (``loadtest._baseline``, ``loadtest._data``, the bench's CPU
plan and report) are imported here, on PyPy. locust and matplotlib live in
their own CPython environment (``.venv-loadtest``), so what needs them runs
there as a subprocess: one real, short ``loadtest-check`` against a baseline
out of reach, which must fail naming the request and the figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from loadtest import _baseline, _data, _token
from loadtest.bench import _report
from loadtest.bench._bench import CpuPlan, parse_wrk, plan_cpus
from tests.support import ROOT

LOADTEST_PYTHON = ROOT / ".venv-loadtest" / "bin" / "python"


def entry(name: str, method: str = "GET", times: Optional[Dict[str, int]] = None, failures: int = 0) -> Dict[str, Any]:
    """A stats entry as locust's --json-file writes it (bucket keys are strings)."""
    times = times or {"1.0": 90, "2.0": 8, "10.0": 2}
    return {
        "name": name,
        "method": method,
        "start_time": 1000.0,
        "last_request_timestamp": 1010.0,
        "num_requests": sum(times.values()) + failures,
        "num_failures": failures,
        "response_times": times,
    }


def stats_file(tmp_path: Path, entries: List[Dict[str, Any]]) -> Path:
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(entries))
    return path


def baseline_file(tmp_path: Path, requests: Dict[str, Dict[str, float]], **extra: Any) -> Path:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"tolerance": 0.2, "requests": requests, **extra}))
    return path


def figures(rps: float, p95: float, p99: float, requests: int = 1000) -> Dict[str, float]:
    return {"requests": requests, "rps": rps, "p50_ms": p95 / 2, "p95_ms": p95, "p99_ms": p99, "failure_ratio": 0.0}


# --- figures ---------------------------------------------------------------


def test_percentile_follows_locusts_rule():
    times = {"1.0": 90, "2.0": 8, "10.0": 2}
    assert _baseline.percentile(times, 100, 0.50) == 1.0
    assert _baseline.percentile(times, 100, 0.95) == 2.0
    assert _baseline.percentile(times, 100, 0.99) == 10.0
    assert _baseline.percentile({}, 0, 0.99) == 0.0


def test_figures_per_request_and_aggregated_over_the_measured_window():
    result = _baseline.figures_of([entry("doc small hot"), entry("write doc", "PUT", failures=5)])
    assert result["GET doc small hot"]["rps"] == 10.0  # 100 requests in 10 s
    assert result["GET doc small hot"]["p95_ms"] == 2.0
    assert result["PUT write doc"]["failure_ratio"] == pytest.approx(5 / 105)
    assert result["Aggregated"]["requests"] == 205
    assert result["Aggregated"]["failures"] == 5


# --- comparison --------------------------------------------------------------


def check(base: Dict[str, float], now: Dict[str, float], failures: int = 0) -> List[_baseline.Finding]:
    current = {"GET doc": {**now, "failures": failures, "failure_ratio": failures / now["requests"]}}
    findings = _baseline.compare({"GET doc": base}, current, _baseline.Limits(0.2, 100, 2.0))
    return [finding for finding in findings if finding.failed]


def test_within_tolerance_passes():
    assert check(figures(100, 10, 20), figures(85, 11.9, 23.9)) == []


def test_throughput_drop_beyond_tolerance_fails_naming_the_figure():
    (finding,) = check(figures(100, 10, 20), figures(79, 10, 20))
    assert finding.figure == "rps"
    assert "throughput fell to 79 req/s" in finding.line()


def test_p95_and_p99_rises_beyond_tolerance_fail():
    failed = check(figures(100, 10, 20), figures(100, 12.5, 24.5))
    assert [finding.figure for finding in failed] == ["p95_ms", "p99_ms"]
    assert "p99 rose to 24.5 ms" in failed[1].line()


def test_a_latency_rise_within_the_absolute_slack_passes():
    # 1 ms -> 2.5 ms is +150%, but only 1.5 ms: scheduler noise on loopback.
    assert check(figures(100, 1.0, 1.0), figures(100, 2.5, 2.5)) == []


def test_any_failed_request_fails():
    (finding,) = check(figures(100, 10, 20), figures(100, 10, 20), failures=1)
    assert finding.figure == "failure_ratio"
    assert "1 of 1000 requests failed" in finding.line()


def test_a_request_of_the_baseline_not_made_fails():
    findings = _baseline.compare({"GET doc": figures(100, 10, 20)}, {}, _baseline.Limits())
    assert [finding.failed for finding in findings] == [True]


def test_rare_requests_are_checked_for_failures_only():
    assert check(figures(100, 10, 20, requests=20), figures(1, 100, 200)) == []


# --- the check command ---------------------------------------------------------


def run_check(stats: Path, baseline: Path, python: str = sys.executable) -> subprocess.CompletedProcess:
    command = [python, "-m", "loadtest._baseline", "check", str(stats), "--baseline", str(baseline)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_check_command_fails_against_a_baseline_out_of_reach(tmp_path):
    stats = stats_file(tmp_path, [entry("doc small hot")])
    baseline = baseline_file(tmp_path, {"GET doc small hot": figures(1000, 0.5, 0.5)})
    result = run_check(stats, baseline)
    assert result.returncode == 1
    assert "GET doc small hot: throughput fell to 10 req/s" in result.stderr
    assert "GET doc small hot: p99 rose to 10 ms" in result.stderr


def test_check_command_passes_against_a_generous_baseline(tmp_path):
    stats = stats_file(tmp_path, [entry("doc small hot")])
    baseline = baseline_file(tmp_path, {"GET doc small hot": figures(9, 50, 50)})
    result = run_check(stats, baseline)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no regression" in result.stdout


def test_the_recorded_baseline_is_complete():
    baseline = json.loads((ROOT / "loadtest" / "baseline.json").read_text())
    assert {"cpu", "cores", "note"} <= set(baseline["machine"])
    assert {"users", "user_rate", "warmup", "duration", "workers"} <= set(baseline["scenario"])
    for name, row in baseline["requests"].items():
        assert {"rps", "p50_ms", "p95_ms", "p99_ms", "failure_ratio"} <= set(row), name
        assert row["failures"] == 0, name


def test_locust_f_loadtest_imports_only_locustfiles():
    """``locust -f loadtest/`` imports every .py under it not named ``_*``: tooling must be ``_*``."""
    plain = sorted(
        str(path.relative_to(ROOT / "loadtest"))
        for path in (ROOT / "loadtest").rglob("*.py")
        if not path.name.startswith("_") and "__pycache__" not in path.parts
    )
    assert plain == ["listers.py", "readers.py", "writers.py"]


# --- data, token, bench pieces ------------------------------------------------------


@pytest.mark.parametrize("size", [200, 1000, 10240])
def test_documents_have_the_size_asked_and_the_codecs_encoding(size):
    body = _data.document("s000001", size)
    assert len(body) == size
    assert _data.encode(json.loads(body)) == body
    assert body == _data.document("s000001", size)


def test_a_given_token_is_used_as_is_and_without_a_cli_there_is_none(tmp_path):
    assert _token.resolve(str(tmp_path / "no-python"), None, " tok ").token == "tok"
    resolved = _token.resolve(str(tmp_path / "no-python"), None, "")
    assert resolved.token is None
    assert resolved.headers() == {}


def test_the_bench_can_pin_wrk_and_servers_apart():
    assert plan_cpus("auto", [0, 1]) == CpuPlan([0], [1], plan_cpus("auto", [0, 1]).description)
    assert plan_cpus("auto", range(8)).loadgen == [0, 1]
    assert plan_cpus("auto", [3]).loadgen is None
    assert plan_cpus("off", [0, 1]).server is None


def test_wrk_summary_is_parsed():
    line = (
        'BENCH {"requests":5000,"duration_us":2000000,"bytes":1,"connect":0,"read":0,"write":0,"status":3,'
        '"timeout":0,"p50_us":1500,"p90_us":2000,"p99_us":4000,"max_us":9000,"mean_us":1600.0}'
    )
    run = parse_wrk("Running 2s test\n" + line + "\n", "pypy", "get-small", 1, 1, 0.0)
    assert (run.rps, run.p50_ms, run.p99_ms, run.errors) == (2500.0, 1.5, 4.0, 3)


def synthetic_summary() -> Dict[str, Any]:
    servers = [{"key": "pypy", "label": "PyPy"}, {"key": "nginx", "label": "nginx"}]
    endpoints = [{"key": "get-small", "label": "GET small"}]
    runs = [
        {"server": s, "endpoint": "get-small", "round": r, "order": i, "rps": rps, "p50_ms": 1.0, "p99_ms": p99}
        | {"errors": 0}
        for i, (s, r, rps, p99) in enumerate(
            [("pypy", 1, 900, 4), ("nginx", 1, 9000, 1), ("nginx", 2, 11000, 1), ("pypy", 2, 1100, 6)], 1
        )
    ]
    case = {"rps_min": 0, "rps_max": 0, "p99_min": 0, "p99_max": 0, "errors": 0}
    return {
        "when": "now",
        "command": "python -m loadtest.bench",
        "trustworthy": True,
        "settings": {"warmup_s": 20, "duration_s": 10, "rounds": 2, "connections": 32, "server_env": ""},
        "pinning": "pinned: wrk on cores [0], servers on cores [1]",
        "token": "none",
        "mismatches": [],
        "machine": {"jetway_commit": "abc", "cpu": "cpu", "cores": 2, "memory_gib": 24, "load_average": [1.0]}
        | {"server_python": "PyPy 3.9"},
        "reference": "pypy",
        "servers": servers,
        "endpoints": endpoints,
        "cases": {
            "get-small/pypy": case
            | {"rps": 1000, "rps_min": 900, "rps_max": 1100, "p99_ms": 5, "p99_min": 4}
            | {"p99_max": 6},
            "get-small/nginx": case
            | {"rps": 10000, "rps_min": 9000, "rps_max": 11000, "p99_ms": 1}
            | {"p99_min": 1, "p99_max": 1},
        },
        "worker_rss_mb": {"pypy": [120.5, 151.2]},
        "fresh_rss_mb": [140.2, 148.9],
        "rss_seconds": 60.0,
        "runs": runs,
    }


def test_bench_table_shows_mean_spread_and_ratio_to_jetway_on_pypy():
    text = _report.markdown(synthetic_summary())
    assert "| GET small | 1,000 ±20% | 10,000 ±20% (10.00x) |" in text
    assert "| GET small | 5.00 ±40% | 1.00 ±0% (0.20x) |" in text
    assert "| 4 | 2 | GET small | PyPy | 1,100 | 1.00 | 6.00 | 0 |" in text


def test_bench_report_checks_the_targets_it_has_figures_for():
    text = _report.markdown(synthetic_summary())
    assert "| 200 B read, 2 workers / nginx | 0.10 | >= 0.5 | **no** |" in text
    assert "| 200 B read p99, 2 workers (ms) | 5.00 | <= 15 | yes |" in text
    fresh = "resident memory per worker after a 60 s run of the 200 B read, fresh Jetway PyPy, 2 workers (MB, each)"
    assert f"| {fresh} | 140, 149 | <= 150 | yes |" in text
    assert "after the whole bench, PyPy (MB, each; beyond the target) | 120, 151 | <= 150 | **no** |" in text
    assert "10 KB read" not in text  # no such case in this summary


# --- the real thing, in the load-test environment ------------------------------------


def loadtest_python() -> Path:
    if not LOADTEST_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail("no .venv-loadtest: `make test` builds it (make setup-loadtest)")
        pytest.skip("no .venv-loadtest (make setup-loadtest)")
    return LOADTEST_PYTHON


def test_bench_plot_is_drawn(tmp_path):
    code = (
        "import json, sys; from pathlib import Path; from loadtest.bench import _report; "
        "_report.plot(json.loads(sys.stdin.read()), Path(sys.argv[1]))"
    )
    png = tmp_path / "bench.png"
    subprocess.run(
        [str(loadtest_python()), "-c", code, str(png)],
        cwd=ROOT,
        input=json.dumps(synthetic_summary()),
        text=True,
        check=True,
        timeout=120,
    )
    assert png.read_bytes().startswith(b"\x89PNG")


SHORT_SCENARIO = {
    "users": 4,
    "user_rate": 10.0,
    "warmup": 1.0,
    "duration": 4.0,
    "workers": 1,
    "locust_args": [
        *("--small-docs", "40", "--large-docs", "10", "--write-docs", "10", "--hot-docs", "5"),
        *("--page-size", "10", "--max-pages", "2", "--multi-get", "5"),
    ],
}


def test_loadtest_check_fails_on_a_regression_naming_request_and_figure(tmp_path):
    """A real (short) `make loadtest-check` against a baseline out of reach."""
    python = loadtest_python()
    out_of_reach = {"GET doc small hot": figures(1e6, 0.01, 0.01, requests=10**6)}
    baseline = baseline_file(tmp_path, out_of_reach, scenario=SHORT_SCENARIO)
    command = [str(python), "-m", "loadtest._run", "check", "--baseline", str(baseline)]
    # No absolute latency slack: 0.01 ms is then out of reach even on an idle machine.
    command += ["--results", str(tmp_path / "results"), "--name", "short", "--latency-slack-ms", "0"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "GET doc small hot: throughput fell to" in result.stderr
    assert "GET doc small hot: p95 rose to" in result.stderr
    for suffix in (".json", ".html", ".figures.json", "_stats.csv"):
        assert (tmp_path / "results" / f"short{suffix}").exists(), suffix

    # The same run's stats pass against a baseline they can meet: nothing failed.
    generous = {"Aggregated": figures(0.001, 1e6, 1e6)}
    result = run_check(tmp_path / "results" / "short.json", baseline_file(tmp_path, generous), str(python))
    assert result.returncode == 0, result.stdout + result.stderr

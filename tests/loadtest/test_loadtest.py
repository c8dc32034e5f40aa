"""The load-test tooling: its figures, the baseline check, the bench's pieces.

The pure parts (``loadtest._baseline``, ``loadtest._gate``'s verdict,
``loadtest._data``, the bench's CPU plan and report) are imported here, on
PyPy. locust and matplotlib live in their own CPython environment
(``.venv-loadtest``), so what needs them runs there as a subprocess: a real,
short ``loadtest-check`` of HEAD beside this tree, which must fail on a
slowdown made with ``JETWAY_DEBUG_BURN_US`` and pass without it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from loadtest import _baseline, _busy, _data, _gate, _token
from loadtest.bench import _report
from loadtest.bench._bench import CpuPlan, jetway_settings, parse_wrk, plan_cpus
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


# --- the gate: verdicts -------------------------------------------------------


def side(cpu_us: float, p50_ms: float = 10.0, requests: int = 1000, failures: int = 0) -> _gate.Round:
    row = {"requests": requests, "rps": 100.0, "p50_ms": p50_ms, "p95_ms": p50_ms * 2, "p99_ms": p50_ms * 3}
    return _gate.Round(cpu_us, {"GET doc": {**row, "failures": failures}})


def verdict(baseline: List[_gate.Round], current: List[_gate.Round]) -> List[str]:
    return _gate.verdict(baseline, current, _gate.Limits(0.12, 0.5, 2.0, 50))[1]


def test_the_same_cpu_per_request_passes():
    assert verdict([side(400), side(380), side(420)], [side(410), side(370), side(430)]) == []


def test_cpu_per_request_is_judged_by_the_median_of_the_rounds_ratios():
    # One round 40% up (a noisy neighbour during it), the others level: the median ignores it.
    assert verdict([side(400)] * 3, [side(560), side(400), side(410)]) == []
    (failure,) = verdict([side(400)] * 3, [side(520), side(470), side(400)])
    assert failure.startswith("Aggregated: worker CPU per request rose to 1.18x")


def test_a_p50_rise_fails_beyond_the_bound_and_the_slack_naming_the_request():
    assert verdict([side(400, 10.0)] * 3, [side(400, 14.0)] * 3) == []  # 1.4x: within 1.5x
    assert verdict([side(400, 1.0)] * 3, [side(400, 2.5)] * 3) == []  # 2.5x, but 1.5 ms: loopback noise
    (failure,) = verdict([side(400, 10.0)] * 3, [side(400, 16.0)] * 3)
    assert failure == (
        "GET doc: p50 rose to 1.60x the baseline's (16.00 against 10.00 ms; past 1.50x and 2 ms in 3 of 3 rounds)"
    )


def test_a_p50_that_rose_in_fewer_than_four_rounds_of_five_passes():
    """A loaded machine's spike lands in a round or two; a wait added to a request shows in every one."""
    baseline = [side(400, 10.0)] * 5
    spiky = [side(400, 30.0), side(400, 25.0), side(400, 10.5), side(400, 30.0), side(400, 9.0)]
    assert verdict(baseline, spiky) == []  # the median ratio is 2.5x, but it rose in 3 rounds
    (failure,) = verdict(baseline, [*spiky[:4], side(400, 20.0)])
    assert failure.endswith("in 4 of 5 rounds)")


def test_beside_a_busy_figure_the_locust_cpu_figure_is_shown_not_judged():
    limits = _gate.Limits(0.25, 1.0, 2.0, 50, busy_tolerance=0.20, stale_tolerance=0.20)
    lines, failures = _gate.verdict([busy(300, 30.0)] * 3, [busy(600, 30.0)] * 3, limits)
    assert failures == []
    assert any(line.startswith("worker CPU per request (µs)") and "REGRESSION" in line for line in lines)


def test_any_failed_request_fails_and_rare_requests_are_not_judged_by_latency():
    assert verdict([side(400)] * 3, [side(400, failures=1)] * 3) == ["GET doc: 3 requests failed"]
    assert verdict([side(400, 1.0, requests=10)] * 3, [side(400, 50.0, requests=10)] * 3) == []


def test_a_busy_slice_with_errors_is_run_again_then_fails(monkeypatch):
    """A stall on a loaded machine (wrk's timeouts) costs a slice, not the gate; errors every time still fail it,
    and a warm-up slice with errors is only not counted."""
    runs: List[str] = []

    def slice_(sides: Any, seconds: float) -> List[Any]:
        runs.append("run")
        if len(runs) < failing:
            raise _busy.BusyErrors("the busy phase against baseline had errors: {'timeout': 16}")
        return [(0.5, 10_000), (1.0, 10_000)]

    monkeypatch.setattr(_busy, "_slice", slice_)
    sides = ["a", "b"]
    failing = 3  # two slices with errors, then one without
    assert _busy.measure_busy(sides, 4.0, slices=1) == [50.0, 100.0] and len(runs) == 3  # type: ignore[arg-type]
    runs.clear()
    failing = _busy.SLICE_TRIES + 1
    with pytest.raises(_busy.BusyErrors):
        _busy.measure_busy(sides, 4.0, slices=1)  # type: ignore[arg-type]
    assert len(runs) == _busy.SLICE_TRIES
    runs.clear()
    failing = 2  # the first warm-up slice had errors: skipped, then two that agree
    assert _busy.warm_up(sides) == [[50.0, 100.0], [50.0, 100.0]] and len(runs) == 3  # type: ignore[arg-type]


def busy(locust_cpu_us: float, busy_cpu_us: float) -> _gate.Round:
    round_ = side(locust_cpu_us)
    round_.busy_cpu_us_per_request = busy_cpu_us
    return round_


def test_the_busy_figure_fails_a_rise_past_its_own_tighter_bound():
    limits = _gate.Limits(0.25, 0.5, 2.0, 50, busy_tolerance=0.10, stale_tolerance=0.15)
    level = [busy(800, 40.0), busy(820, 41.0), busy(790, 39.0)]
    assert _gate.verdict(level, [busy(810, 41.0), busy(800, 42.5), busy(800, 40.0)], limits)[1] == []
    # 20 µs more per request: invisible beside ~800 µs of idle costs, half again the busy figure.
    lines, failures = _gate.verdict(level, [busy(820, 60.0), busy(830, 61.0), busy(800, 59.0)], limits)
    assert failures == [
        "Aggregated: busy worker CPU per request rose to 1.50x the baseline's (60.0 against 40.0 µs; allowed 1.10x)"
    ]
    assert any(line.startswith("busy worker CPU per request (µs)") and "REGRESSION" in line for line in lines)


def test_a_baseline_dearer_than_this_tree_beyond_the_noise_fails_as_stale_naming_the_command():
    limits = _gate.Limits(0.25, 0.5, 2.0, 50, busy_tolerance=0.10, stale_tolerance=0.15)
    baseline = [busy(800, 40.0)] * 3
    assert _gate.verdict(baseline, [busy(800, 35.0)] * 3, limits)[1] == []  # 0.88x: within the noise
    lines, (failure,) = _gate.verdict(baseline, [busy(800, 30.0)] * 3, limits)  # a tree 25% cheaper
    assert failure.startswith("Aggregated: busy worker CPU per request fell to 0.75x the baseline's")
    assert failure.endswith("re-record it: make loadtest-record && git commit loadtest/baseline.json")
    assert any("STALE BASELINE" in line for line in lines)


def test_rounds_without_a_busy_phase_are_judged_on_the_rest():
    limits = _gate.Limits(0.25, 0.5, 2.0, 50)
    lines, failures = _gate.verdict([side(400)] * 3, [side(400)] * 3, limits)
    assert failures == [] and not any(line.startswith("busy") for line in lines)


def test_the_recorded_baseline_names_a_commit_and_the_gates_rounds():
    baseline = json.loads((ROOT / "loadtest" / "baseline.json").read_text())
    commit = baseline["commit"]
    exists = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
    assert exists.returncode == 0, f"the baseline commit {commit} is not in this repository"
    assert {"users", "user_rate", "workers"} <= set(baseline["scenario"])
    assert {"rounds", "round_seconds", "warmup_seconds", "cpu_tolerance"} <= set(baseline["gate"])


def test_locust_f_loadtest_imports_only_locustfiles():
    """``locust -f loadtest/`` imports every .py under it not named ``_*``: tooling must be ``_*``."""
    plain = sorted(
        str(path.relative_to(ROOT / "loadtest"))
        for path in (ROOT / "loadtest").rglob("*.py")
        if not path.name.startswith("_") and "__pycache__" not in path.parts
    )
    assert plain == ["batchers.py", "listers.py", "readers.py", "writers.py"]


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


def test_the_bench_runs_jetway_with_production_defaults_unless_told_otherwise():
    assert dict(jetway_settings("")) == {"JETWAY_AUTH": "on", "JETWAY_ACCESS_LOG": "on"}
    told = dict(jetway_settings("JETWAY_ACCESS_LOG=off JETWAY_GRACE=3"))
    assert told == {"JETWAY_AUTH": "on", "JETWAY_ACCESS_LOG": "off", "JETWAY_GRACE": "3"}
    # A server row's own settings (wait1's replica) win over both.
    own = dict(jetway_settings("JETWAY_WRITE_REPLICAS=0", (("JETWAY_WRITE_REPLICAS", "1"),)))
    assert own["JETWAY_WRITE_REPLICAS"] == "1"


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


def test_the_batch_target_compares_documents_per_second():
    summary = synthetic_summary()
    case = summary["cases"]["get-small/pypy"]
    summary["cases"]["batch-100/pypy"] = case | {"rps": 300, "documents_per_s": 30000}
    summary["cases"]["put-1c/pypy"] = case | {"rps": 2000, "documents_per_s": 2000}
    text = _report.markdown(summary)
    assert "| 100 PUTs of 200 B on 1 connection, one batch / one request each | 15.00 | >= 10 | yes |" in text


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


def short_check(tmp_path: Path, name: str, burn_us: int = 0) -> subprocess.CompletedProcess:
    """A real, short `make loadtest-check`: HEAD beside this tree, 2 rounds of 4 s."""
    python = loadtest_python()
    baseline = tmp_path / "baseline.json"
    record = [str(python), "-m", "loadtest._run", "record", "--baseline", str(baseline), "--workers", "1"]
    record += ["--users", "8", "--user-rate", "10"]
    subprocess.run(record, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    command = [str(python), "-m", "loadtest._run", "check", "--baseline", str(baseline), "--name", name]
    command += ["--results", str(tmp_path / "results"), "--rounds", "3", "--round-seconds", "4"]
    command += ["--warmup-seconds", "3", "--cpu-tolerance", "0.5", "--latency-tolerance", "4"]
    command += ["--busy-seconds", "4", "--busy-tolerance", "0.5", "--stale-tolerance", "0.5"]
    command += ["--", *SHORT_LOCUST_ARGS]
    env = {**os.environ, "JETWAY_DEBUG_BURN_US": str(burn_us)} if burn_us else dict(os.environ)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


SHORT_LOCUST_ARGS = [
    *("--small-docs", "40", "--large-docs", "10", "--write-docs", "10", "--hot-docs", "5"),
    *("--page-size", "10", "--max-pages", "2", "--multi-get", "5"),
]


@pytest.mark.slow  # ~80 s here
@pytest.mark.timeout(700)  # two gate runs of two servers each: minutes when the machine is busy
def test_loadtest_check_fails_on_a_real_slowdown_and_passes_without_it(tmp_path):
    """The gate end to end: a 2 ms burn per request (several times the request's own CPU) must fail it,
    naming the figure; the same build against itself must pass (bounds wide enough for a short run)."""
    slowed = short_check(tmp_path, "slowed", burn_us=2000)
    assert slowed.returncode == 1, slowed.stdout[-3000:] + slowed.stderr[-3000:]
    assert "Aggregated: busy worker CPU per request rose to" in slowed.stderr
    assert "JETWAY_DEBUG_BURN_US=2000 on this tree" in slowed.stdout
    report = (tmp_path / "results" / "slowed.txt").read_text()
    assert "worker CPU per request" in report and "REGRESSION" in report

    level = short_check(tmp_path, "level")
    assert level.returncode == 0, level.stdout[-3000:] + level.stderr[-3000:]
    assert "loadtest-check: passed" in level.stdout


# --- the PUT's tail and the bulk figures ---------------------------------------------


def test_the_gc_log_s_pauses_are_each_event_s_ticks_from_its_start_to_its_end():
    from loadtest.studies._put_tail import pauses

    log = (
        b"[100] {gc-minor\n[105] {gc-minor-walkroots\n[107] gc-minor-walkroots}\nminor collect\n[130] gc-minor}\n"
        b"[200] {gc-collect-step\nstarting gc state:  MARKING\n[2c0] gc-collect-step}\n"
        b"[300] {gc-minor\n[310] gc-minor}\n[400] {gc-collect-step\n"  # a step the run's end cut: not counted
    )
    found, first, last = pauses(log)
    assert found == {"gc-minor": [0x30, 0x10], "gc-collect-step": [0xC0]}
    assert (first, last) == (0x100, 0x400)


def test_an_import_s_lines_are_documents_of_about_200_bytes_each_naming_its_id():
    from loadtest.studies._bulk import ndjson

    lines = ndjson(5, 3).splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["d000000005", "d000000006", "d000000007"]
    assert all(190 <= len(line) <= 210 for line in lines)


def test_the_index_writes_study_finds_the_lines_its_parts_take_out_of_the_put_script():
    """``_index_writes --parts`` measures the PUT script without its index ZADDs and entries' move: those lines."""
    from cache.documents.scripts import PUT
    from loadtest.studies._index_writes import _INDEX_ZADD, _MOVE_ENTRIES

    assert PUT.source.decode().count(_INDEX_ZADD) == 1
    assert PUT.source.decode().count(_MOVE_ENTRIES) == 1

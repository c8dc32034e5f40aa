"""``make loadtest``, ``make loadtest-check``, ``make loadtest-record``.

Each starts a private redis-server (unix socket, temporary directory) and
Jetway (``python -m api serve``, N workers, no access log), finds or makes a
token, runs ``locust -f loadtest/`` headless against it (seeding, a warm-up
whose figures are dropped, then the measured window), and writes locust's
CSV, JSON and HTML report and the run's figures under ``loadtest/results/``.

- ``run``: just that; exits non-zero if a request failed.
- ``check``: the baseline commit and this tree side by side, in alternating
  rounds of the baseline's scenario (``loadtest._gate``): non-zero, naming
  request and figure, on a regression.
- ``record``: makes HEAD the baseline: writes its commit, the scenario and
  the gate's rounds and bounds to ``loadtest/baseline.json``.

Everything it starts is stopped by pid when it ends, also on failure or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from loadtest import _baseline, _busy, _gate, _token
from loadtest._servers import PYPY, Processes, stop_on_sigterm
from loadtest._token import ROOT

HERE = ROOT / "loadtest"
BASELINE = HERE / "baseline.json"
RESULTS = HERE / "results"
# What `make loadtest` runs unless told otherwise (LOADTEST_* variables or options).
DEFAULTS: Dict[str, Any] = {
    "users": 20,
    "user_rate": 5.0,
    "warmup": 20.0,
    "duration": 60.0,
    "workers": os.cpu_count() or 1,
    "locust_args": [],
}
# The gate's load: heavier than `make loadtest`'s, so that the measured
# requests outweigh each run's seeding, and its rounds (loadtest/_gate.py).
GATE_SCENARIO: Dict[str, Any] = {**DEFAULTS, "users": 50, "user_rate": 10.0}
GATE_DEFAULTS: Dict[str, Any] = {
    "rounds": 5,
    "round_seconds": 10.0,
    "warmup_seconds": 15.0,
    "cpu_tolerance": _gate.DEFAULT_CPU_TOLERANCE,
    "latency_tolerance": _gate.DEFAULT_LATENCY_TOLERANCE,
    "latency_slack_ms": _gate.DEFAULT_LATENCY_SLACK_MS,
    "busy_seconds": 6.0,
    "busy_tolerance": _gate.DEFAULT_BUSY_TOLERANCE,
    "stale_tolerance": _gate.DEFAULT_STALE_TOLERANCE,
}
# Seeding and start-up come on top of warm-up and measuring; past this, give up.
SLACK_SECONDS = 600


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else None
    args = _parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.locust_args = extra
    stop_on_sigterm()
    if args.command == "record":
        return _record(args)
    if args.command == "check":
        return _check(args, json.loads(args.baseline.read_text()))
    scenario = _scenario(args, {})
    figures = run(scenario, args.python, args.results, args.name or "loadtest-run", args.locustfile)
    if not figures:
        print("loadtest: the run measured nothing (see locust's log above)", file=sys.stderr)
        return 2
    failed = figures.get(_baseline.AGGREGATED, {}).get("failures", 0)
    return 1 if failed else 0


def run(
    scenario: Dict[str, Any], python: Path, results: Path, name: str, locustfile: str = str(HERE)
) -> Optional[Dict[str, Any]]:
    """One headless locust run against a Jetway started here; its figures, or None."""
    results.mkdir(parents=True, exist_ok=True)
    prefix = results / name
    for stale in [*results.glob(f"{name}_*.csv"), *(Path(f"{prefix}{end}") for end in (".json", ".html"))]:
        stale.unlink(missing_ok=True)
    print(f"loadtest: scenario {json.dumps(scenario)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="jetway-loadtest-") as scratch, Processes(Path(scratch)) as processes:
        redis_url = processes.redis()
        base = processes.jetway("jetway", python, redis_url, scenario["workers"])
        token = _token.resolve(str(python), redis_url, os.environ.get("JETWAY_TOKEN", ""))
        print(f"loadtest: Jetway ({scenario['workers']} workers) on {base}; token: {token.source}", flush=True)
        command = _locust_command(scenario, base, prefix, locustfile)
        env = {**os.environ, "REDIS_URL": redis_url, "JETWAY_TOKEN": token.token or ""}
        env["LOCUST_JETWAY_PYTHON"] = str(python)
        locust = subprocess.Popen(command, cwd=ROOT, env=env)
        try:
            code = locust.wait(scenario["warmup"] + scenario["duration"] + SLACK_SECONDS)
        finally:
            processes.stop(locust)
    stats = Path(f"{prefix}.json")
    # 1 is locust's "some requests failed", which the figures show; more is locust's own failure.
    if code not in (0, 1) or not stats.exists():
        print(f"loadtest: locust exited with {code}", file=sys.stderr)
        return None
    figures = _baseline.load_stats(stats)
    summary = {"scenario": scenario, "machine": machine(python), "requests": figures}
    Path(f"{prefix}.figures.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(_figures_table(figures))
    print(f"loadtest: locust exited with {code}; results in {prefix}{{.html,.json,.figures.json,_*.csv}}")
    return figures


def _locust_command(scenario: Dict[str, Any], base: str, prefix: Path, locustfile: str) -> List[str]:
    locust = Path(sys.executable).with_name("locust")
    users = str(scenario["users"])
    run_time = int(scenario["warmup"] + scenario["duration"] + SLACK_SECONDS)
    return [
        str(locust),
        "-f",
        locustfile,
        "--headless",
        "--only-summary",
        "-H",
        base,
        "-u",
        users,
        "-r",
        users,
        "-t",
        f"{run_time}s",
        "--stop-timeout",
        "5",
        "--user-rate",
        str(scenario["user_rate"]),
        "--warmup",
        str(scenario["warmup"]),
        "--measure-time",
        str(scenario["duration"]),
        "--csv",
        str(prefix),
        "--html",
        f"{prefix}.html",
        "--json-file",
        str(prefix),
        *scenario["locust_args"],
    ]


def _figures_table(figures: Dict[str, Dict[str, float]]) -> str:
    lines = [f"{'request':32} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'failed':>7}"]
    for request, row in figures.items():
        lines.append(
            f"{request:32} {row['rps']:8.1f} {row['p50_ms']:8.2f} {row['p95_ms']:8.2f} "
            f"{row['p99_ms']:8.2f} {row['failures']:7.0f}"
        )
    return "\n".join(lines)


def _check(args: argparse.Namespace, baseline: Dict[str, Any]) -> int:
    """This tree against the baseline commit, side by side (``loadtest._gate``)."""
    commit = baseline.get("commit")
    if not commit:
        print("loadtest-check: the baseline names no commit; run make loadtest-record", file=sys.stderr)
        return 2
    scenario = _scenario(args, baseline["scenario"])
    gate = _gate_settings(args, baseline.get("gate", {}))
    limits = _gate.Limits(
        gate["cpu_tolerance"],
        gate["latency_tolerance"],
        gate["latency_slack_ms"],
        busy_tolerance=gate["busy_tolerance"],
        stale_tolerance=gate["stale_tolerance"],
    )
    # Taken out of the environment the servers inherit: the baseline must not burn.
    burn = os.environ.pop(_gate.BURN_VARIABLE, "")
    sides = [
        _gate.Side("baseline", _gate.baseline_tree(commit), {}),
        # Only this tree slows down when asked: against itself, a burn on both sides would cancel out.
        _gate.Side("this-tree", ROOT, {_gate.BURN_VARIABLE: burn} if burn else {}),
    ]
    name = args.name or "loadtest-check"
    args.results.mkdir(parents=True, exist_ok=True)
    print(f"loadtest-check: baseline {commit[:12]} against this tree ({_git_commit()})")
    print(f"loadtest-check: scenario {json.dumps(scenario)}")
    print(
        f"loadtest-check: {gate['rounds']} rounds of {gate['round_seconds']:g} s of locust and "
        f"{gate['busy_seconds']:g} s of wrk, after {gate['warmup_seconds']:g} s"
    )
    if burn:
        print(f"loadtest-check: {_gate.BURN_VARIABLE}={burn} on this tree (a slowdown made on purpose)")
    measured: Dict[str, List[_gate.Round]] = {side.name: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="jetway-loadtest-") as scratch, Processes(Path(scratch)) as processes:
        for side in sides:
            _gate.start(side, processes, scenario["workers"], args.python)
        # PyPy's JIT first; not counted
        _measure_round(sides, {**scenario, "warmup": 0.0, "duration": gate["warmup_seconds"]}, args, f"{name}-warm")
        busy = gate["busy_seconds"]
        if busy:
            for side in sides:
                _busy.seed(side)
            warm = _busy.warm_up(sides)  # the busy mix compiled too; not counted
            slices = ", ".join("/".join(f"{figure:.0f}" for figure in figures) for figures in warm)
            names = "/".join(side.name for side in sides)
            print(f"loadtest-check: busy warm-up, µs per request by slice ({names}): {slices}")
        for number in range(gate["rounds"]):
            order = sides if number % 2 == 0 else sides[::-1]
            window = {**scenario, "warmup": 1.0, "duration": gate["round_seconds"]}
            figures = _measure_round(order, window, args, f"{name}-{number + 1}")
            for side, cpu_busy in zip(order, _busy.measure_busy(order, busy) if busy else [0.0] * len(order)):
                round_figures = figures[order.index(side)]
                round_figures.busy_cpu_us_per_request = cpu_busy
                measured[side.name].append(round_figures)
                print(
                    f"loadtest-check: round {number + 1}, {side.name}: {round_figures.cpu_us_per_request:.1f} µs "
                    f"of worker CPU per request, {cpu_busy:.1f} µs busy"
                )
    lines, failures = _gate.verdict(measured["baseline"], measured["this-tree"], limits)
    report = "\n".join(lines)
    print(report)
    (args.results / f"{name}.txt").write_text(report + "\n" + "\n".join(failures) + "\n")
    for failure in failures:
        print(f"loadtest-check: {failure}", file=sys.stderr)
    print(f"loadtest-check: {'FAILED' if failures else 'passed'}; report in {args.results / (name + '.txt')}")
    return 1 if failures else 0


def _gate_settings(args: argparse.Namespace, recorded: Dict[str, Any]) -> Dict[str, Any]:
    """The gate's rounds and bounds: given here (or LOADTEST_*), else recorded, else the defaults."""
    settings = {**GATE_DEFAULTS, **recorded}
    for key in GATE_DEFAULTS:
        if getattr(args, key, None) is not None:
            settings[key] = getattr(args, key)
    return settings


def _measure_round(
    sides: List[_gate.Side], scenario: Dict[str, Any], args: argparse.Namespace, name: str
) -> List[_gate.Round]:
    """The scenario against every side at once (``sides``' order: the order their locusts start in)."""
    runs = []
    for side in sides:
        prefix = args.results / f"{name}-{side.name}"
        Path(f"{prefix}.json").unlink(missing_ok=True)
        runs.append((side, _locust_command(scenario, side.base, prefix, args.locustfile), Path(f"{prefix}.json")))
    return _gate.measure_together(runs)


def _record(args: argparse.Namespace) -> int:
    """HEAD becomes the baseline: what the gate needs to run it again beside a later tree."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    if dirty.stdout.strip():
        print("loadtest-record: uncommitted changes are not part of the baseline (it is a commit)", file=sys.stderr)
    gate = _gate_settings(args, {})
    baseline = {
        "about": "the commit `make loadtest-check` runs beside the tree it checks, and how (loadtest/_gate.py)",
        "commit": commit.stdout.strip(),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(args.python),
        # The gate's rounds replace the scenario's warm-up and duration.
        "scenario": {k: v for k, v in _scenario(args, GATE_SCENARIO).items() if k not in ("warmup", "duration")},
        "gate": gate,
    }
    args.baseline.write_text(json.dumps(baseline, indent=2) + "\n")
    print(f"loadtest-record: wrote {args.baseline}: baseline {baseline['commit'][:12]}")
    return 0


def machine(python: Path) -> Dict[str, Any]:
    """What the figures were measured on."""
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "load_average": [round(load, 2) for load in os.getloadavg()],
        "server_python": _python_version(python),
        "loadgen_python": platform.python_implementation() + " " + platform.python_version(),
        "jetway_commit": _git_commit(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> Optional[float]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def _python_version(python: Path) -> str:
    code = "import platform; print(platform.python_implementation(), platform.python_version())"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return result.stdout.strip() or "unknown"


def _git_commit() -> str:
    result = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return result.stdout.strip() or "unknown"


def _scenario(args: argparse.Namespace, recorded: Dict[str, Any]) -> Dict[str, Any]:
    """Options given here (or as LOADTEST_*), else the baseline's (check), else the defaults."""
    scenario: Dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        given = getattr(args, key)
        if given is None:
            given = os.environ.get(f"LOADTEST_{key.upper()}") or None
            if given is not None:
                given = given.split() if key == "locust_args" else type(default)(given)
        scenario[key] = given if given is not None else recorded.get(key, default)
    return scenario


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest._run",
        description=__doc__.split("\n")[0],
        epilog="Arguments after -- go to locust (or LOADTEST_LOCUST_ARGS), e.g. -- --writer-weight 0.",
    )
    parser.add_argument("command", choices=("run", "check", "record"))
    parser.add_argument("--users", type=int, help=f"locust users (LOADTEST_USERS, {DEFAULTS['users']})")
    parser.add_argument(
        "--user-rate", type=float, help=f"visits/s per user (LOADTEST_USER_RATE, {DEFAULTS['user_rate']})"
    )
    parser.add_argument("--warmup", type=float, help=f"seconds, not counted (LOADTEST_WARMUP, {DEFAULTS['warmup']})")
    parser.add_argument("--duration", type=float, help=f"seconds measured (LOADTEST_DURATION, {DEFAULTS['duration']})")
    parser.add_argument("--workers", type=int, help="Jetway workers (LOADTEST_WORKERS, the cores)")

    def number(name: str, kind: Any, what: str) -> None:
        variable = "LOADTEST_" + name.upper()
        given = os.environ.get(variable)
        default = kind(given) if given else None
        option = "--" + name.replace("_", "-")
        parser.add_argument(option, dest=name, type=kind, default=default, help=f"check: {what} ({variable})")

    number("rounds", int, f"rounds per side (default {GATE_DEFAULTS['rounds']})")
    number("round_seconds", float, f"seconds per round (default {GATE_DEFAULTS['round_seconds']:g})")
    number("warmup_seconds", float, f"seconds of unmeasured load per side first ({GATE_DEFAULTS['warmup_seconds']:g})")
    number("cpu_tolerance", float, f"allowed rise of CPU per request under locust ({_gate.DEFAULT_CPU_TOLERANCE})")
    number("busy_seconds", float, f"seconds of wrk per round, 0 for none ({GATE_DEFAULTS['busy_seconds']:g})")
    number("busy_tolerance", float, f"allowed rise of busy CPU per request ({_gate.DEFAULT_BUSY_TOLERANCE})")
    number("stale_tolerance", float, f"busy CPU per request this far below: stale ({_gate.DEFAULT_STALE_TOLERANCE})")
    number("latency_tolerance", float, f"allowed rise of a p50 ({_gate.DEFAULT_LATENCY_TOLERANCE})")
    number("latency_slack_ms", float, f"a p50 rise under this many ms passes ({_gate.DEFAULT_LATENCY_SLACK_MS:g})")
    parser.add_argument(
        "--locustfile",
        default=os.environ.get("LOADTEST_LOCUSTFILE") or str(HERE),
        help="locust -f: files or folder, comma-separated (LOADTEST_LOCUSTFILE, default loadtest/)",
    )
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--name", help="file name prefix under --results (default loadtest-COMMAND)")
    parser.add_argument("--python", type=Path, default=PYPY, help="the Python Jetway runs on (.venv/bin/python)")
    return parser


if __name__ == "__main__":
    sys.exit(main())

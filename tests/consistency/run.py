"""Run scenarios, record histories, check them: ``python -m tests.consistency.run --scenario none``.

For each scenario: start the stack (``stack.py``), then per history a fresh
collection, a feed position taken before the first write, a resuming SSE
reader, the clients (``recorder.py``) and the fault (``faults.py``); after
the run, the whole feed by long poll. The history (records, faults, feed,
the reader's events) is written as JSON to ``--out``, then checked: the
feed in Python (``feed.py``), linearizability by the Go checker
(``checker/``, Porcupine), which writes the violating history's
visualization as HTML beside the JSON. One line per history on stdout,
and a JSON summary of every history at the end (``--summary``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import requests

from tests.consistency import feed as feeds
from tests.consistency.faults import SCENARIOS, Fault, Scenario
from tests.consistency.recorder import Recorder
from tests.consistency.stack import Stack
from tests.consistency.staleness import stale_reads
from tests.support import ROOT

CHECKER_SOURCE = Path(__file__).resolve().parent / "checker"
# Go on the PATH (Debian's golang-go), else where the upstream tarball goes; Porcupine is vendored (checker/vendor).
GO = (
    os.environ.get("GO")
    or shutil.which("go")
    or next((p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if os.path.exists(p)), "go")
)


def build_checker(out: Path) -> Path:
    """``go build`` the checker into ``out`` (cached by Go: a second build is quick)."""
    binary = out / "porcupine-checker"
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([GO, "build", "-o", str(binary), "."], cwd=CHECKER_SOURCE, check=True, timeout=300)
    return binary


# Seconds one check may search (all documents together) before it answers unknown.
CHECK_SECONDS = float(os.environ.get("CONSISTENCY_CHECK_SECONDS", "60"))


def run_checker(binary: Path, history: Path, *flags: str, timeout: float = CHECK_SECONDS) -> Dict[str, Any]:
    """The checker's verdict (its JSON on stdout); exit 0 ok, 1 violation, 2 unknown (timed out)."""
    result = subprocess.run(
        [str(binary), *flags, "-timeout", f"{int(timeout)}s", str(history)],
        capture_output=True,
        text=True,
        timeout=timeout * 2 + 60,
    )
    if result.returncode not in (0, 1, 2):
        raise RuntimeError(f"checker failed ({result.returncode}): {result.stderr}")
    return json.loads(result.stdout)


def record_history(stack: Stack, scenario: Scenario, number: int, args: argparse.Namespace, out: Path) -> Path:
    collection = f"h{number}"
    seed = args.seed + number
    docs = scenario.docs or args.docs
    start = feeds.position_now(stack.base, stack.token, collection)
    reader = feeds.ResumingReader(stack.port, stack.token, collection, start, seed).start()
    recorder = Recorder(
        stack.port, stack.token, collection, args.clients, docs, args.ops, args.seconds, seed, scenario.mix
    )
    fault = Fault(scenario, stack, recorder.progress, seed)
    try:
        fault.start()
        recorder.run(busy=lambda: not fault.done.is_set())
        _wait_ready(stack)
        feed = feeds.read_all(stack.base, stack.token, collection, start)
        reader.finish(len(feed))
    finally:  # no thread of this history outlives it, whatever failed
        recorder.stopping.set()
        reader.stopping.set()
        fault.done.set()
    history = {
        "scenario": scenario.name,
        "does": scenario.does,
        "collection": collection,
        "seed": seed,
        "clients": args.clients,
        "docs": docs,
        "mix": scenario.mix,
        "started": recorder.started,
        "ended": recorder.ended,
        "faults": fault.log,
        "fault_error": fault.error,
        "lossy_windows": _lossy_windows(scenario, fault.log),
        "records": recorder.records,
        "feed": feed,
        "reader": {"events": reader.events, "reconnects": reader.reconnects, "errors": dict(reader.errors)},
    }
    path = out / f"{scenario.name}-{number}.json"
    path.write_text(json.dumps(history))
    return path


def _lossy_windows(scenario: Scenario, log: List[Dict[str, Any]]) -> List[List[int]]:
    """Where acknowledged writes may be lost: from a second before the failover to a second after the switch.

    Writes the old primary acknowledged before the promotion may be lost
    with it (asynchronous replication); one acknowledged by the demoted
    primary after the sentinels announced the switch is a client that did
    not follow, not an inherent loss.
    """
    if not scenario.lossy:
        return []
    return [[entry["at"] - 1_000_000_000, entry["switched"] + 1_000_000_000] for entry in log if "switched" in entry]


def _wait_ready(stack: Stack, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if requests.get(stack.base + "/readyz", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)


def check_history(path: Path, binary: Path, scenario: Scenario, delta_ms: float) -> Dict[str, Any]:
    history = json.loads(path.read_text())
    records = history["records"]
    lossy = scenario.lossy
    feed_result = feeds.check(records, history["feed"], lossy=lossy)
    reader_problems = feeds.compare(history["reader"]["events"], history["feed"])
    html = path.with_suffix(".html")
    strict = run_checker(binary, path, "-html", str(html))
    if lossy and strict["result"] != "ok":
        # Only where the scenario says acknowledged writes may be lost, and only inside its window.
        lossy_html = str(path.with_suffix(".lossy.html"))
        strict["strict_result"] = strict["result"]
        strict.update(run_checker(binary, path, "-allow-lost-writes", "-html", lossy_html))
    summary: Dict[str, Any] = {
        "scenario": scenario.name,
        "history": str(path),
        "operations": len(records),
        "indeterminate": sum(1 for r in records if r["status"] is None),
        "linearizable": strict["result"],
        "violation_html": strict.get("html"),
        "checker": strict,
        "faults": history["faults"],
        "fault_error": history["fault_error"],
        "feed": feed_result,
        "stale_reads": stale_reads(records, history["feed"]),
        "reader": {
            "events": len(history["reader"]["events"]),
            "reconnects": history["reader"]["reconnects"],
            "errors": history["reader"]["errors"],
            "problems": reader_problems,
            # Events the old primary streamed and the failover lost: the reader read what the feed no longer has.
            "excused": bool(reader_problems) and lossy and feed_result["acknowledged_missing"] > 0,
        },
    }
    within: List[str] = []
    if delta_ms and strict["result"] != "ok":
        summary["delta_ms"] = delta_ms
        within = ["-delta", f"{delta_ms}ms"]
        delta_flags = [*within, "-html", str(path.with_suffix(".delta.html"))]
        delta_flags += ["-allow-lost-writes"] if lossy else []
        delta = run_checker(binary, path, *delta_flags)
        summary["linearizable_within_delta"] = delta["result"]
        summary["delta_html"] = delta.get("html")
    if "ok" in (strict.get("strict_result", strict["result"]), summary.get("linearizable_within_delta")):
        # The feed's order per document agrees with a linearization (the feed as a constraint in the model),
        # within Δ where the history is linearizable only so.
        feed_html = str(path.with_suffix(".feed.html"))
        summary["feed_order"] = run_checker(binary, path, "-feed", *within, "-html", feed_html)["result"]
    return summary


def line(summary: Dict[str, Any]) -> str:
    feed = summary["feed"]
    text = (
        f"{summary['scenario']}: {summary['operations']} ops, {summary['indeterminate']} indeterminate, "
        f"linearizable: {summary['checker'].get('strict_result', summary['linearizable'])}"
    )
    if "strict_result" in summary["checker"]:
        text += f", allowing lost writes in the failover's window: {summary['linearizable']}"
    if summary.get("violation_html"):
        text += f" (see {summary['violation_html']})"
    if "linearizable_within_delta" in summary:
        text += f", within {summary['delta_ms']} ms: {summary['linearizable_within_delta']}"
    stale = summary["stale_reads"]
    if stale["count"]:
        text += f"; {stale['count']} stale reads, the worst {stale['max_ms']} ms (read {stale['worst']['read']})"
    text += (
        f"; feed: {feed['events']} events, {feed['acknowledged_missing']} acknowledged writes missing, "
        f"{len(feed['problems'])} problems, order vs linearization: {summary.get('feed_order', 'not checked')}; "
        f"reader: {summary['reader']['reconnects']} reconnects, {len(summary['reader']['problems'])} problems"
    )
    if summary["reader"]["excused"]:
        text += " (events lost with acknowledged writes in the failover)"
    if summary["fault_error"]:
        text += f"; FAULT FAILED: {summary['fault_error']}"
    return text


def run_scenario(name: str, args: argparse.Namespace, binary: Path) -> List[Dict[str, Any]]:
    scenario = SCENARIOS[name]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summaries = []
    home = out / f"{name}-stack"
    shutil.rmtree(home, ignore_errors=True)  # a fresh Redis (its append-only file) for each run
    tree = Path(args.tree) if args.tree else None
    with Stack(home, scenario.topology, scenario.relay, scenario.env, tree) as stack:
        for number in range(args.histories):
            path = record_history(stack, scenario, number, args, out)
            summary = check_history(path, binary, scenario, args.delta_ms)
            print(line(summary), flush=True)
            summaries.append(summary)
    return summaries


def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m tests.consistency.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="repeatable; default: all")
    p.add_argument("--histories", type=int, default=int(env("CONSISTENCY_HISTORIES", "1")))
    p.add_argument("--ops", type=int, default=int(env("CONSISTENCY_OPS", "600")))
    p.add_argument("--clients", type=int, default=int(env("CONSISTENCY_CLIENTS", "8")))
    p.add_argument("--docs", type=int, default=int(env("CONSISTENCY_DOCS", "5")))
    p.add_argument("--seconds", type=float, default=120.0, help="stop a history's clients after this long")
    p.add_argument("--seed", type=int, default=int(env("CONSISTENCY_SEED", str(int(time.time()) % 100000))))
    p.add_argument("--delta-ms", type=float, default=float(env("CONSISTENCY_DELTA_MS", "50")))
    p.add_argument("--out", default=str(ROOT / "var" / "consistency"))
    p.add_argument("--summary", help="write every history's summary here as JSON")
    p.add_argument("--tree", default=env("CONSISTENCY_TREE"), help="serve from this checkout (another commit)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    # Absolute: Redis runs in a directory of its own (its --dir), the checker from wherever.
    args.out = str(Path(args.out).resolve())
    binary = build_checker(Path(args.out))
    summaries = []
    for name in args.scenario or list(SCENARIOS):
        summaries += run_scenario(name, args, binary)
    if args.summary:
        Path(args.summary).write_text(json.dumps(summaries, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The cost of the I-JSON checks on a body's parse: ``codec.loads`` against the bare parse.

``python -m loadtest.studies._bench_codec [--rounds N]`` (either interpreter) times,
interleaved in one process, the parse a PUT does (``cache.json.codec.loads``)
and the same parse without the I-JSON checks (``cache.json.codec._parse``), for
the bench's 200 B, 4 KB and 10 KB documents and a 4 KB one whose strings
hold colons (timestamps, URLs: the slower path of the duplicate check), and
writes the ratios to ``loadtest/results/bench_codec.md``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from cache.json import codec
from loadtest._data import document

OUTPUT = Path(__file__).resolve().parents[1] / "results" / "bench_codec.md"


def _with_colons(size: int) -> bytes:
    stamps = ",".join(f'"2026-11-24T06:{n % 60:02d}:00Z http://h/{n}"' for n in range(size // 40))
    return ('{"id":"c","at":[' + stamps + "]}").encode()


def _microseconds(parse: Callable[[bytes], object], body: bytes, loops: int) -> float:
    started = time.perf_counter()
    for _ in range(loops):
        parse(body)
    return (time.perf_counter() - started) / loops * 1e6


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.studies._bench_codec")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    bodies = {
        "200 B": document("doc0000001", 200),
        "4 KB": document("doc0000001", 4096),
        "10 KB": document("doc0000001", 10240),
        "4 KB, colons in strings": _with_colons(4096),
    }
    rows = ["| document | bare parse µs | checked µs | ratio |", "|---|---:|---:|---:|"]
    for name, body in bodies.items():
        loops = max(200, 2_000_000 // len(body))
        for parse in (codec._parse_bytes, codec.loads):
            _microseconds(parse, body, loops)  # warm-up: the JIT compiles it
        bare: List[float] = []
        checked: List[float] = []
        for _ in range(args.rounds):
            bare.append(_microseconds(codec._parse_bytes, body, loops))
            checked.append(_microseconds(codec.loads, body, loops))
        b, c = statistics.median(bare), statistics.median(checked)
        rows.append(f"| {name} ({len(body)} B) | {b:.2f} | {c:.2f} | {c / b:.2f} |")
    interpreter = f"{platform.python_implementation()} {platform.python_version()}"
    report = "\n".join(
        [f"# I-JSON checks on {interpreter}", "", f"medians of {args.rounds} interleaved rounds", "", *rows, ""]
    )
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.with_name(f"bench_codec_{platform.python_implementation().lower()}.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

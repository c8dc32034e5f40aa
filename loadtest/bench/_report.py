"""The bench's report: a markdown table and a PNG plot, from its summary.

Each cell is the mean of a case's runs, its spread ((max - min) / mean over
the runs, the honest error bar on a shared machine) and its ratio to Jetway
on PyPy with N workers, measured in the same rounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List


def markdown(summary: Dict[str, Any]) -> str:
    settings = summary["settings"]
    machine = summary["machine"]
    lines = [
        "# Jetway bench",
        "",
        f"{summary['when']}, Jetway {machine['jetway_commit']}, on {machine['cpu']} "
        f"({machine['cores']} cores, {machine['memory_gib']} GiB), load average at the end "
        f"{', '.join(str(load) for load in machine['load_average'])}.",
        "",
        f"- command: `{summary['command']}`",
        f"- {summary['pinning']}",
        f"- wrk: {settings['connections']} connections; warm-up {settings['warmup_s']:g} s per server; "
        f"{settings['rounds']} interleaved rounds of {settings['duration_s']:g} s per case",
        f"- servers: PyPy `{machine['server_python']}`; token: {summary['token']}"
        + (f"; Jetway env `{settings['jetway_env']}`" if settings.get("jetway_env") else "")
        + (f" (`--server-env {settings['server_env']}`)" if settings["server_env"] else ""),
        "- cells: mean over the rounds, ±spread ((max-min)/mean), and ratio to the first column (x)",
        "- nginx's figures are a lower bound of the ceiling: wrk, on its own cores, may be what limits them",
    ]
    if not summary["trustworthy"]:
        lines.append("- **not trustworthy**: quick mode, or under 15 s of warm-up, or fewer than 2 rounds")
    lines += [f"- **response differs**: {text}" for text in summary["mismatches"]]
    lines += ["", "## The read path's targets (issue 7)", ""]
    lines += _targets(summary)
    lines += ["", "## Requests per second (higher is better)", ""]
    lines += _table(summary, "rps", "{:,.0f}")
    lines += ["", "## p99 latency, ms (lower is better)", ""]
    lines += _table(summary, "p99_ms", "{:.2f}")
    lines += ["", "## Every run, in the order measured", ""]
    lines += _runs(summary)
    return "\n".join(lines) + "\n"


# (what, numerator case, denominator case or None, comparison, bound); the
# figure is the ratio of requests per second (of response bytes for the rows
# in BYTE_TARGETS, of documents for those in DOCUMENT_TARGETS), or the numerator's p99 when there is no denominator.
TARGETS = [
    ("200 B read, 2 workers / nginx", "get-small/pypy", "get-small/nginx", ">=", 0.5),
    ("10 KB read, 2 workers / nginx", "get-large/pypy", "get-large/nginx", ">=", 0.4),
    ("200 B read, PyPy / CPython, 1 worker each", "get-small/pypy1", "get-small/cpython1", ">=", 3.0),
    ("10 KB read, JSON-native / decode+re-encode", "get-large/pypy", "get-large/reencode", ">=", 2.0),
    ("200 B read p99, 2 workers (ms)", "get-small/pypy", None, "<=", 15.0),
    ("200 B PUT / 200 B read, 2 workers", "put/pypy", "get-small/pypy", ">=", 0.5),
    ("500-id multi-get, POST form / GET form, 2 workers", "mget-500-post/pypy", "mget-500/pypy", ">=", 0.9),
    ("200 B PUT, JETWAY_WRITE_REPLICAS=1 / 0, a healthy replica", "put/wait1", "put/pypy", ">=", 0.7),
    ("1 KB PUT, 10-property schema / none, 2 workers", "put-1k-schema/pypy", "put-1k/pypy", ">=", 0.85),
    ("10 KB read, gzip variant / stored bytes, 2 workers", "get-large-gzip/pypy", "get-large/pypy", ">=", 0.9),
    ("10 KB read, gzip variant / stored bytes: response bytes", "get-large-gzip/pypy", "get-large/pypy", "<=", 0.34),
    ("10 KB PUT, variants made / none, 2 workers", "put-large/pypy", "put-large/plain", ">=", 0.7),
    ("100 PUTs of 200 B on 1 connection, one batch / one request each", "batch-100/pypy", "put-1c/pypy", ">=", 10.0),
]
BYTE_TARGETS = {"10 KB read, gzip variant / stored bytes: response bytes"}
DOCUMENT_TARGETS = {"100 PUTs of 200 B on 1 connection, one batch / one request each"}
RSS_BUDGET_MB = 150.0


def _targets(summary: Dict[str, Any]) -> List[str]:
    """Each target the bench can check: its figure and whether it is met."""
    cases = summary["cases"]
    rows = ["| target | figure | bound | met |", "|---|---:|---:|---|"]
    for what, top, bottom, comparison, bound in TARGETS:
        if top not in cases or (bottom is not None and bottom not in cases):
            continue
        kind = "bytes_per_request" if what in BYTE_TARGETS else "documents_per_s" if what in DOCUMENT_TARGETS else "rps"
        if bottom is None:
            figure = cases[top]["p99_ms"]
        else:
            figure = cases[top][kind] / cases[bottom][kind] if cases[bottom].get(kind) else 0.0
        met = figure >= bound if comparison == ">=" else figure <= bound
        rows.append(f"| {what} | {figure:.2f} | {comparison} {bound:g} | {_met(met)} |")
    fresh = summary.get("fresh_rss_mb")
    if fresh:
        rows.append(
            f"| resident memory per worker after a {summary['rss_seconds']:g} s run of the 200 B read, "
            f"fresh Jetway PyPy, {len(fresh)} workers (MB, each) | {_sizes(fresh)} | <= {RSS_BUDGET_MB:g} | "
            f"{_met(max(fresh) <= RSS_BUDGET_MB)} |"
        )
    for server in summary["servers"]:
        sizes = summary.get("worker_rss_mb", {}).get(server["key"])
        if sizes and "PyPy" in server["label"]:
            # Not the target (a 60 s run), but what a long mixed load leaves.
            rows.append(
                f"| resident memory per worker after the whole bench, {server['label']} (MB, each; "
                f"beyond the target) | {_sizes(sizes)} | <= {RSS_BUDGET_MB:g} | "
                f"{_met(max(sizes) <= RSS_BUDGET_MB)} |"
            )
    return rows


def _met(met: bool) -> str:
    return "yes" if met else "**no**"


def _sizes(sizes: List[float]) -> str:
    return ", ".join(f"{size:.0f}" for size in sizes)


def _table(summary: Dict[str, Any], figure: str, number: str) -> List[str]:
    servers = summary["servers"]
    reference = summary["reference"]
    header = "| endpoint | " + " | ".join(server["label"] for server in servers) + " |"
    rows = [header, "|---" + "|---:" * len(servers) + "|"]
    low, high = ("rps_min", "rps_max") if figure == "rps" else ("p99_min", "p99_max")
    for endpoint in summary["endpoints"]:
        base = summary["cases"][f"{endpoint['key']}/{reference}"][figure]
        cells = []
        for server in servers:
            case = summary["cases"].get(f"{endpoint['key']}/{server['key']}")
            if case is None:
                cells.append("-")  # not measured on this server
                continue
            value = case[figure]
            spread = (case[high] - case[low]) / value if value else 0.0
            cell = f"{number.format(value)} ±{spread:.0%}"
            if server["key"] != reference:
                cell += f" ({value / base:.2f}x)" if base else " (-)"
            if case["errors"]:
                cell += f" **{case['errors']} errors**"
            cells.append(cell)
        rows.append(f"| {endpoint['label']} | " + " | ".join(cells) + " |")
    return rows


def _runs(summary: Dict[str, Any]) -> List[str]:
    labels = {server["key"]: server["label"] for server in summary["servers"]}
    endpoints = {endpoint["key"]: endpoint["label"] for endpoint in summary["endpoints"]}
    rows = [
        "| # | round | endpoint | server | req/s | p50 ms | p99 ms | errors |",
        "|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for run in summary["runs"]:
        rows.append(
            f"| {run['order']} | {run['round']} | {endpoints[run['endpoint']]} | {labels[run['server']]} | "
            f"{run['rps']:,.0f} | {run['p50_ms']:.2f} | {run['p99_ms']:.2f} | {run['errors']} |"
        )
    return rows


def plot(summary: Dict[str, Any], path: Path) -> None:
    """Grouped bars per endpoint (mean, min-max whiskers, each run a dot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = summary["servers"]
    endpoints = summary["endpoints"]
    figure, axes = plt.subplots(1, 2, figsize=(15, 6.5))
    width = 0.8 / len(servers)
    for axis, (figure_key, title, low, high) in zip(
        axes,
        [
            ("rps", "requests per second (log scale; higher is better)", "rps_min", "rps_max"),
            ("p99_ms", "p99 latency, ms (log scale; lower is better)", "p99_min", "p99_max"),
        ],
    ):
        for index, server in enumerate(servers):
            xs, means, errors = [], [], [[], []]
            for position, endpoint in enumerate(endpoints):
                case = summary["cases"].get(f"{endpoint['key']}/{server['key']}")
                if case is None:
                    continue  # not measured on this server
                x = position + (index - (len(servers) - 1) / 2) * width
                xs.append(x)
                means.append(case[figure_key])
                errors[0].append(case[figure_key] - case[low])
                errors[1].append(case[high] - case[figure_key])
                points = [
                    run[figure_key]
                    for run in summary["runs"]
                    if run["server"] == server["key"] and run["endpoint"] == endpoint["key"]
                ]
                axis.scatter([x] * len(points), points, s=8, color="black", zorder=3)
            axis.bar(xs, means, width, yerr=errors, capsize=2, label=server["label"], zorder=2)
        axis.set_yscale("log")
        axis.set_title(title)
        axis.set_xticks(range(len(endpoints)))
        axis.set_xticklabels([_short(endpoint["label"]) for endpoint in endpoints], rotation=20, ha="right")
        axis.grid(axis="y", which="both", alpha=0.3, zorder=0)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(servers), fontsize=9)
    settings = summary["settings"]
    figure.suptitle(
        f"Jetway bench, {summary['when']}: {settings['rounds']} interleaved rounds of {settings['duration_s']:g} s, "
        f"wrk -c {settings['connections']}; {summary['pinning']}",
        fontsize=9,
    )
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _short(label: str) -> str:
    return label.replace("/v1/{coll}/{id} ", "doc ").replace("GET ", "GET\n").replace("PUT ", "PUT\n")

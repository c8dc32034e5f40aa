"""The tree keeps the shape the house agreed on (issue #45's checks on the tree).

A short README beside a ``docs/`` folder; app modules (``api/``,
``handlers/``, ``cache/``) of a size a reader takes in, importing in one
direction (``api`` -> ``handlers`` -> ``cache``; inside ``handlers``, its
``http`` and ``feed`` packages never import a top-level handler module), with no import cycle;
and each route's path written in one module; comments that give the reason,
not the profiler's figures (those live in ``docs/`` beside their commands).
Imports are read from the files with ``ast``, every one of them: a
function-local import or one under ``if TYPE_CHECKING:`` is still a
dependency, only deferred.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "README.md").is_file() and (p / "Makefile").is_file())
APP_FOLDERS = ("api", "handlers", "cache")
LAYERS = {"api": 0, "handlers": 1, "cache": 2}  # an import goes to the same layer or a lower one
MAX_README_LINES = 300
MIN_DOCS_PAGES = 3
MAX_MODULE_LINES = 500
# handlers' supporting packages (handlers/__init__.py): they serve handlers and never import one.
SUPPORT_PACKAGES = ("handlers.http", "handlers.feed")
# The beginnings of the API's paths; a string literal starting so is a route's path (or part of one).
ROUTE_PREFIXES = ("/v1/", "/healthz", "/readyz", "/metrics", "/openapi", "/docs")
# What a measured figure looks like in a comment or a docstring: a time in µs or ns; a time in ms or s
# that is approximate (~), a range or a decimal (a limit or a setting is a round "100 ms"); a percentage;
# a ratio (0.49x, ~5x, "3x slower", "1.6 times as"); two figures joined by an arrow; megabytes that are
# approximate, grown (+) or decimal; the runs behind a figure ("4 pairs"). Sizes that are the design
# (1 MiB documents, a 64 KiB read, "8MB" settings, 16 shards) do not look so.
MEASURED_FIGURE = re.compile(
    r"\d\s?(?:µs|us|ns)\b"
    r"|(?:~\s?\d[\d,]*(?:\.\d+)?|\d+\.\d+|\d[\d.]*\s?[-\u2013]\s?\d[\d.]*)\s?(?:ms|s)\b"
    r"|\d\s?%"
    r"|(?:~\s?\d+(?:\.\d+)?|\d+\.\d+)\s?[x\u00d7](?![\w-])"
    r"|\d\s?(?:[x\u00d7]|times)\s(?:as|slower|faster|cheaper|dearer|more|less)\b"
    r"|\d[\d.,]*\s?(?:µs|us|ms|s|KB|MB|x|\u00d7)?\s?(?:->|→)\s?~?\d"
    r"|(?:[~+]\s?\d[\d,]*(?:\.\d+)?|\d+\.\d+)\s?(?:MB|GB)\b"
    r"|\b\d+ (?:interleaved )?pairs\b"
)
# The comment lines with a measured figure the app keeps (issue #57): the doorkeeper's false-positive
# rates in cache/hot/admission.py (three lines: computed from the formula beside them, the reason for the
# design). A new figure goes to the doc that has its command (docs/performance.md and its history,
# docs/limits.md, docs/schemas.md …) and the comment keeps the reason, with a pointer to that doc's section.
MAX_MEASURED_LINES = 3


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def app_modules() -> Dict[str, Path]:
    """Each app module by its dotted name (a package by its ``__init__.py``)."""
    return {module_name(p): p for folder in APP_FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))}


@cache
def parsed(name: str) -> ast.Module:
    return ast.parse(app_modules()[name].read_text(), str(app_modules()[name]))


def _resolved(name: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (``from . import x`` included)."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if app_modules()[name].name == "__init__.py" else name.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str) -> Iterator[Tuple[str, int]]:
    """(app module imported, line) for every import statement of a module, wherever it stands."""
    modules = app_modules()
    for node in ast.walk(parsed(name)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _resolved(name, node)
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import thing`` imports mod.
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # import a.b.c of a non-module c: a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target, node.lineno


@cache
def import_graph() -> Dict[str, Dict[str, int]]:
    """Each app module's imports of app modules, with the line of the first."""
    graph: Dict[str, Dict[str, int]] = {}
    for name in app_modules():
        edges: Dict[str, int] = {}
        for target, line in imports_of(name):
            edges.setdefault(target, line)
        graph[name] = edges
    return graph


def find_cycle(graph: Dict[str, Dict[str, int]]) -> Optional[List[str]]:
    """One import cycle as its path of modules (the first repeated at the end), or None."""
    done: Set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: List[str] = []
        stack = [(start, iter(()))]  # (module, its imports not yet followed)
        while stack:
            module, following = stack[-1]
            if not path or path[-1] != module:
                path.append(module)
                following = iter(sorted(graph.get(module, {})))
                stack[-1] = (module, following)
            target = next(following, None)
            if target is None:
                done.add(path.pop())
                stack.pop()
            elif target in path:
                return path[path.index(target) :] + [target]
            elif target not in done:
                stack.append((target, iter(())))
    return None


def test_readme_is_a_front_door() -> None:
    """The README is at most 300 lines; the reference lives in docs/."""
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md is {lines} lines, over {MAX_README_LINES}: move reference to docs/"


def test_docs_has_pages() -> None:
    """docs/ holds at least three pages."""
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert len(pages) >= MIN_DOCS_PAGES, f"docs/ has {pages}"


def test_no_app_module_is_too_long() -> None:
    """No module of api/, handlers/ or cache/ is over 500 lines."""
    long = {
        str(path.relative_to(ROOT)): n
        for path in app_modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"over {MAX_MODULE_LINES} lines: {long}"


def tangles(graph: Dict[str, Dict[str, int]]) -> List[Set[str]]:
    """The groups of modules that import each other, directly or not (Tarjan's strongly connected components)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[Set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, {})):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group: Set[str] = set()
            while module not in group:
                group.add(stack.pop())
            if len(group) > 1:
                found.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_among_app_modules() -> None:
    """No app module imports, directly or through others, itself (function-local imports count)."""
    graph = import_graph()
    cycles = []
    for group in tangles(graph):
        cycle = find_cycle({m: {t: n for t, n in graph[m].items() if t in group} for m in group}) or []
        cycles.append(" -> ".join(f"{m} (line {graph[m][t]})" for m, t in zip(cycle, cycle[1:])) + f" -> {cycle[0]}")
    assert not cycles, "import cycles:\n  " + "\n  ".join(sorted(cycles))


def test_imports_flow_api_handlers_cache() -> None:
    """cache/ imports neither handlers/ nor api/, and handlers/ does not import api/."""
    upward = [
        f"{name}:{line} imports {target}"
        for name, edges in import_graph().items()
        for target, line in edges.items()
        if LAYERS[target.split(".")[0]] < LAYERS[name.split(".")[0]]
    ]
    assert not upward, "imports against api -> handlers -> cache:\n  " + "\n  ".join(sorted(upward))


def test_handlers_support_packages_import_no_handler_module() -> None:
    """handlers/http/ and handlers/feed/ never import a module of handlers/ itself (base, a handler, the table)."""
    top = {
        n
        for n, p in app_modules().items()
        if n.count(".") == 1 and n.startswith("handlers.") and p.name != "__init__.py"
    }
    inward = [
        f"{name}:{line} imports {target}"
        for name, edges in import_graph().items()
        if name.startswith(tuple(f"{package}." for package in SUPPORT_PACKAGES))
        for target, line in edges.items()
        if target in top
    ]
    assert not inward, "a supporting package importing a handler-level module:\n  " + "\n  ".join(sorted(inward))


def _docstrings(tree: ast.Module) -> Set[int]:
    """The ids of string nodes that stand alone as statements: docstrings, not code."""
    alone: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            alone.add(id(node.value))
    return alone


def route_literals() -> Dict[str, Set[str]]:
    """Each string (or bytes) literal of app code that starts like an API path, with the modules writing it."""
    found: Dict[str, Set[str]] = {}
    for name in app_modules():
        tree = parsed(name)
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in skip and isinstance(node.value, (str, bytes)):
                text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
                if text.startswith(ROUTE_PREFIXES):
                    found.setdefault(text, set()).add(name)
    return found


def test_each_route_path_is_written_in_one_module() -> None:
    """A path literal like "/v1/_batch" or "/healthz" appears in the code of one module only."""
    repeated = {text: sorted(modules) for text, modules in route_literals().items() if len(modules) > 1}
    assert not repeated, "route paths written in more than one module:\n  " + "\n  ".join(
        f"{text!r}: {', '.join(modules)}" for text, modules in sorted(repeated.items())
    )


def comment_lines(source: str) -> Iterator[Tuple[int, str]]:
    """Each line of a module's comments and of its docstrings (strings standing alone), with its number."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    lines = source.splitlines()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                yield number, lines[number - 1]


def measured_figures() -> List[str]:
    """``path:line: text`` of every comment or docstring line of the app that carries a measured figure."""
    found = []
    for path in app_modules().values():
        for number, text in sorted(set(comment_lines(path.read_text()))):
            if MEASURED_FIGURE.search(text):
                found.append(f"{path.relative_to(ROOT)}:{number}: {text.strip()}")
    return sorted(found)


def test_comments_give_reasons_not_measured_figures() -> None:
    """At most a few comment lines of api/, handlers/, cache/ carry a measured figure; the figures live in docs/."""
    found = measured_figures()
    assert len(found) <= MAX_MEASURED_LINES, (
        f"{len(found)} comment lines with a measured figure, over {MAX_MEASURED_LINES}: keep the reason in the"
        " comment, and the figure in the doc that has its command (docs/performance.md, its history,"
        " docs/limits.md …), pointed to by its section:\n  " + "\n  ".join(found)
    )


def test_the_figure_check_tells_measurements_from_the_design() -> None:
    """Measured figures are found in comments and docstrings; design sizes, settings and code are not."""
    measured = [
        "# (its heap work was ~3.6% of a document read's worker CPU, vmprof)",
        "# way (strace -c), for 49.2 -> 39.3 us of worker CPU",
        "# and left PUTs at 0.49x their rate meanwhile",
        "a regular expression per bracket was 3x slower",
        "# each step halves (~3 → ~1.8 ms)",
        "worker +173 MB 10 s later",
        "# (loadtest/ab_cpu.sh, 4 pairs, lower in 3)",
    ]
    design = [
        "# Bytes asked of the socket per read: a 64 KiB read, 1 MiB documents.",
        "# 100 ms the issue allows a /healthz to wait",
        '# "PYPY_GC_NURSERY": "8MB", 16 shards: about twice ``limit`` ids asked, not 16x.',
        "# Content coding -> hash field, in the server's order of preference",
    ]
    assert [line for line in measured if not MEASURED_FIGURE.search(line)] == []
    assert [line for line in design if MEASURED_FIGURE.search(line)] == []
    source = '"""Took 9 us."""\nX = "9 us"  # 5% of it\ndef f():\n    """Then 2 -> 1 ms."""\n'
    assert sorted(n for n, text in comment_lines(source) if MEASURED_FIGURE.search(text)) == [1, 2, 4]


def test_the_checks_read_imports_and_literals_as_meant() -> None:
    """The readers: a function-local import is an edge, a cycle is found with its path, docstrings are no code."""
    tree = ast.parse('"""/v1/doc"""\ndef f():\n    """/healthz"""\n    from cache import codec\n    return "/v1/x"\n')
    assert len(_docstrings(tree)) == 2
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"b": 1}}) is None
    assert tangles({"a": {"b": 1}, "b": {"a": 1}, "c": {"a": 1}}) == [{"a", "b"}]
    assert "cache.json.codec" in import_graph()["handlers.http.validation"]

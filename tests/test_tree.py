"""The tree keeps the shape the house agreed on (issue #45's checks on the tree).

A short README beside a ``docs/`` folder; app modules (``api/``,
``handlers/``, ``cache/``) of a size a reader takes in, importing in one
direction (``api`` -> ``handlers`` -> ``cache``; inside ``handlers``, its
``http`` and ``feed`` packages never import a top-level handler module), with no import cycle;
and each route's path written in one module. Imports are read from the
files with ``ast``, every one of them: a function-local import or one under
``if TYPE_CHECKING:`` is still a dependency, only deferred.
"""

from __future__ import annotations

import ast
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


def test_the_checks_read_imports_and_literals_as_meant() -> None:
    """The readers: a function-local import is an edge, a cycle is found with its path, docstrings are no code."""
    tree = ast.parse('"""/v1/doc"""\ndef f():\n    """/healthz"""\n    from cache import codec\n    return "/v1/x"\n')
    assert len(_docstrings(tree)) == 2
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"b": 1}}) is None
    assert tangles({"a": {"b": 1}, "b": {"a": 1}, "c": {"a": 1}}) == [{"a", "b"}]
    assert "cache.json.codec" in import_graph()["handlers.http.validation"]

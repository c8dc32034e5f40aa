"""Every file the documents and the code's comments name exists in the tree.

A document or a comment that names a file sends its reader there; once the
file is renamed or removed, the name misleads. This reads the README,
``docs/*.md``, ``docs/history/*.md``, ``deploy/README.md`` and
``loadtest/studies/README.md`` whole, and the comments and docstrings of
the code under ``api/``, ``handlers/``, ``cache/``,
``loadtest/``, ``tests/``, ``deploy/`` and ``release/`` and of the Makefile.
It collects every name that starts with one of the tree's folders
(``cache/keys.py``, ``docs/limits.md``, ``tests/handlers/test_health.py::name``,
``handlers/openapi/*.py``) and every relative link of a document
(``[limits.md](limits.md#anchor)``).

A name counts by its file part (``api/master.py:45`` is ``api/master.py``,
``cache/redis/resp.encode_command`` is ``cache/redis/resp.py``); a name with ``*`` is a
glob that must match something; a name with neither a dotted ending nor a
closing ``/`` is not taken for a file (``docs/d1`` is as likely a document
of the collection ``docs``); what runs write into a folder that git ignores
whole (``loadtest/results/``) is not part of the tree and is not checked. A
link to a heading of a document must find that heading, and so must a
section cited by its title (``docs/operations.md, "Hostile clients"``,
``README's "The two commands"``).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "README.md").is_file() and (p / "Makefile").is_file())
DOCUMENTS = ["README.md", "docs/*.md", "docs/history/*.md", "deploy/README.md", "loadtest/studies/README.md"]
CODE_FOLDERS = ["api", "handlers", "cache", "loadtest", "tests", "deploy", "release"]
# Files whose comments are lines starting with these (after indentation); "": the Makefile.
LINE_COMMENTS = {
    "": ("#",), ".sh": ("#",), ".conf": ("#", ";"), ".yaml": ("#",), ".yml": ("#",), ".lua": ("--",), ".toml": ("#",),
}  # fmt: skip
# A name starts at a folder of the tree, not inside a URL, a file system path
# elsewhere (/tmp/tests/…) or a longer word (var/cache/…).
FOLDERS = r"(?:api|handlers|cache|loadtest|tests|deploy|docs|release|\.ci)"
NAME = re.compile(rf"(?<![\w./:@$~%-]){FOLDERS}/[\w.*?/-]*(?:::[\w\[\]-]+)?")
# Endings of files; any other dotted ending is a module's attribute.
FILE_ENDINGS = {
    "py", "md", "sh", "lua", "json", "txt", "yaml", "yml", "conf", "toml", "png", "js", "ts",
    "css", "html", "pem", "csv", "cfg", "ini", "lock", "gz", "service", "j2", "tmpl",
}  # fmt: skip
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A section cited by its title: README, "The two commands"; docs/api.md, "Batches".
SECTION = re.compile(r"\b(README(?:\.md)?|docs/[\w-]+\.md)(?:'s)?,?\s+\"([^\"]+)\"")


def file_part(name: str) -> str:
    """The file a name points at: no ``::test``, ``:line``, anchor, trailing punctuation or attribute."""
    name = name.split("::", 1)[0].split("#", 1)[0]
    name = re.sub(r":\d+(?:-\d+)?$", "", name).rstrip(".,;:)")
    head, _, last = name.rpartition("/")
    stem, dot, ending = last.partition(".")
    if dot and "*" not in last and ending.split(".")[-1] not in FILE_ENDINGS and stem:
        return f"{head}/{stem}.py"  # cache/redis/resp.encode_command: the module cache/redis/resp.py
    return name


def is_output(path: str) -> bool:
    """Under a folder whose own .gitignore ignores everything: what runs write, not the tree."""
    folder = (ROOT / path).parent
    while folder != ROOT and ROOT in folder.parents:
        ignore = folder / ".gitignore"
        if ignore.is_file() and ignore.read_text().split()[:1] == ["*"]:
            return True
        folder = folder.parent
    return False


def exists(path: str) -> bool:
    if any(c in path for c in "*?["):
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def documents() -> List[Path]:
    return sorted({p for pattern in DOCUMENTS for p in ROOT.glob(pattern)})


def code_files() -> Iterator[Path]:
    yield ROOT / "Makefile"
    for folder in CODE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            skipped = {"node_modules", "__pycache__", "data"} & set(path.relative_to(ROOT).parts)
            if (
                path.is_file()
                and not skipped
                and path.suffix
                and (path.suffix == ".py" or path.suffix in LINE_COMMENTS)
            ):
                yield path


def python_comments(source: str) -> Iterator[Tuple[int, str]]:
    """The comments and docstrings of a module, with their line numbers."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield node.body[0].lineno, docstring


def line_comments(source: str, markers: Tuple[str, ...]) -> Iterator[Tuple[int, str]]:
    """Whole-line comments, and a shell's `` # `` comment after a command."""
    for number, line in enumerate(source.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith(markers):
            yield number, stripped
        elif "#" in markers and " # " in line:
            yield number, line.split(" # ", 1)[1]


@cache
def texts() -> Tuple[Tuple[str, int, str], ...]:
    """(file, line, text) for every document and every comment of the code."""
    return tuple(_texts())


def _texts() -> Iterator[Tuple[str, int, str]]:
    for path in documents():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            yield str(path.relative_to(ROOT)), number, line
    for path in code_files():
        source = path.read_text()
        if not NAME.search(source) and not SECTION.search(source):
            continue  # nothing to find: spare the tokenizer
        found = python_comments(source) if path.suffix == ".py" else line_comments(source, LINE_COMMENTS[path.suffix])
        for number, text in found:
            yield str(path.relative_to(ROOT)), number, text


def named_paths() -> Dict[str, List[str]]:
    """Each file named (its file part), with where it is named."""
    named: Dict[str, List[str]] = {}
    for where, number, text in texts():
        for match in NAME.finditer(text):
            path = file_part(match.group())
            last = path.rstrip("/").rpartition("/")[2]
            looks_like_file = "." in last or "*" in last or path.endswith("/")
            if looks_like_file and not is_output(path):
                named.setdefault(path, []).append(f"{where}:{number}")
    return named


def links() -> Iterator[Tuple[str, Path, str]]:
    """(where, target file, anchor) for every relative link of a document."""
    for path in documents():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:|/", target):
                    continue  # a URL, or a path of the server (/docs)
                file, _, anchor = target.partition("#")
                resolved = (path.parent / file).resolve() if file else path
                yield f"{path.relative_to(ROOT)}:{number}", resolved, anchor


def headings(document: Path) -> List[str]:
    """A document's headings, as written."""
    found: List[str] = []
    fenced = False
    for line in document.read_text().splitlines():
        fenced ^= line.startswith("```")
        heading = re.match(r"#{1,6} (.*)", line)
        if heading and not fenced:
            found.append(heading.group(1).strip())
    return found


def anchors(document: Path) -> Set[str]:
    """The anchors GitHub makes for a document's headings."""
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in headings(document)}


def test_every_named_file_exists() -> None:
    """A path in the README, docs/ or a comment that names no file fails, listing each with where it is named."""
    missing = {path: where for path, where in named_paths().items() if not exists(path)}
    assert not missing, "named but not in the tree:\n" + "\n".join(
        f"  {path}  ({', '.join(where[:4])}{' …' if len(where) > 4 else ''})" for path, where in sorted(missing.items())
    )


def test_every_link_of_a_document_finds_its_file_and_heading() -> None:
    """A relative link in the README or docs/ whose file or heading is not there fails."""
    broken = []
    for where, target, anchor in links():
        if not target.exists():
            broken.append(f"{where}: {target.relative_to(ROOT) if ROOT in target.parents else target}")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{where}: {target.relative_to(ROOT)}#{anchor}")
    assert not broken, "links to nothing:\n  " + "\n  ".join(broken)


def test_every_section_cited_by_its_title_has_that_heading() -> None:
    """A section cited as ``README, "The two commands"`` is a heading of that document (or the start of one)."""

    def plain(title: str) -> str:
        return " ".join(re.sub(r"[`*_]", "", title).lower().split())

    wrong = []
    for where, number, text in texts():
        for document, title in SECTION.findall(text):
            path = ROOT / ("README.md" if document.startswith("README") else document)
            titles = [plain(t) for t in headings(path)] if path.is_file() else []
            if not any(t.startswith(plain(title)) for t in titles):
                wrong.append(f'{where}:{number}: {document}, "{title}"')
    assert not wrong, "sections cited that are not there:\n  " + "\n  ".join(wrong)


def test_names_are_read_by_their_file_part() -> None:
    """The reading of a name: suffixes that are not the file are dropped, a module's attribute is its module."""
    assert file_part("api/master.py:45-71") == "api/master.py"
    assert file_part("tests/handlers/test_health.py::test_ready") == "tests/handlers/test_health.py"
    assert file_part("docs/limits.md#bounds") == "docs/limits.md"
    assert file_part("cache/redis/resp.encode_command") == "cache/redis/resp.py"
    assert file_part("handlers/openapi*.py") == "handlers/openapi*.py"
    assert file_part("tests/data/json_schema_test_suite/") == "tests/data/json_schema_test_suite/"
    assert exists("handlers/*.py") and not exists("handlers/no_such_*.py")
    assert [m.group() for m in NAME.finditer("jw:{users}:c https://x.org/tests/a.py /tmp/cache/x var/cache/y")] == []
    assert is_output("loadtest/results/bench.md") and not is_output("loadtest/ab_cpu.sh")

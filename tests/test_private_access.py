"""No app class reads another class's private state: classes split by concept, not by line count (STYLE.md, 24).

A class's ``self._name`` must be its own: assigned (``self._name = ...``)
or defined (a method, a class attribute) in the class, or in one of its
bases that is an app class (found through its module's imports). A mixin
whose methods use what its host class sets is one class in two files, and
fails here, as does a module that reads ``other._name`` where ``_name`` is
another module's class's own. A name declared by an annotation alone
(``_link: Link``) is not owned: that is how a mixin says what it borrows.
The privates of a library's base class (Cyclone's, Twisted's) are not
judged here: ``tests/test_framework_privates.py`` keeps those in one module.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Set, Tuple

from tests.test_tree import _resolved, app_modules, parsed

SELVES = ("self", "cls")


@dataclass
class ClassFacts:
    """What the rule needs of one class: its bases, the privates it owns, the ones it reads (name, line)."""

    module: str
    node: ast.ClassDef
    owned: Set[str] = field(default_factory=set)
    read: List[Tuple[str, int]] = field(default_factory=list)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_nodes(cls: ast.ClassDef) -> Iterator[ast.AST]:
    """Every node of the class's body but those of classes nested in it (their ``self`` is another)."""
    stack: List[ast.AST] = list(cls.body)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, ast.ClassDef))


def self_attribute(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in SELVES:
        return node.attr
    return None


def is_record(cls: ast.ClassDef) -> bool:
    """A dataclass or a NamedTuple: its annotated fields are assigned by the ``__init__`` made for it."""
    names = [ast.unparse(d).split("(")[0] for d in cls.decorator_list] + [ast.unparse(b) for b in cls.bases]
    return any(name.rpartition(".")[2] in ("dataclass", "NamedTuple") for name in names)


def facts_of(module: str, cls: ast.ClassDef) -> ClassFacts:
    facts = ClassFacts(module, cls)
    for statement in cls.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            facts.owned.add(statement.name)
        elif isinstance(statement, ast.Assign):
            facts.owned.update(t.id for t in statement.targets if isinstance(t, ast.Name))
        elif (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and (statement.value is not None or is_record(cls))  # alone, an annotation says what a mixin borrows
        ):
            facts.owned.add(statement.target.id)
    for node in own_nodes(cls):
        name = self_attribute(node)
        if name is None or not is_private(name):
            continue
        assert isinstance(node, ast.Attribute)
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            facts.owned.add(name)
        else:
            facts.read.append((name, node.lineno))
    return facts


def app_trees() -> Dict[str, ast.Module]:
    return {module: parsed(module) for module in app_modules()}


def classes_by_module(trees: Dict[str, ast.Module]) -> Dict[str, Dict[str, ClassFacts]]:
    """Each module's classes (top level and nested), by name."""
    found: Dict[str, Dict[str, ClassFacts]] = {}
    for module, tree in trees.items():
        classes = found.setdefault(module, {})
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, facts_of(module, node))
    return found


def imported_names(module: str, tree: ast.Module) -> Dict[str, Tuple[str, str]]:
    """Each name a module imports ``from`` a module: (that module, the name there)."""
    names: Dict[str, Tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolved(module, node)
            for alias in node.names:
                names[alias.asname or alias.name] = (source, alias.name)
    return names


def bases_of(
    facts: ClassFacts, classes: Dict[str, Dict[str, ClassFacts]], imported: Dict[str, Tuple[str, str]]
) -> Tuple[List[ClassFacts], bool]:
    """The class's bases that are app classes, and whether any base is a library's (or cannot be told)."""
    app_bases: List[ClassFacts] = []
    foreign = False
    for base in facts.node.bases:
        name = ast.unparse(base).split("[")[0]
        if name == "object":
            continue
        source, original = imported.get(name, (facts.module, name))
        if original in classes.get(source, {}):
            app_bases.append(classes[source][original])
        else:
            foreign = True
    return app_bases, foreign


def borrowed_reads(trees: Dict[str, ast.Module]) -> List[str]:
    """Each class reading a ``self._name`` that neither it nor an app base owns, where no library base may own it."""
    classes = classes_by_module(trees)
    imports = {module: imported_names(module, tree) for module, tree in trees.items()}
    found = []
    for module, by_name in classes.items():
        for facts in by_name.values():
            owned: Set[str] = set()
            foreign = False
            seen: Set[int] = set()
            pending = [facts]
            while pending:  # the class and its app bases, all the way up
                current = pending.pop()
                if id(current) in seen:
                    continue
                seen.add(id(current))
                owned |= current.owned
                app_bases, library = bases_of(current, classes, imports[current.module])
                foreign = foreign or library
                pending.extend(app_bases)
            borrowed = sorted({name for name, _ in facts.read if name not in owned})
            if borrowed and not foreign:
                line = min(line for name, line in facts.read if name in borrowed)
                found.append(f"{module}:{line} {facts.node.name} reads {', '.join(borrowed)}, set by another class")
    return found


def foreign_reads(trees: Dict[str, ast.Module]) -> List[str]:
    """Each ``other._name`` (not ``self``'s) whose ``_name`` a class of another module owns, and none of its own."""
    owners: Dict[str, Set[str]] = {}
    for module, by_name in classes_by_module(trees).items():
        for facts in by_name.values():
            for name in facts.owned:
                owners.setdefault(name, set()).add(module)
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not is_private(node.attr) or self_attribute(node) is not None:
                continue
            others = owners.get(node.attr, set())
            if others and module not in others:
                found.append(f"{module}:{node.lineno} reads {ast.unparse(node)}, owned in {', '.join(sorted(others))}")
    return found


def test_no_class_reads_private_state_it_does_not_own() -> None:
    """A mixin that uses its host's ``self._name`` (its link, its buffer, its deadline) is found."""
    borrowed = borrowed_reads(app_trees())
    assert not borrowed, "split by concept: give the part what it needs\n  " + "\n  ".join(borrowed)


def test_no_module_reads_another_modules_private_state() -> None:
    """``connection._buffer`` in a module other than the one whose class owns ``_buffer`` is found."""
    foreign = foreign_reads(app_trees())
    assert not foreign, "use the owner's public interface\n  " + "\n  ".join(foreign)


MIXED = """
from dataclasses import dataclass
from other import Host
class Mixin:
    _link: int
    def get(self):
        return self._link, self._hot
class Sub(Host):
    def get(self):
        return self._link
class Own:
    limit = 1
    def __init__(self):
        self._size = 0
    def _grow(self):
        self._size += self.limit
    def size(self):
        self._grow()
        return self._size
@dataclass
class Record:
    _size: int
    def size(self):
        return self._size
class Framework(library.Base):
    def go(self):
        return self._internal
"""
HOST = """
class Host:
    def __init__(self):
        self._link = 1
def peek(host):
    return host._link
"""


def test_the_rules_tell_a_mixin_from_a_class_with_its_bases() -> None:
    """A mixin is found, and a read of another module's private; a subclass of an app class, a dataclass's fields
    and a library base's privates are not."""
    trees = {"m": ast.parse(MIXED), "other": ast.parse(HOST)}
    assert borrowed_reads(trees) == ["m:7 Mixin reads _hot, _link, set by another class"]
    assert foreign_reads({**trees, "n": ast.parse("def f(h):\n    return h._link\n")}) == [
        "n:2 reads h._link, owned in other"
    ]

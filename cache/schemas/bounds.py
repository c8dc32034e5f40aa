"""What a collection schema may cost, checked once when the setting is written.

A schema is the admin's, but it runs on every write in every worker, so it
is held to bounds before anything else looks at it (issue 44; the limits and
their reasons are in ``docs/schemas.md``):

- its size (``MAX_SCHEMA_BYTES``) and JSON nesting (``MAX_SCHEMA_DEPTH``),
  before ``jsonschema`` walks it against the meta-schema;
- the number of its subschemas (``MAX_SUBSCHEMAS``);
- every ``$ref`` and ``$dynamicRef`` resolves inside the schema (or to a
  meta-schema ``jsonschema`` ships), with a registry that cannot retrieve:
  nothing is ever fetched, from the network or from a file;
- no ``$ref`` cycle that stays on the same value (``{"$ref": "#"}``, or
  ``a -> b -> a`` through ``allOf``…): only a cycle that descends into the
  document (``properties``, ``items``…) is a recursive schema;
- the subschemas applied to one value, following ``allOf``, ``$ref`` and the
  other in-place applicators (``MAX_IN_PLACE`` of them, in chains at most
  ``MAX_CHAIN`` long): ``allOf: [$ref a1, $ref a1]`` doubling per level is
  refused here rather than run;
- every ``pattern`` and ``patternProperties`` key compiles with ``cache.schemas.regex``.

Each refusal is a ``SchemaRefused`` whose message names the limit.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple
from urllib.parse import urljoin

from cache.json import codec
from cache.schemas.regex import InvalidPattern, Regex, compile_pattern

MAX_SCHEMA_BYTES = 32 * 1024
MAX_SCHEMA_DEPTH = 48
MAX_SUBSCHEMAS = 2000
MAX_IN_PLACE = 2000
MAX_CHAIN = 48

_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_MANY = ("allOf", "anyOf", "oneOf")
_DESCEND_ONE = (
    "additionalProperties",
    "propertyNames",
    "items",
    "contains",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
_MAPS = ("properties", "patternProperties", "dependentSchemas", "$defs")


class SchemaRefused(ValueError):
    """A schema over one of this module's bounds; the message says which."""


def check_shape(schema: Any) -> None:
    """Size and nesting, checked before anything walks the schema recursively."""
    size = len(codec.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise SchemaRefused(f"the schema is {size} bytes; the limit is {MAX_SCHEMA_BYTES}")
    depth = json_depth(schema, MAX_SCHEMA_DEPTH)
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaRefused(f"the schema is nested more than {MAX_SCHEMA_DEPTH} levels deep; that is the limit")


def json_depth(value: Any, limit: int) -> int:
    """How deeply ``value``'s arrays and objects nest (a scalar is 0), without recursion; stops past ``limit``."""
    deepest = 0
    stack: List[Tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def subschemas(schema: Dict[str, Any]) -> Iterator[Tuple[Any, bool]]:
    """Each subschema of ``schema`` with whether it applies to the same value (in place)."""
    for keyword in _IN_PLACE_ONE:
        if keyword in schema:
            yield schema[keyword], True
    for keyword in _IN_PLACE_MANY:
        for sub in _list(schema.get(keyword)):
            yield sub, True
    for keyword in _DESCEND_ONE:
        if keyword in schema:
            yield schema[keyword], False
    for sub in _list(schema.get("prefixItems")):
        yield sub, False
    for keyword in _MAPS:
        members = schema.get(keyword)
        if isinstance(members, dict):
            for sub in members.values():
                # dependentSchemas apply to the object itself; $defs apply to nothing until referenced.
                yield sub, keyword == "dependentSchemas"


def _list(value: Any) -> List[Any]:
    return value if isinstance(value, list) else []


def check_cost(schema: Any) -> Dict[str, Regex]:
    """Subschemas, references, cycles and patterns (the schema already meta-valid); the patterns compiled."""
    nodes = _Nodes(schema)
    graph = {key: nodes.edges(node) for key, node in nodes.by_id.items()}
    _check_in_place(graph)
    return nodes.patterns


class _Nodes:
    """Every subschema of a root, by identity, with its base URI and its patterns compiled."""

    def __init__(self, root: Any) -> None:
        from jsonschema_specifications import REGISTRY as SPECIFICATIONS
        from referencing import Registry
        from referencing.jsonschema import DRAFT202012

        self.root = root
        self.by_id: Dict[int, Dict[str, Any]] = {}
        self.base: Dict[int, str] = {}
        self.patterns: Dict[str, Regex] = {}
        resource = DRAFT202012.create_resource(root)
        local = Registry(retrieve=_never_retrieve).with_resource(resource.id() or "", resource)  # type: ignore[call-arg]
        # The meta-schemas jsonschema ships are read from its package: a $ref to one is not a fetch.
        self.registry = SPECIFICATIONS.combine(local).crawl()
        self._collect(root, resource.id() or "")

    def _collect(self, root: Any, base: str) -> None:
        stack: List[Tuple[Any, str]] = [(root, base)]
        while stack:
            node, base = stack.pop()
            if not isinstance(node, dict) or id(node) in self.by_id:
                continue
            if isinstance(node.get("$id"), str):
                base = urljoin(base, node["$id"])
            self.by_id[id(node)] = node
            self.base[id(node)] = base
            if len(self.by_id) > MAX_SUBSCHEMAS:
                raise SchemaRefused(f"the schema has more than {MAX_SUBSCHEMAS} subschemas; that is the limit")
            self._compile_patterns(node)
            stack.extend((sub, base) for sub, _ in subschemas(node))

    def _compile_patterns(self, node: Dict[str, Any]) -> None:
        found = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        if isinstance(node.get("patternProperties"), dict):
            found.extend(node["patternProperties"])
        for pattern in found:
            if pattern not in self.patterns:
                try:
                    self.patterns[pattern] = compile_pattern(pattern)
                except InvalidPattern as error:
                    raise SchemaRefused(f"a pattern is not a regular expression Jetway runs: {error}") from None

    def edges(self, node: Dict[str, Any]) -> List[int]:
        """The subschemas applied to the same value as ``node`` (``$ref`` targets too), by identity."""
        targets = [id(sub) for sub, in_place in subschemas(node) if in_place and isinstance(sub, dict)]
        for keyword in ("$ref", "$dynamicRef"):
            ref = node.get(keyword)
            if isinstance(ref, str):
                target = self.resolve(ref, self.base[id(node)])
                if id(target) in self.by_id:
                    targets.append(id(target))
        return targets

    def resolve(self, ref: str, base: str) -> Any:
        from referencing.exceptions import Unresolvable

        try:
            return self.registry.resolver(base_uri=base).lookup(ref).contents
        except Unresolvable:
            pass
        raise SchemaRefused(
            f"$ref {ref[:200]!r} does not point inside the schema; Jetway never fetches a schema "
            "(over the network or from a file): put what it names under $defs"
        )


def _never_retrieve(uri: str) -> Any:
    from referencing.exceptions import NoSuchResource

    raise NoSuchResource(ref=uri)


def _check_in_place(graph: Dict[int, List[int]]) -> None:
    """No in-place cycle; at most ``MAX_IN_PLACE`` subschemas applied to a value, in chains of ``MAX_CHAIN``."""
    count: Dict[int, int] = {}
    chain: Dict[int, int] = {}
    for start in graph:
        if start in count:
            continue
        on_path = {start}
        stack: List[Tuple[int, int]] = [(start, 0)]
        while stack:
            node, index = stack[-1]
            children = graph[node]
            if index < len(children):
                stack[-1] = (node, index + 1)
                child = children[index]
                if child in on_path:
                    raise SchemaRefused(
                        "a $ref cycle applies a subschema to the same value forever (through $ref, allOf, "
                        "anyOf, oneOf, not, if/then/else); a recursive schema must descend into the document"
                    )
                if child not in count:
                    on_path.add(child)
                    stack.append((child, 0))
                continue
            stack.pop()
            on_path.discard(node)
            count[node] = 1 + sum(count[child] for child in children)
            chain[node] = 1 + max((chain[child] for child in children), default=0)
            if count[node] > MAX_IN_PLACE:
                raise SchemaRefused(
                    f"the schema applies more than {MAX_IN_PLACE} subschemas to one value "
                    "(through $ref, allOf, anyOf, oneOf…); that is the limit"
                )
            if chain[node] > MAX_CHAIN:
                raise SchemaRefused(
                    f"a chain of $ref and in-place subschemas longer than {MAX_CHAIN}; that is the limit"
                )

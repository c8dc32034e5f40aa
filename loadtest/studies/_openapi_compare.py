"""Compare two OpenAPI documents operation by operation.

``python -m loadtest.studies._openapi_compare BEFORE.json AFTER.json`` prints every
path, method, parameter (name and place), request body media type and
response status found in one document and not in the other, and exits 1 if
there is any. Descriptions and schemas are not compared: this answers "do
they describe the same operations?" (issue #45's before/after check). With
``--exact`` it also lists every JSON pointer whose value differs.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, Iterator, List, Set, Tuple

METHODS = ("get", "head", "put", "patch", "delete", "post", "options", "trace")
Json = Dict[str, Any]


def resolve(document: Json, node: Json) -> Json:
    """Follow local ``$ref``s (``#/components/...``) to what they name."""
    while "$ref" in node:
        target: Any = document
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def facts(document: Json) -> Set[Tuple[str, ...]]:
    """Every (path[, method[, kind, name]]) the document declares."""
    found: Set[Tuple[str, ...]] = set()
    for path, item in document.get("paths", {}).items():
        found.add(("path", path))
        shared = item.get("parameters", [])
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            found.add(("method", path, method))
            for parameter in [*shared, *operation.get("parameters", [])]:
                named = resolve(document, parameter)
                found.add(("parameter", path, method, f"{named['in']}:{named['name']}"))
            for media in resolve(document, operation.get("requestBody", {})).get("content", {}):
                found.add(("body", path, method, media))
            for status in operation.get("responses", {}):
                found.add(("status", path, method, status))
    return found


def differences(before: Any, after: Any, pointer: str = "") -> Iterator[str]:
    """JSON pointers whose values differ (for ``--exact``)."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            where = f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}"
            if key not in before or key not in after:
                yield f"{where}: only in {'after' if key not in before else 'before'}"
            else:
                yield from differences(before[key], after[key], where)
    elif before != after:
        yield f"{pointer}: {json.dumps(before)[:80]} != {json.dumps(after)[:80]}"


def main(argv: List[str]) -> int:
    exact = "--exact" in argv
    names = [arg for arg in argv if arg != "--exact"]
    if len(names) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(names[0]) as first, open(names[1]) as second:
        before, after = json.load(first), json.load(second)
    old, new = facts(before), facts(after)
    for fact in sorted(old - new):
        print("only before:", " ".join(fact))
    for fact in sorted(new - old):
        print("only after: ", " ".join(fact))
    changed = list(differences(before, after)) if exact else []
    for line in changed:
        print("differs:", line)
    print(
        f"{len(old)} facts before, {len(new)} after; {len(old ^ new)} differ"
        + (f"; {len(changed)} values differ" if exact else "")
    )
    return 1 if old ^ new or changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

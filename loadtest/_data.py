"""The test documents: JSON objects of a chosen size, made from their id.

The same id and size always give the same bytes, so every locust process
and the bench agree on the data without sharing anything but the options.
A document is shaped like an API record (scalars, a list of small objects)
rather than one long string, so that parsing it costs what parsing real
documents costs: that matters to the bench's decode-and-re-encode case.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

# Compact, ASCII-only, no trailing spaces: the encoding Jetway's codec uses.
_SEPARATORS = (",", ":")


def encode(value: Any) -> bytes:
    return json.dumps(value, separators=_SEPARATORS, ensure_ascii=True).encode()


def document(doc_id: str, size: int, version: int = 0) -> bytes:
    """A JSON object of exactly ``size`` bytes (more only if ``size`` is tiny)."""
    record: Dict[str, Any] = {
        "id": doc_id,
        "version": version,
        "name": f"record {doc_id}",
        "active": True,
        "score": 12.5,
        "tags": ["alpha", "beta"],
        "lines": [],
        "note": "",
    }
    used = len(encode(record))
    lines: List[Dict[str, Any]] = record["lines"]
    while True:
        line = _line(doc_id, len(lines))
        cost = len(encode(line)) + (1 if lines else 0)
        if used + cost > size:
            break
        lines.append(line)
        used += cost
    record["note"] = "n" * max(0, size - used)
    return encode(record)


def _line(doc_id: str, number: int) -> Dict[str, Any]:
    return {"sku": f"{doc_id}-{number:04d}", "qty": number % 7 + 1, "price": 9.75, "ok": number % 2 == 0}


def ids(prefix: str, count: int) -> List[str]:
    """``count`` document ids, in the byte order Jetway lists them in."""
    return [f"{prefix}{number:06d}" for number in range(count)]

"""How stale the stale reads were: a measure beside the checker's verdict, for the hot cache's bound.

A read that answered a version (by its ETag) whose next version in the
change feed was written by a write acknowledged before the read was sent
is stale by the time between that acknowledgement and the read's call.
The feed gives each document's versions in order. Reads without an ETag
(multi-get items) and versions replaced by a delete are not measured, so
this is a lower bound on what the checker judges; it names the worst.
"""

from __future__ import annotations

from typing import Any, Dict, List

READS = ("get", "head", "get304")
WRITES = ("put", "cas", "create", "patch")


def stale_reads(records: List[Dict[str, Any]], feed: List[Dict[str, Any]]) -> Dict[str, Any]:
    written = {(r["doc"], r["etag"]): r for r in records if r["kind"] in WRITES and r["status"] in (200, 201)}
    successor = {}
    by_doc: Dict[str, List[Dict[str, Any]]] = {}
    for event in feed:
        by_doc.setdefault(event["id"], []).append(event)
    for doc, events in by_doc.items():
        for before, after in zip(events, events[1:]):
            if before.get("etag") and (doc, after.get("etag")) in written:
                successor[(doc, before["etag"])] = written[(doc, after["etag"])]
    stale = []
    for read in records:
        if read["kind"] in READS and read["status"] in (200, 304) and read.get("etag"):
            replacing = successor.get((read["doc"], read["etag"]))
            if replacing is not None and replacing["ret"] < read["call"]:
                stale.append(((read["call"] - replacing["ret"]) / 1e6, read["n"], replacing["n"]))
    stale.sort(reverse=True)
    worst = stale[0] if stale else None
    return {
        "count": len(stale),
        "max_ms": round(worst[0], 1) if worst else 0.0,
        "worst": {"read": worst[1], "replaced_by_write": worst[2]} if worst else None,
    }

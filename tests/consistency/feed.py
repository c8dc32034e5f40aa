"""The change feed, read twice from the same run, and held to the recorded history.

``read_all`` reads the collection's feed after the run by long poll, from
a position taken before the first write: the whole feed. ``ResumingReader``
follows it over SSE during the run and drops its connection at random
points, resuming with ``Last-Event-ID``; what it read must be the whole
feed, each event once. ``check`` holds the whole feed to the history:

- every acknowledged write is in it exactly once (by its ETag; a delete,
  which has none, by counting a document's delete events);
- no event for a refused write: an event's ETag is an acknowledged or an
  indeterminate write's, and a document has no more events without an
  acknowledged ETag than it had indeterminate writes;
- a document's events are in the order of its acknowledged writes that
  did not overlap in time (the checker also holds the feed to a
  linearization: ``checker -feed``).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter, defaultdict
from typing import Any, Dict, List, Optional, Tuple

import requests

from tests.sse_client import SseClient

WRITES = ("put", "cas", "create", "patch", "delete", "cdelete")
# A write's statuses that say it happened.
DONE = {"put": (200, 201), "cas": (200,), "create": (201,), "patch": (200,), "delete": (204,), "cdelete": (204,)}


def position_now(base: str, token: str, collection: str) -> str:
    headers = {"Authorization": f"Bearer {token}"}
    answer = requests.get(f"{base}/v1/_changes/{collection}", params={"wait": "0"}, headers=headers, timeout=10)
    answer.raise_for_status()
    return answer.json()["next"]


def read_all(base: str, token: str, collection: str, since: str) -> List[Dict[str, Any]]:
    events: List[Dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {token}"}
    while True:
        params = {"since": since, "limit": "1000", "wait": "0"}
        answer = requests.get(f"{base}/v1/_changes/{collection}", params=params, headers=headers, timeout=30)
        answer.raise_for_status()
        page = answer.json()
        events += page["events"]
        if not page["events"]:
            return events
        since = page["next"]


class ResumingReader:
    """Follows the feed over SSE from ``since``, dropping the connection after 1-12 events (or on any error)."""

    def __init__(self, port: int, token: str, collection: str, since: str, seed: int = 0) -> None:
        self.port = port
        self.token = token
        self.path = f"/v1/_changes/{collection}"
        self.last_id = since
        self.events: List[Dict[str, Any]] = []
        self.reconnects = 0
        self.errors: Counter = Counter()
        self.rng = random.Random(seed)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ResumingReader:
        self.thread.start()
        return self

    def finish(self, expected: int, seconds: float = 15.0) -> None:
        """Read on until ``expected`` events arrived (or ``seconds`` passed), then stop."""
        deadline = time.monotonic() + seconds
        while len(self.events) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stopping.set()
        self.thread.join(15)

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self._one_connection(self.rng.randint(1, 12))
            except (OSError, ConnectionError, TimeoutError, ValueError) as error:
                self.errors[type(error).__name__] += 1
                time.sleep(0.05)
            self.reconnects += 1

    def _one_connection(self, drop_after: int) -> None:
        headers = {"Authorization": f"Bearer {self.token}", "Last-Event-ID": self.last_id}
        with SseClient(self.port, self.path, headers, timeout=5.0) as stream:
            if stream.response.status != 200:
                self.errors[f"status {stream.response.status}"] += 1
                time.sleep(0.1)
                return
            read = 0
            while not self.stopping.is_set() and read < drop_after:
                try:
                    event = stream.next_event(timeout=0.5)
                except TimeoutError:
                    continue
                if event is None:
                    self.errors["ended"] += 1
                    return
                if event.name not in ("message",):
                    if event.name != "ready":
                        self.errors[f"event {event.name}"] += 1
                        return
                    continue  # ready: its position is the one asked for
                self.events.append(event.json())
                if event.id:
                    self.last_id = event.id
                read += 1


def _key(event: Dict[str, Any]) -> Tuple[str, str, Optional[str]]:
    return (event["id"], event["op"], event.get("etag"))


def check(records: List[Dict[str, Any]], feed: List[Dict[str, Any]], lossy: bool = False) -> Dict[str, Any]:
    """What the feed got wrong against the history.

    ``lossy``: acknowledged writes may be missing (a failover without write concern).
    """
    problems: List[str] = []
    writes = [r for r in records if r["kind"] in WRITES]
    acked = [r for r in writes if r["status"] in DONE[r["kind"]]]
    unknown = [r for r in writes if r["status"] is None]
    events_by_etag = Counter((e["id"], e.get("etag")) for e in feed if e["op"] != "delete")
    deletes_by_doc = Counter(e["id"] for e in feed if e["op"] == "delete")
    missing = []
    for write in acked:
        if "delete" in write["kind"]:
            continue
        count = events_by_etag[(write["doc"], write["etag"])]
        if count == 0:
            missing.append(write)
        elif count > 1:
            problems.append(f"write {write['n']} ({write['doc']} {write['etag']}) has {count} events")
    if missing and not lossy:
        problems.append(f"{len(missing)} acknowledged writes have no event, e.g. {_brief(missing[0])}")
    known = {(w["doc"], w["etag"]) for w in writes if w["status"] is not None or w.get("etag")}
    unknown_by_doc = Counter(w["doc"] for w in unknown if "delete" not in w["kind"] and not w.get("etag"))
    strangers = Counter(e["id"] for e in feed if e["op"] != "delete" and (e["id"], e.get("etag")) not in known)
    for doc, count in strangers.items():
        if count > unknown_by_doc[doc]:
            problems.append(f"{doc}: {count} events of no known write (only {unknown_by_doc[doc]} indeterminate)")
    acked_deletes = Counter(w["doc"] for w in acked if "delete" in w["kind"])
    unknown_deletes = Counter(w["doc"] for w in unknown if "delete" in w["kind"])
    for doc in set(acked_deletes) | set(deletes_by_doc):
        low, high, seen = acked_deletes[doc], acked_deletes[doc] + unknown_deletes[doc], deletes_by_doc[doc]
        if seen > high or (seen < low and not lossy):
            unsure = high - low
            problems.append(f"{doc}: {seen} delete events for {low} acknowledged and {unsure} indeterminate deletes")
    problems += _order(acked, feed)
    return {
        "events": len(feed),
        "acknowledged_writes": len(acked),
        "indeterminate_writes": len(unknown),
        "acknowledged_missing": len(missing),
        "problems": problems,
    }


def _order(acked: List[Dict[str, Any]], feed: List[Dict[str, Any]]) -> List[str]:
    """Acknowledged non-delete writes of one document that did not overlap: their events in the same order."""
    where = {(e["id"], e.get("etag")): n for n, e in enumerate(feed) if e["op"] != "delete"}
    by_doc: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for write in acked:
        if "delete" not in write["kind"] and (write["doc"], write["etag"]) in where:
            by_doc[write["doc"]].append(write)
    problems = []
    for doc, writes in by_doc.items():
        writes.sort(key=lambda w: w["ret"])
        # The latest completion so far and its feed place: any later-invoked write must come after it.
        done: List[Tuple[int, int, Dict[str, Any]]] = []
        for write in sorted(writes, key=lambda w: w["call"]):
            place = where[(doc, write["etag"])]
            for ret, earlier_place, earlier in done:
                if ret < write["call"] and earlier_place > place:
                    problems.append(f"{doc}: feed has {_brief(write)} before {_brief(earlier)}, which completed first")
                    break
            done.append((write["ret"], place, write))
            if len(problems) > 20:
                return problems
    return problems


def compare(reader_events: List[Dict[str, Any]], feed: List[Dict[str, Any]]) -> List[str]:
    """The resuming reader read the whole feed, each event once, in the same order per document."""
    problems = []
    mine, theirs = Counter(map(_key, reader_events)), Counter(map(_key, feed))
    repeated = {k: n for k, n in mine.items() if n > 1 and n > theirs[k]}
    lost = theirs - mine
    extra = mine - theirs
    if repeated:
        problems.append(f"{len(repeated)} events read more than once, e.g. {next(iter(repeated))}")
    if lost:
        problems.append(f"{sum(lost.values())} events never read, e.g. {next(iter(lost))}")
    if extra:
        problems.append(f"{sum(extra.values())} events read that the feed does not have, e.g. {next(iter(extra))}")
    for doc in {e["id"] for e in feed}:
        if [_key(e) for e in reader_events if e["id"] == doc] != [_key(e) for e in feed if e["id"] == doc]:
            problems.append(f"{doc}: the resuming reader's order differs from the feed's")
            break
    return problems


def _brief(write: Dict[str, Any]) -> str:
    return json.dumps({k: write.get(k) for k in ("n", "kind", "doc", "via", "status", "etag")})

"""GET /v1/_changes/{coll}: every write as an event, by SSE or long poll, resumable, exactly once.

Against the session's Jetway (authorization on, 2 workers) on a real Redis
(or a Cluster or Sentinel group: ``make test-cluster`` runs this file too).
The ordering guarantee pinned here: a document's events arrive in the order
of its writes, each exactly once, across any number of reconnects.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from typing import Any, Dict, Iterable, List, Tuple

import pytest
import requests

from cache.keys import shard_of
from tests.sse_client import SseClient

ISO_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")


def stream(api, collection: str, query: str = "", **headers: str) -> SseClient:
    return SseClient(api.server.port, f"/v1/_changes/{collection}{query}", {**api.auth_header, **headers})


def ready(client: SseClient) -> str:
    """The first event: the reconnect delay and the starting position."""
    assert client.response.status == 200, client.response
    first = client.next_event()
    assert first is not None and first.name == "ready" and first.retry == 500
    assert first.json() == {"position": first.id}
    return first.id


def test_a_stream_from_now_carries_every_write_with_its_op_id_etag_and_time(api):
    with stream(api, "feedops") as client:
        assert client.response.headers["content-type"] == "text/event-stream"
        assert client.response.headers["cache-control"] == "no-store"
        assert client.response.headers["transfer-encoding"] == "chunked"
        start = ready(client)
        writes = [
            ("put", api.put_json("/v1/feedops/a", b'{"n":1}')),
            ("put", api.put_json("/v1/feedops/a", b'{"n":2}')),
            ("patch", api.patch_merge("/v1/feedops/a", b'{"m":3}')),
            ("create", api.post_json("/v1/feedops", b'{"n":4}')),
            ("delete", api.delete("/v1/feedops/a")),
        ]
        assert [response.status_code for _, response in writes] == [201, 200, 200, 201, 204]
        created = writes[3][1].headers["Location"].rsplit("/", 1)[1]
        events = client.events(5)
    got = [event.json() for event in events]
    # The feed orders each document's events; another document's may come
    # between them (its shard's stream is another), so compare per document.
    expected = [(op, created if op == "create" else "a", response.headers.get("ETag")) for op, response in writes]
    for doc_id in ("a", created):
        assert [(e["op"], e["id"], e["etag"]) for e in got if e["id"] == doc_id] == [
            event for event in expected if event[1] == doc_id
        ]
    assert all(ISO_MS.match(e["time"]) for e in got)
    positions = [start, *(event.id for event in events)]
    assert len(set(positions)) == 6 and all(positions)


def test_a_write_that_did_not_happen_is_no_event(api):
    api.put_json("/v1/feedfail/a", b"{}")
    with stream(api, "feedfail") as client:
        ready(client)
        assert api.put_json("/v1/feedfail/a", b"{}", headers={"If-Match": '"stale"'}).status_code == 412
        assert api.delete("/v1/feedfail/nope").status_code == 404
        assert api.put_json("/v1/feedfail/a", b'{"ok":1}').status_code == 200
        event = client.next_event()
    assert event.json()["op"] == "put" and event.json()["etag"] is not None
    assert client.comments == 0


def test_include_docs_inlines_the_stored_bytes_as_they_are_now(api):
    body = '{"b": [1,  2], "é": "\\u00e9"}'.encode()
    with stream(api, "feeddocs", "?include_docs=true") as client:
        ready(client)
        api.put_json("/v1/feeddocs/a", body)
        # The document as it is when the event is read: received before the delete, so it still exists.
        put = client.next_event()
        api.delete("/v1/feeddocs/a")
        deleted = client.next_event()
    assert f'"doc":{body.decode()}}}' in put.data  # verbatim, not re-encoded
    assert deleted.json()["doc"] is None
    # Long poll: the stored bytes exactly.
    start = api.get("/v1/_changes/feeddocs").json()["next"]
    pretty = b'{\r\n  "x": 1\n}'
    api.put_json("/v1/feeddocs/p", pretty)
    page = api.get(f"/v1/_changes/feeddocs?since={start}&include_docs=true")
    assert b'"doc":' + pretty + b"}" in page.content
    with stream(api, "feeddocs", "?include_docs=true", **{"Last-Event-ID": start}) as client:
        ready(client)
        event = client.next_event()
    assert event.json()["doc"] == {"x": 1}  # line breaks become data: lines; the JSON is the same


def test_a_long_poll_pages_from_since_and_says_where_to_go_on(api):
    now = api.get("/v1/_changes/feedpoll")
    assert now.status_code == 200 and now.headers["Cache-Control"] == "no-store"
    assert now.json()["events"] == []
    for n in range(5):
        api.put_json(f"/v1/feedpoll/d{n}", b"{}")
        time.sleep(0.002)  # each in a millisecond of its own: documents of two shards are ordered only by time
    since, seen = now.json()["next"], []
    for size in (2, 2, 1, 0):
        page = api.get(f"/v1/_changes/feedpoll?since={since}&limit=2").json()
        assert len(page["events"]) == size
        seen += [event["id"] for event in page["events"]]
        since = page["next"]
    assert seen == [f"d{n}" for n in range(5)]


def test_a_long_poll_waits_for_the_next_write_and_no_longer(api):
    since = api.get("/v1/_changes/feedwait").json()["next"]
    result: Dict[str, object] = {}

    def poll() -> None:
        started = time.monotonic()
        result["page"] = api.get(f"/v1/_changes/feedwait?since={since}&wait=20", timeout=30).json()
        result["seconds"] = time.monotonic() - started

    waiting = threading.Thread(target=poll)
    waiting.start()
    time.sleep(0.5)
    api.put_json("/v1/feedwait/x", b"{}")
    waiting.join(30)
    assert [event["id"] for event in result["page"]["events"]] == ["x"]
    assert result["seconds"] < 10  # woken by the write, not by the 20 s timeout

    started = time.monotonic()
    empty = api.get(f"/v1/_changes/feedwait?since={result['page']['next']}&wait=1").json()
    assert empty["events"] == [] and time.monotonic() - started >= 0.9


@pytest.mark.parametrize(
    "query,problem",
    [
        ("?since=xyz", "invalid-position"),
        ("?since=" + "A" * 600, "invalid-position"),
        ("?wait=61", "invalid-wait"),
        ("?wait=-1", "invalid-wait"),
        ("?limit=0", "invalid-limit"),
        ("?include_docs=yes", "invalid-include_docs"),
    ],
)
def test_bad_parameters_are_400s_that_say_which(api, query, problem):
    response = api.get("/v1/_changes/feedbad" + query)
    assert response.status_code == 400
    assert response.json()["type"] == "urn:jetway:problem:" + problem


def test_a_position_of_another_collection_is_refused(api):
    other = api.get("/v1/_changes/feedone").json()["next"]
    response = api.get(f"/v1/_changes/feedtwo?since={other}")
    assert response.status_code == 400 and "another collection" in response.json()["detail"]
    with stream(api, "feedtwo", **{"Last-Event-ID": other}) as client:
        assert client.response.status == 400


def test_reading_the_feed_takes_read_scope_on_the_collection(api):
    reader = api.server.make_token("feedreader", "read:feedscoped")
    assert requests.get(api.server.url("/v1/_changes/feedscoped"), timeout=10).status_code == 401
    own = requests.get(api.server.url("/v1/_changes/feedscoped"), headers={"Authorization": f"Bearer {reader}"})
    assert own.status_code == 200
    other = requests.get(api.server.url("/v1/_changes/feedother"), headers={"Authorization": f"Bearer {reader}"})
    assert other.status_code == 403


def test_events_of_one_document_keep_its_order_under_concurrent_writers(api):
    with stream(api, "feedorder") as client:
        ready(client)
        etags: Dict[str, List[str]] = {f"d{n}": [] for n in range(8)}

        def write(doc: str) -> None:
            for k in range(25):
                etags[doc].append(api.put_json(f"/v1/feedorder/{doc}", b'{"k":%d}' % k).headers["ETag"])

        threads = [threading.Thread(target=write, args=(doc,)) for doc in etags]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        events = [event.json() for event in client.events(200)]
    seen: Dict[str, List[str]] = {doc: [] for doc in etags}
    for event in events:
        seen[event["id"]].append(event["etag"])
    assert seen == etags


class Writer(threading.Thread):
    """Writes ``docs`` documents round-robin until stopped; keeps each document's ETags in order."""

    def __init__(self, api, collection: str, docs: List[str], pause: float = 0.002) -> None:
        super().__init__()
        self.api, self.collection, self.docs, self.pause = api, collection, docs, pause
        self.etags: Dict[str, List[str]] = {doc: [] for doc in docs}
        self.stopping = threading.Event()
        self.failures: List[str] = []

    def run(self) -> None:
        session = requests.Session()
        session.headers.update(self.api.auth_header)
        k = 0
        while not self.stopping.is_set():
            doc = self.docs[k % len(self.docs)]
            try:
                response = session.put(
                    self.api.server.url(f"/v1/{self.collection}/{doc}"),
                    data=b'{"k":%d}' % k,
                    headers={"Content-Type": "application/json"},
                    timeout=10,
                )
            except requests.RequestException as error:
                self.failures.append(str(error))
                continue
            if response.status_code in (200, 201):
                self.etags[doc].append(response.headers["ETag"])
            else:
                self.failures.append(f"{response.status_code} {response.text[:200]}")
            k += 1
            time.sleep(self.pause)

    @property
    def total(self) -> int:
        return sum(len(tags) for tags in self.etags.values())


def follow(api, collection: str, position: str, events: List[Tuple[str, str]], until: int, timeout: float) -> str:
    """Read (reconnecting as needed) until ``until`` events were seen in all; returns the last position."""
    deadline = time.monotonic() + timeout
    while len(events) < until and time.monotonic() < deadline:
        with stream(api, collection, **{"Last-Event-ID": position}) as client:
            ready(client)
            while len(events) < until:
                event = client.next_event()
                if event is None or event.id is None:
                    break
                events.append((event.json()["id"], event.json()["etag"]))
                position = event.id
    return position


def test_a_subscriber_dropped_100_times_at_random_gets_every_write_once_in_order(api):
    """Each drop is an abrupt close (an RST), after a random number of events, often mid-chunk."""
    rng = random.Random(23)
    with stream(api, "feedresume") as client:
        position = ready(client)
    writer = Writer(api, "feedresume", [f"d{n}" for n in range(12)])
    writer.start()
    events: List[Tuple[str, str]] = []
    try:
        for _ in range(100):
            with stream(api, "feedresume", **{"Last-Event-ID": position}) as client:
                assert ready(client) == position
                for _ in range(rng.randint(0, 12)):
                    event = client.next_event()
                    events.append((event.json()["id"], event.json()["etag"]))
                    position = event.id
                if rng.random() < 0.5:
                    time.sleep(rng.random() * 0.05)  # let more arrive, unread, then drop them
    finally:
        writer.stopping.set()
        writer.join(30)
    assert not writer.failures, writer.failures[:5]
    follow(api, "feedresume", position, events, writer.total, timeout=60)
    seen: Dict[str, List[str]] = {doc: [] for doc in writer.etags}
    for doc, etag in events:
        seen[doc].append(etag)
    assert len(events) == writer.total > 300
    assert seen == writer.etags


def test_a_long_poll_loop_sees_every_write_once(api):
    since = api.get("/v1/_changes/feedlp").json()["next"]
    writer = Writer(api, "feedlp", ["a", "b", "c"])
    writer.start()
    events: List[Tuple[str, str]] = []
    # At least 30 polls, and on until more than 30 writes were made (a busy
    # machine may slow the writer more than the polls): generous, not timed.
    polls, deadline = 0, time.monotonic() + 120
    try:
        while (polls < 30 or writer.total <= 30) and time.monotonic() < deadline:
            page = api.get(f"/v1/_changes/feedlp?since={since}&wait=1&limit=7").json()
            events += [(event["id"], event["etag"]) for event in page["events"]]
            since = page["next"]
            polls += 1
    finally:
        writer.stopping.set()
        writer.join(30)
    while True:
        page = api.get(f"/v1/_changes/feedlp?since={since}&limit=1000").json()
        if not page["events"]:
            break
        events += [(event["id"], event["etag"]) for event in page["events"]]
        since = page["next"]
    seen: Dict[str, List[str]] = {doc: [] for doc in writer.etags}
    for doc, etag in events:
        seen[doc].append(etag)
    assert seen == writer.etags and writer.total > 30


def test_an_http_1_0_client_gets_the_stream_until_the_connection_closes(api):
    with SseClient(api.server.port, "/v1/_changes/feedold", api.auth_header, http10=True) as client:
        assert "transfer-encoding" not in client.response.headers
        assert client.response.headers["connection"].lower() == "close"
        ready(client)
        api.put_json("/v1/feedold/a", b"{}")
        assert client.next_event().json()["id"] == "a"


def test_metrics_count_streams_and_events(api):
    def metric(name: str) -> float:
        text = api.get("/metrics").text
        found = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    sent_before = metric("jetway_feed_events_sent_total")
    with stream(api, "feedmetrics") as client:
        ready(client)
        api.put_json("/v1/feedmetrics/a", b"{}")
        client.next_event()
        time.sleep(1.2)  # other workers flush once a second
        assert metric("jetway_feed_subscribers") >= 1
    assert metric("jetway_feed_events_sent_total") >= sent_before + 1


def test_json_is_what_the_stream_events_hold(api):
    """A stream's data and a long poll's events are the same objects."""
    since = api.get("/v1/_changes/feedsame").json()["next"]
    with stream(api, "feedsame") as client:
        ready(client)
        api.put_json("/v1/feedsame/a", b"{}")
        streamed = client.next_event()
    polled = api.get(f"/v1/_changes/feedsame?since={since}").json()
    assert polled["events"] == [json.loads(streamed.data)]
    assert polled["next"] == streamed.id


# -- writes made by POST /v1/_batch and retried by an Idempotency-Key --


def poll_all(api, collection: str, since: str) -> List[Dict[str, str]]:
    """Every event after ``since``, by long-poll pages, until a page comes back empty."""
    events: List[Dict[str, str]] = []
    while True:
        page = api.get(f"/v1/_changes/{collection}?since={since}&limit=100")
        assert page.status_code == 200, page.text
        events += page.json()["events"]
        since = page.json()["next"]
        if not page.json()["events"]:
            return events


def per_document(events: Iterable[Tuple[Any, ...]]) -> Dict[str, List[Any]]:
    """Each document's events as (id, what...) tuples, grouped by id in the order received (what alone when it is
    one value): all a feed promises. Events of different documents are merged by time with no stronger order
    (docs/api.md): two writes in one millisecond to documents of two shards may come either way round."""
    found: Dict[str, List[Any]] = {}
    for doc_id, *rest in events:
        found.setdefault(doc_id, []).append(rest[0] if len(rest) == 1 else tuple(rest))
    return found


def by_document(events: List[Dict[str, str]]) -> Dict[str, List[str]]:
    """Each document's ops in the order received (``per_document``)."""
    return per_document((event["id"], event["op"]) for event in events)


def post_batch(api, *operations: Dict[str, object], **kwargs) -> requests.Response:
    return api.post_json("/v1/_batch", json.dumps({"operations": list(operations)}).encode(), **kwargs)


def test_a_batchs_writes_are_events_as_the_same_writes_alone_are_and_its_failures_are_none(api):
    since = api.get("/v1/_changes/feedbatch").json()["next"]
    assert api.put_json("/v1/feedbatch/a", b"{}").status_code == 201
    answer = post_batch(
        api,
        {"op": "put", "collection": "feedbatch", "id": "b", "document": {"n": 1}},
        {"op": "put", "collection": "feedbatch", "id": "a", "document": {}, "if_match": '"stale"'},
        {"op": "patch", "collection": "feedbatch", "id": "a", "patch": {"m": 2}},
        {"op": "create", "collection": "feedbatch", "document": {"n": 3}},
        {"op": "delete", "collection": "feedbatch", "id": "a"},
        {"op": "delete", "collection": "feedbatch", "id": "nope"},
        {"op": "get", "collection": "feedbatch", "id": "b"},
    )
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [result["status"] for result in results] == [201, 412, 200, 201, 204, 404, 200]
    events = poll_all(api, "feedbatch", since)
    assert len(events) == 5
    assert by_document(events) == {"a": ["put", "patch", "delete"], "b": ["put"], results[3]["id"]: ["create"]}
    etags = {(event["op"], event["id"]): event["etag"] for event in events}
    assert etags[("put", "b")] == results[0]["etag"] and etags[("patch", "a")] == results[2]["etag"]
    assert etags[("create", results[3]["id"])] == results[3]["etag"] and etags[("delete", "a")] is None


def test_a_batch_nudges_each_shard_once_with_its_last_event_and_a_stream_gets_every_write(api, redis_client):
    """WRITE_MANY publishes one nudge per shard after its writes (cache/documents/scripts.py), naming the shard's last
    event: a follower woken by it reads the shard's writes up to there. Two collections in one call share
    shard numbers, not channels: each is nudged on its own."""
    collections = ("feednudge", "feednudge2")
    listener = redis_client.pubsub()
    listener.subscribe(*(f"jw:feed:{name}" for name in collections))
    for _ in collections:
        assert listener.get_message(timeout=5)["type"] == "subscribe"
    operations = [
        {"op": "put", "collection": name, "id": f"d{number}", "document": {"n": number}}
        for number in range(60)  # ~4 a shard of the 16: several writes behind each nudge
        for name in collections
    ]
    with stream(api, "feednudge") as client:
        ready(client)
        answer = post_batch(api, *operations)
        assert answer.status_code == 200 and {r["status"] for r in answer.json()["results"]} == {201}
        events = client.events(60)
    assert sorted(event.json()["id"] for event in events) == sorted(f"d{number}" for number in range(60))
    nudges: Dict[str, List[List[str]]] = {name: [] for name in collections}
    while (message := listener.get_message(timeout=0.5)) is not None:
        nudges[message["channel"].decode()[len("jw:feed:") :]].append(message["data"].decode().split(" "))
    listener.close()
    written = {f"{shard_of(f'd{number}'.encode()):02x}" for number in range(60)}
    for name, sent in nudges.items():
        last_nudge = dict(sent)  # each shard's last
        assert set(last_nudge) == written, (name, sent)  # every shard written, in each collection
        # 120 writes go in two calls (cache.batches.groups.GROUP_WRITES): a shard once a call, not once a write.
        assert len(sent) <= 2 * len(written) < 60, (name, sent)
        for shard, event_id in last_nudge.items():
            last = redis_client.xrevrange(f"jw:{{{name}:{shard}}}:f", count=1)[0][0].decode()
            assert event_id == last, (name, shard, event_id, last)


def test_a_retried_batch_or_post_with_its_idempotency_key_is_one_event_per_write(api):
    since = api.get("/v1/_changes/feedretry").json()["next"]
    operations = [
        {"op": "create", "collection": "feedretry", "document": {"n": 1}},
        {"op": "put", "collection": "feedretry", "id": "p", "document": {"n": 2}},
    ]
    first = post_batch(api, *operations, headers={"Idempotency-Key": "feed-batch-1"})
    again = post_batch(api, *operations, headers={"Idempotency-Key": "feed-batch-1"})
    assert again.headers["Idempotency-Replayed"] == "true" and again.content == first.content
    created = api.post_json("/v1/feedretry", b'{"n":3}', headers={"Idempotency-Key": "feed-post-1"})
    replayed = api.post_json("/v1/feedretry", b'{"n":3}', headers={"Idempotency-Key": "feed-post-1"})
    assert replayed.headers["Location"] == created.headers["Location"]
    events = poll_all(api, "feedretry", since)
    assert len(events) == 3
    assert by_document(events) == {
        first.json()["results"][0]["id"]: ["create"],
        "p": ["put"],
        created.headers["Location"].rsplit("/", 1)[1]: ["create"],
    }

"""Live queries: the change feed filtered by a query over a declared index (cache/feed/live_queries.py)."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from tests.handlers.test_changes import per_document
from tests.handlers.test_queries import INDEXES, PROBLEM, declare

STATUS = {"by_status": {"fields": [{"name": "status", "pointer": "/status", "type": "string"}]}}


def now(api, collection: str) -> str:
    return api.get(f"/v1/_changes/{collection}").json()["next"]


def live(api, collection: str, query: str, since: str) -> List[Tuple[str, str, bool]]:
    """Every event of the live query after ``since``, as (id, op, matches), by long-poll pages."""
    seen: List[Tuple[str, str, bool]] = []
    while True:
        page = api.get(f"/v1/_changes/{collection}?{query}&since={since}&limit=7")
        assert page.status_code == 200, page.text
        events = page.json()["events"]
        seen += [(event["id"], event["op"], event["matches"]) for event in events]
        if not events and page.json()["next"] == since:
            return seen  # caught up: an empty page that read nothing
        since = page.json()["next"]


def test_the_events_of_documents_that_match_or_stop_matching_each_say_which(api) -> None:
    declare(api, "tickets", STATUS)
    since = now(api, "tickets")
    api.put_json("/v1/tickets/a", b'{"status": "open"}')
    api.put_json("/v1/tickets/b", b'{"status": "closed"}')  # never the query's
    api.put_json("/v1/tickets/a", b'{"status": "open", "n": 2}')  # still matching: an update of a match
    api.put_json("/v1/tickets/a", b'{"status": "closed"}')  # stops matching
    api.put_json("/v1/tickets/a", b'{"status": "closed", "n": 3}')  # not the query's any more
    api.patch_merge("/v1/tickets/b", b'{"status": "open"}')
    api.delete("/v1/tickets/b")  # a match removed: stops matching
    api.put_json("/v1/tickets/c", b'{"status": 1}')  # another type: in no index
    batch = {"operations": [{"op": "put", "collection": "tickets", "id": "d", "document": {"status": "open"}}]}
    assert api.post_json("/v1/_batch", json.dumps(batch).encode()).status_code == 200
    assert per_document(live(api, "tickets", "status=eq.open", since)) == {
        "a": [("put", True), ("put", True), ("put", False)],
        "b": [("patch", True), ("delete", False)],
        "d": [("put", True)],
    }
    # The plain feed is as it was: every event, and no judgement.
    plain = api.get(f"/v1/_changes/tickets?since={since}").json()["events"]
    assert len(plain) == 9 and all("matches" not in event for event in plain)


def test_a_document_that_matched_before_the_subscription_is_told_when_it_stops(api) -> None:
    declare(api, "older", STATUS)
    api.put_json("/v1/older/a", b'{"status": "open"}')
    since = now(api, "older")
    api.put_json("/v1/older/a", b'{"status": "done"}')
    assert live(api, "older", "status=eq.open", since) == [("a", "put", False)]


def matches(document: Optional[Dict[str, Any]], customer: str, low: float, high: float) -> bool:
    if document is None:
        return False
    created, owner = document.get("created"), document.get("customer", {}).get("id")
    number = isinstance(created, (int, float)) and not isinstance(created, bool)
    return owner == customer and number and low <= created < high


def test_a_live_query_with_in_matches_exactly_what_the_query_does(api) -> None:
    """Generated writes; a live query with ``in`` (and one with ``in`` and a range, and a prefix) is told of each
    document whose version before or after the write is one the same filters on a query would answer, and nothing
    else."""
    from tests.handlers.test_queries import in_list, query_all

    declare(api, "livein", {"by_status_created": {"fields": [STATUS["by_status"]["fields"][0],
                            {"name": "created", "pointer": "/created", "type": "number"}]}})  # fmt: skip
    since = now(api, "livein")
    rng = random.Random(59)
    statuses = ["open", "opened", "held", "closed", "a,b", 'q"t', 7]
    written: List[Tuple[str, Optional[Dict[str, Any]]]] = []
    for _ in range(150):
        doc_id = f"d{rng.randrange(15)}"
        if rng.random() < 0.15:
            if api.delete(f"/v1/livein/{doc_id}").status_code == 204:
                written.append((doc_id, None))
            continue
        document = {"status": rng.choice(statuses), "created": rng.choice([0, 5, 10, 15, "x"])}
        assert api.put_json(f"/v1/livein/{doc_id}", json.dumps(document).encode()).status_code in (200, 201)
        written.append((doc_id, document))
    filters = [
        (in_list(["open", "a,b"]), lambda d: d["status"] in ("open", "a,b")),
        (in_list(["held", 'q"t', "none"]) + "&created=gte.10",
         lambda d: d["status"] in ("held", 'q"t') and isinstance(d["created"], int) and d["created"] >= 10),
        ("like.o*", lambda d: d["status"].startswith("o")),
    ]  # fmt: skip
    for written_filter, matches_now in filters:
        query = f"status={written_filter}"

        def matching(document: Optional[Dict[str, Any]], matches_now: Any = matches_now) -> bool:
            # In the index: a string status and a number created.
            indexed = document is not None and isinstance(document["status"], str) and document["created"] != "x"
            return indexed and matches_now(document)

        last: Dict[str, Optional[Dict[str, Any]]] = {}
        expected = []
        for doc_id, after in written:
            before = last.get(doc_id)
            if matching(before) or matching(after):
                expected.append((doc_id, matching(after)))
            last[doc_id] = after
        got = [(doc_id, matched) for doc_id, _, matched in live(api, "livein", query, since)]
        assert per_document(got) == per_document(expected), query
        # The documents that match now are those the query answers.
        answered = sorted(json.dumps(d, sort_keys=True) for d in query_all(api, "livein", query))
        assert answered == sorted(json.dumps(d, sort_keys=True) for d in last.values() if matching(d))


def test_generated_writes_are_judged_as_their_documents_before_and_after(api) -> None:
    """Random writes by several writers at once; each document's events held to a model of its versions."""
    declare(api, "livegen", INDEXES)
    since = now(api, "livegen")
    chooser = random.Random(47)
    plans = [[(chooser.randrange(12), chooser.random()) for _ in range(60)] for _ in range(3)]
    written: Dict[str, List[Optional[Dict[str, Any]]]] = {}
    lock = threading.Lock()

    def write(plan: List[Tuple[int, float]], writer: int) -> None:
        for number, dice in plan:
            doc_id = f"d{number}"
            document: Optional[Dict[str, Any]] = None
            if dice > 0.15:
                customer = ["ann", "bob"][int(dice * 10) % 2]
                document = {"customer": {"id": customer}, "created": int(dice * 100) % 40}
                if dice > 0.9:
                    document["created"] = "not a number"
            with lock:  # one writer at a time per document: the model knows each version's predecessor
                if document is None:
                    answer = api.delete(f"/v1/livegen/{doc_id}")
                else:
                    answer = api.put_json(f"/v1/livegen/{doc_id}", json.dumps(document).encode())
                if answer.status_code in (200, 201, 204):
                    written.setdefault(doc_id, []).append(document)

    threads = [threading.Thread(target=write, args=(plan, n)) for n, plan in enumerate(plans)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    got = live(api, "livegen", "customer=eq.ann&created=gte.10&created=lt.30", since)
    expected: List[Tuple[str, bool]] = []
    for doc_id, versions in written.items():
        before = None
        for after in versions:
            if matches(before, "ann", 10, 30) or matches(after, "ann", 10, 30):
                expected.append((doc_id, matches(after, "ann", 10, 30)))
            before = after
    assert per_document([(doc_id, matched) for doc_id, _, matched in got]) == per_document(expected)
    assert len(expected) > 20  # the plan does exercise it


def test_a_live_long_poll_waits_through_events_that_are_not_its_own(api) -> None:
    declare(api, "livewait", STATUS)
    since = now(api, "livewait")

    def later() -> None:
        time.sleep(0.3)
        api.put_json("/v1/livewait/x", b'{"status": "closed"}')
        time.sleep(0.5)
        api.put_json("/v1/livewait/y", b'{"status": "open"}')

    writer = threading.Thread(target=later)
    started = time.monotonic()
    writer.start()
    page = api.get(f"/v1/_changes/livewait?status=eq.open&since={since}&wait=10").json()
    writer.join()
    assert [event["id"] for event in page["events"]] == ["y"]
    assert 0.7 < time.monotonic() - started < 9
    quiet = api.get(f"/v1/_changes/livewait?status=eq.open&since={page['next']}&wait=1")
    assert quiet.json()["events"] == []


def test_include_docs_comes_with_a_live_query_too(api) -> None:
    declare(api, "livedocs", STATUS)
    since = now(api, "livedocs")
    api.put_json("/v1/livedocs/a", b'{"status": "open", "title": "t"}')
    events = api.get(f"/v1/_changes/livedocs?status=eq.open&since={since}&include_docs=true").json()["events"]
    assert [(event["matches"], event["doc"]) for event in events] == [(True, {"status": "open", "title": "t"})]


def test_a_live_query_no_index_answers_or_that_is_malformed_is_a_400(api) -> None:
    declare(api, "livebad", STATUS)
    for query, problem in (
        ("title=eq.x", "no-index"),
        ("status=gt.a&status=gt.b", "invalid-query"),
        ("status=eq.open&order=status.desc", "invalid-query"),
    ):
        answer = api.get(f"/v1/_changes/livebad?{query}")
        assert answer.status_code == 400 and answer.json()["type"] == PROBLEM + problem, (query, answer.text)
    streamed = api.get("/v1/_changes/livebad?title=eq.x", headers={"Accept": "text/event-stream"})
    assert streamed.status_code == 400 and streamed.json()["type"] == PROBLEM + "no-index"  # before the stream
    # The feed's own arguments are never filters, whatever they look like.
    assert api.get("/v1/_changes/livebad?wait=0&limit=5").status_code == 200


def redis_calls(client) -> Dict[str, int]:
    """Calls of each Redis command so far (``INFO commandstats``; a script's own commands counted apart)."""
    return {name[len("cmdstat_") :]: stats["calls"] for name, stats in client.info("commandstats").items()}


def test_a_live_poll_that_read_ten_thousand_events_none_its_own_answers_and_says_read_on(api, redis_client) -> None:
    """An empty page whose ``next`` moved: it looked at LIVE_LOOK events, none the query's (handlers/changes.py),
    in a few reads whatever its ``limit`` (issue #55 item 5: ``limit=1`` read one event a shard a round trip,
    160,000 script calls over 10,000 events)."""
    from handlers.changes import LIVE_LOOK

    declare(api, "livelook", STATUS)
    since = now(api, "livelook")
    for start in range(0, LIVE_LOOK + 50, 1000):
        operations = [
            {"op": "put", "collection": "livelook", "id": f"n{n}", "document": {"status": "closed"}}
            for n in range(start, min(start + 1000, LIVE_LOOK + 50))
        ]
        assert api.post_json("/v1/_batch", json.dumps({"operations": operations}).encode()).status_code == 200
    api.put_json("/v1/livelook/m", b'{"status": "open"}')
    before = redis_calls(redis_client)
    first = api.get(f"/v1/_changes/livelook?status=eq.open&since={since}&limit=1&wait=0").json()
    after = redis_calls(redis_client)
    assert first["events"] == [] and first["next"] != since
    # The session's other workers may sweep a feed meanwhile (16 XREVRANGE every 2 s): not the poll's.
    spent = {name: calls - before.get(name, 0) for name, calls in after.items() if calls != before.get(name, 0)}
    assert spent.get("evalsha", 0) <= 100 and spent.get("xrange", 0) <= 100, spent
    assert live(api, "livelook", "status=eq.open", first["next"]) == [("m", "put", True)]


def test_a_waiting_live_poll_woken_by_events_not_its_own_answers_after_a_bounded_number_of_reads(
    api, redis_client
) -> None:
    """Each wake is a read of every shard: a poll answers after LIVE_POLLS of them, not after ``wait`` of
    wakes (issue #55 item 5), with an empty page whose ``next`` moved."""
    declare(api, "livewoken", STATUS)
    since = now(api, "livewoken")
    writes = 80

    def busy() -> None:
        for n in range(writes):
            api.put_json(f"/v1/livewoken/n{n}", b'{"status": "closed"}')
            time.sleep(0.05)

    writer = threading.Thread(target=busy)
    before = redis_calls(redis_client)
    started = time.monotonic()
    writer.start()
    page = api.get(f"/v1/_changes/livewoken?status=eq.open&since={since}&wait=30").json()
    took = time.monotonic() - started
    writer.join()
    after = redis_calls(redis_client)
    assert page["events"] == [] and page["next"] != since and took < 20
    # Only the feed's reads run XINFO: the poll's (at most 6 reads of 16 shards) and the hub's, one a write at most.
    assert after.get("xinfo|stream", 0) - before.get("xinfo|stream", 0) <= 96 + writes


def test_a_live_polls_next_is_past_the_events_it_looked_at_up_to_its_limit_of_its_own(api) -> None:
    declare(api, "livenext", STATUS)
    since = now(api, "livenext")
    for n in range(6):
        api.put_json(f"/v1/livenext/d{n}", json.dumps({"status": "open" if n in (1, 3) else "x"}).encode())
        time.sleep(0.002)  # each in a millisecond of its own: the feed orders documents only by time (per_document)
    first = api.get(f"/v1/_changes/livenext?status=eq.open&since={since}&limit=1").json()
    assert [event["id"] for event in first["events"]] == ["d1"]
    second = api.get(f"/v1/_changes/livenext?status=eq.open&since={first['next']}&limit=1").json()
    assert [event["id"] for event in second["events"]] == ["d3"]
    rest = api.get(f"/v1/_changes/livenext?since={second['next']}").json()["events"]
    assert [event["id"] for event in rest] == ["d4", "d5"]  # the plain feed from there: nothing skipped


# -- the same as an event stream ------------------------------------------


def test_a_live_stream_carries_its_own_events_live_and_after_a_reconnect(api) -> None:
    from tests.handlers.test_changes import ready, stream

    declare(api, "livesse", STATUS)
    with stream(api, "livesse", "?status=eq.open&include_docs=true") as client:
        ready(client)
        api.put_json("/v1/livesse/a", b'{"status": "closed"}')  # not its own
        api.put_json("/v1/livesse/b", b'{"status": "open"}')
        api.put_json("/v1/livesse/b", b'{"status": "done"}')
        live_events = client.events(2)
        assert [(e.json()["id"], e.json()["matches"]) for e in live_events] == [("b", True), ("b", False)]
        # The document as it is when the event is sent, as include_docs has it: the first may be either version.
        assert live_events[0].json()["doc"] in ({"status": "open"}, {"status": "done"})
        assert live_events[1].json()["doc"] == {"status": "done"}
        last_id = live_events[-1].id
    # Written while no one follows: a resumed stream catches up from its last id, its own events only.
    for n in range(30):
        api.put_json(f"/v1/livesse/c{n}", json.dumps({"status": "open" if n % 3 == 0 else "x"}).encode())
    api.delete("/v1/livesse/c0")
    with stream(api, "livesse", "?status=eq.open", **{"Last-Event-ID": last_id}) as client:
        ready(client)
        caught_up = [(e.json()["id"], e.json()["op"], e.json()["matches"]) for e in client.events(11)]
        api.put_json("/v1/livesse/z", b'{"status": "open"}')
        then = client.next_event(timeout=10)
    expected = [(f"c{n}", "put", True) for n in range(0, 30, 3)] + [("c0", "delete", False)]
    assert sorted(caught_up) == sorted(expected)
    assert [e for e in caught_up if e[0] == "c0"] == [("c0", "put", True), ("c0", "delete", False)]
    assert then is not None and (then.json()["id"], then.json()["matches"]) == ("z", True)


def test_a_chunks_frames_for_a_live_query_are_made_once_for_all_its_subscribers() -> None:
    from cache.feed.live_queries import LiveQuery
    from cache.feed.streams import Event
    from handlers.feed.hub import Chunk

    def event(n: int, entry: bytes) -> Event:
        return Event(0, (n, 0), b"put", b"d%d" % n, b'"e"', ((b"x:i:v", entry), (b"w:i:v", b"")))

    chunk = Chunk(b"", (), 2, [(event(1, b"a1"), b"t1", None), (event(2, b"b2"), b"t2", None)])
    only_a = LiveQuery(b"x:i:v", b"w:i:v", ((b"[a", b"(b"),))
    frames, count, after = chunk.judged(only_a, False)
    assert count == 1 and after == 1 and b"id: t1\n" in frames and b'"matches":true' in frames and b"t2" not in frames
    assert chunk.judged(LiveQuery(b"x:i:v", b"w:i:v", ((b"[a", b"(b"),)), False)[0] is frames  # an equal query: shared
    assert chunk.judged(LiveQuery(b"x:i:v", b"w:i:v", ((b"[b", b"+"),)), False)[1] == 1  # another: its own


def test_a_lane_judges_a_chunk_once_for_all_its_live_queries_as_each_alone_would() -> None:
    """``Lane.live_index``: the chunk's events judged in one pass for every query of the lane (issue #55 item 6)."""
    from cache.feed.live_queries import LiveQuery
    from cache.feed.streams import Event
    from handlers.feed.hub import Chunk, Lane

    def event(n: int, now: bytes, before: bytes) -> Event:
        return Event(0, (n, 0), b"put", b"d%d" % n, b'"e"', ((b"x:i:v", now), (b"w:i:v", before)))

    framed = [(event(n, b"v%d" % (n % 4), b"v%d" % ((n + 1) % 4)), b"t%d" % n, None) for n in range(40)]
    queries = [LiveQuery(b"x:i:v", b"w:i:v", ((b"[v%d" % n, b"[v%d" % n),)) for n in range(4)]
    lane = Lane(())
    for query in [*queries, queries[0]]:
        lane.follow(query)
    together = Chunk(b"", (), len(framed), framed, lane.live_index())
    for query in queries:
        alone = Chunk(b"", (), len(framed), framed)
        assert together.judged(query, False) == alone.judged(query, False)
    lane.unfollow(queries[0])
    assert lane.live_index() is not None and queries[0] in lane.live_index().queries  # one subscription left
    lane.unfollow(queries[0])
    assert queries[0] not in lane.live_index().queries


def test_a_live_query_with_cs_is_told_when_the_value_enters_or_leaves_a_documents_array(api) -> None:
    """``tags=cs.{red}`` (alone and with a range on the field after it) as a live query (issue #59): an event for
    each write whose document held red before or after, ``matches: false`` when red left its array (or it was
    deleted), one event whatever the duplicates; other writes are not its own. Held to a model of the writes."""
    from tests.handlers.test_queries import query_all

    tags = {"name": "tags", "pointer": "/tags", "type": "string[]"}
    declare(api, "livecs", {"by_tags": {"fields": [tags]},
                            "by_tags_created": {"fields": [tags, {"name": "created", "pointer": "/created",
                                                                  "type": "number"}]}})  # fmt: skip
    since = now(api, "livecs")
    written: List[Tuple[str, Optional[Dict[str, Any]]]] = []

    def write(doc_id: str, document: Optional[Dict[str, Any]]) -> None:
        if document is None:
            assert api.delete(f"/v1/livecs/{doc_id}").status_code == 204
        else:
            assert api.put_json(f"/v1/livecs/{doc_id}", json.dumps(document).encode()).status_code in (200, 201)
        written.append((doc_id, document))

    # By hand: red in, twice, once again (still a match), out, absent again, in as a string (no entry), deleted.
    for document in (
        {"tags": ["red"], "created": 1},
        {"tags": ["red", "blue", "red"], "created": 12},
        {"tags": ["red"], "created": 13},
        {"tags": ["blue"], "created": 14},
        {"tags": [], "created": 15},
        {"tags": "red", "created": 16},
        {"tags": ["red", 3, "red"], "created": 17},
        None,
    ):
        write("a", document)
    rng = random.Random(5959)
    choices = [["red"], ["red", "red"], ["blue", "red"], ["red", 3], ["blue"], ["blue", "blue"], [], [3], "red"]
    for _ in range(150):
        doc_id = f"d{rng.randrange(12)}"
        stored = [after for d, after in written if d == doc_id]
        if rng.random() < 0.15 and stored and stored[-1] is not None:
            write(doc_id, None)
            continue
        document = {"tags": rng.choice(choices), "created": rng.choice([0, 5, 10, 15, "x"])}
        if rng.random() < 0.1:
            del document["tags"]
        write(doc_id, document)

    def red(document: Optional[Dict[str, Any]]) -> bool:
        return document is not None and isinstance(document.get("tags"), list) and "red" in document["tags"]

    def red_since_ten(document: Optional[Dict[str, Any]]) -> bool:
        created = None if document is None else document["created"]
        return red(document) and isinstance(created, int) and created >= 10

    for query, matching in (("tags=cs.%7Bred%7D", red), ("tags=cs.%7Bred%7D&created=gte.10", red_since_ten)):
        last: Dict[str, Optional[Dict[str, Any]]] = {}
        expected = []
        for doc_id, after in written:
            before = last.get(doc_id)
            if matching(before) or matching(after):
                expected.append((doc_id, "delete" if after is None else "put", matching(after)))
            last[doc_id] = after
        got = live(api, "livecs", query, since)
        assert per_document(got) == per_document(expected), query
        assert sum(not matched for _, _, matched in expected) > 10  # red did leave arrays, and was told
        answered = sorted(json.dumps(d, sort_keys=True) for d in query_all(api, "livecs", query))
        assert answered == sorted(json.dumps(d, sort_keys=True) for d in last.values() if matching(d))
    # The hand-written document's own events, as the model has them.
    assert [event for event in live(api, "livecs", "tags=cs.%7Bred%7D", since) if event[0] == "a"] == [
        ("a", "put", True),
        ("a", "put", True),
        ("a", "put", True),
        ("a", "put", False),
        ("a", "put", True),
        ("a", "delete", False),
    ]

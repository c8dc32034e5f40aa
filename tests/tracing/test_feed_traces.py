"""One write's trace, followed past Jetway: its feed event names it, and a consumer's request continues it.

A real Jetway of two workers sends its spans to a receiver in the test
process (``tests.tracing.collector``); the change feed is read by long poll
as a consumer reads it. The event of a sampled write carries its request's
``traceparent`` (``cache.feed.streams.FeedLog.script_parts``), whichever
way it was written: a PUT, a batch, an import; a write not sampled, and an
expiry, carry none.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
import requests

from tests.support import JetwayServer, wait_every_worker_serving
from tests.tracing.collector import render, tree
from tests.tracing.test_traces import JSON, PARENT_SPAN, PARENT_TRACE, children, server_span, trace_of

NDJSON = {"Content-Type": "application/x-ndjson"}


@pytest.fixture
def two_workers(redis_server, redis_client, collector, tmp_path) -> Iterator[JetwayServer]:
    settings = {
        "JETWAY_TRACING_ENDPOINT": collector.endpoint,
        "JETWAY_TRACING_SAMPLE": "0",  # only what a parent sampled: the unsampled writes below stay so
        "JETWAY_WORKERS": "2",
        "JETWAY_ACCESS_LOG": "on",
        "JETWAY_LOG_FORMAT": "json",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    jetway = JetwayServer(redis_server.url, tmp_path / "jetway.log", env=settings).start()
    try:
        wait_every_worker_serving(jetway, 2)
        yield jetway
    finally:
        jetway.stop()


def sampled(trace_id: str = PARENT_TRACE) -> Dict[str, str]:
    return {"traceparent": f"00-{trace_id}-{PARENT_SPAN}-01"}


def feed_events(server: JetwayServer, collection: str, since: str, count: int) -> List[dict]:
    """The feed's events after ``since``, by long poll, until ``count`` have come."""
    events: List[dict] = []
    deadline = time.monotonic() + 20
    while len(events) < count and time.monotonic() < deadline:
        page = requests.get(
            server.url(f"/v1/_changes/{collection}"), params={"since": since, "wait": "2"}, timeout=10
        ).json()
        events += page["events"]
        since = page["next"]
    return events


def access_lines(server: JetwayServer) -> List[dict]:
    lines = [json.loads(line) for line in Path(server.log_path).read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("namespace") == "jetway.access"]


def test_a_write_is_followed_into_its_feed_event_and_a_consumer_on_the_other_worker(two_workers, collector):
    """The acceptance test of issue #61: one request from an incoming traceparent, through two workers' access
    lines, its Redis spans and its feed event."""
    server = two_workers
    since = requests.get(server.url("/v1/_changes/orders"), timeout=10).json()["next"]
    put = requests.put(server.url("/v1/orders/o1"), data=b'{"n":1}', headers={**JSON, **sampled()}, timeout=10)
    assert put.status_code == 201
    written = trace_of(put)
    assert written["trace_id"] == PARENT_TRACE and written["flags"] == "01"

    [event] = feed_events(server, "orders", since, 1)
    assert event["trace"] == put.headers["traceparent"], event

    # The consumer continues the trace from the event, on new connections until the other worker answers.
    writer = put.headers["X-Request-ID"][:16]  # a worker's request ids share its random prefix
    for _ in range(50):
        read = requests.get(server.url("/v1/orders/o1"), headers={"traceparent": event["trace"]}, timeout=10)
        if read.headers["X-Request-ID"][:16] != writer:
            break
    else:
        pytest.fail("the other worker never answered")
    assert read.status_code == 200 and trace_of(read)["trace_id"] == PARENT_TRACE

    put_span = server_span(collector, PARENT_TRACE, written["span_id"])
    assert put_span.parent_span_id == PARENT_SPAN
    redis_calls = collector.wait_for(lambda: children(collector, put_span))
    assert any(span.name == "EVALSHA put" for span in redis_calls), [span.name for span in redis_calls]
    read_span = server_span(collector, PARENT_TRACE, trace_of(read)["span_id"])
    assert read_span.parent_span_id == put_span.span_id
    print(render(tree(collector.trace(PARENT_TRACE))))

    traced = [line for line in access_lines(server) if line.get("trace_id") == PARENT_TRACE]
    assert {line["request_id"] for line in traced} >= {put.headers["X-Request-ID"], read.headers["X-Request-ID"]}
    assert len({line["request_id"][:16] for line in traced}) == 2  # two workers' lines


def test_a_batch_and_an_import_name_their_request_and_unsampled_writes_name_none(two_workers, collector):
    server = two_workers
    since = requests.get(server.url("/v1/_changes/books"), timeout=10).json()["next"]
    batch_trace, import_trace = "1" * 32, "2" * 32
    operations = [{"op": "put", "collection": "books", "id": f"b{n}", "document": {"n": n}} for n in range(3)]
    batch = requests.post(
        server.url("/v1/_batch"),
        data=json.dumps({"operations": operations}),
        headers={**JSON, **sampled(batch_trace)},
        timeout=10,
    )
    assert batch.status_code == 200, batch.text
    lines = b"\n".join(b'{"id":"i%d","n":%d}' % (n, n) for n in range(3)) + b"\n"
    imported = requests.post(
        server.url("/v1/_import/books"),
        params={"id": "/id"},
        data=lines,
        headers={**NDJSON, **sampled(import_trace)},
        timeout=10,
    )
    assert imported.status_code == 200, imported.text
    quiet = requests.put(
        server.url("/v1/books/q1"), data=b"{}", headers={**JSON, "traceparent": f"00-{'3' * 32}-{PARENT_SPAN}-00"}
    )
    untraced = requests.put(server.url("/v1/books/q2"), data=b"{}", headers=JSON, timeout=10)
    assert (quiet.status_code, untraced.status_code) == (201, 201)

    events = {event["id"]: event for event in feed_events(server, "books", since, 8)}
    assert {events[f"b{n}"]["trace"] for n in range(3)} == {batch.headers["traceparent"]}
    assert {events[f"i{n}"]["trace"] for n in range(3)} == {imported.headers["traceparent"]}
    assert "trace" not in events["q1"] and "trace" not in events["q2"], events
    assert batch.headers["traceparent"].startswith(f"00-{batch_trace}-")

"""Traces as a collector receives them from a real Jetway (``api.tracing``), against a real redis-server.

Each test starts an OTLP/HTTP receiver in the test process
(``tests.tracing.collector``) and a Jetway whose workers send to it.
One worker per server, so its spans leave in the order they ended: a span
known to have arrived shows that those before it have too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import jsonschema
import pytest
import requests

from tests.conftest import flush
from tests.multinode import TOPOLOGY
from tests.support import JetwayServer, free_port, wait_until
from tests.tracing.collector import Collector, Span, render, tree

PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"
QUIET_TRACE = "2" * 32  # a parent that did not sample
JSON = {"Content-Type": "application/json"}


def traced_server(redis_url: str, log: Path, endpoint: str, **env: str) -> JetwayServer:
    settings = {
        "JETWAY_TRACING_ENDPOINT": endpoint,
        "JETWAY_WORKERS": "1",
        "JETWAY_ACCESS_LOG": "on",
        # The SDK's own setting: batches leave every 50 ms rather than every 5 s.
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        **env,
    }
    return JetwayServer(redis_url, log, env=settings).start()


@pytest.fixture(scope="module")
def shared_collector() -> Iterator[Collector]:
    """The receiver of the module's server: its tests tell their spans apart by trace id."""
    with Collector() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def server(redis_server, shared_collector, tmp_path_factory) -> Iterator[JetwayServer]:
    """One traced server for the tests that need no setting of their own (one each cost ~8 s of the suite)."""
    with redis_server.client() as client:
        flush(client)
    log = tmp_path_factory.mktemp("traces") / "jetway.log"
    jetway = traced_server(redis_server.url, log, shared_collector.endpoint)
    try:
        yield jetway
    finally:
        jetway.stop()


def trace_of(response: requests.Response) -> Dict[str, str]:
    version, trace_id, span_id, flags = response.headers["traceparent"].split("-")
    assert version == "00"
    return {"trace_id": trace_id, "span_id": span_id, "flags": flags}


def server_span(collector: Collector, trace_id: str, span_id: Optional[str] = None) -> Span:
    """The request's span of ``trace_id`` (with ``span_id``), once it arrived."""

    def found() -> Optional[Span]:
        spans = [s for s in collector.trace(trace_id) if s.kind == 2 and span_id in (None, s.span_id)]
        return spans[0] if spans else None

    return collector.wait_for(found)


def children(collector: Collector, parent: Span) -> List[Span]:
    return [span for span in collector.trace(parent.trace_id) if span.parent_span_id == parent.span_id]


def test_a_put_is_one_trace_with_its_redis_calls_under_the_incoming_parent(server, shared_collector):
    """The request's span continues the client's trace; each Redis round trip is its child; the response,
    the access line and the span agree on the ids."""
    traceparent = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"
    response = requests.put(
        server.url("/v1/users/u1"), data=b'{"name":"ada"}', headers={**JSON, "traceparent": traceparent}, timeout=10
    )
    assert response.status_code == 201
    given = trace_of(response)
    assert given["trace_id"] == PARENT_TRACE and given["flags"] == "01"
    root = server_span(shared_collector, PARENT_TRACE, given["span_id"])
    assert root.parent_span_id == PARENT_SPAN
    assert root.name == "PUT /v1/{collection}/{id}"
    assert root.attributes["http.route"] == "/v1/{collection}/{id}"
    assert root.attributes["http.request.method"] == "PUT"
    assert root.attributes["http.response.status_code"] == 201
    assert root.attributes["jetway.operation"] == "putDocument"
    assert root.attributes["jetway.collection"] == "users"
    assert root.attributes["jetway.request_id"] == response.headers["X-Request-ID"]
    assert root.service == "jetway"
    redis_calls = shared_collector.wait_for(lambda: children(shared_collector, root))
    assert any(span.name == "EVALSHA put" for span in redis_calls), [s.name for s in redis_calls]
    assert all(span.kind == 3 and span.attributes["db.system.name"] == "redis" for span in redis_calls)
    assert all(root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns for span in redis_calls)
    print(render(tree(shared_collector.trace(PARENT_TRACE))))
    access = [json.loads(line) for line in server.log_path.read_text().splitlines() if '"jetway.access"' in line]
    line = next(line for line in access if line["request_id"] == response.headers["X-Request-ID"])
    assert line["trace_id"] == PARENT_TRACE


def test_a_redis_span_names_the_cluster_nodes_it_went_to(redis_server, server, shared_collector):
    """On a cluster (make test-cluster) a script's span names its node, and a multi-get over every shard's slots
    names each master; one Redis or a Sentinel group names none."""
    put = requests.put(server.url("/v1/users/n1"), data=b"{}", headers=JSON, timeout=10)
    ids = [f"n{number}" for number in range(40)]
    many = requests.post(server.url("/v1/_get/users"), json={"ids": ids}, timeout=10)
    assert (put.status_code, many.status_code) == (201, 200)
    collector = shared_collector
    [script] = [
        s
        for s in collector.wait_for(lambda: children(collector, server_span(collector, trace_of(put)["trace_id"])))
        if s.name == "EVALSHA put"
    ]
    reads = collector.wait_for(lambda: children(collector, server_span(collector, trace_of(many)["trace_id"])))
    if TOPOLOGY != "cluster":
        assert "server.address" not in script.attributes and "jetway.redis.nodes" not in reads[0].attributes
        return
    masters = {f"127.0.0.1:{node.port}" for node in redis_server.nodes}
    assert f"{script.attributes['server.address']}:{script.attributes['server.port']}" in masters
    named = {node for span in reads for node in span.attributes.get("jetway.redis.nodes", [])}
    assert len(named) >= 2 and named <= masters, [span.attributes for span in reads]


@pytest.mark.parametrize("connection", ["keep-alive", "close"], ids=["answered-by-the-connection", "by-cyclone"])
def test_a_read_is_traced_both_ways_it_is_answered(server, shared_collector, connection):
    """The connection's own answers and Cyclone's handlers each make the request's span and its Redis child."""
    requests.put(server.url("/v1/users/u2"), data=b"{}", headers=JSON, timeout=10)
    with requests.Session() as session:
        response = session.get(server.url("/v1/users/u2"), headers={"Connection": connection}, timeout=10)
    assert response.status_code == 200
    given = trace_of(response)
    root = server_span(shared_collector, given["trace_id"], given["span_id"])
    assert root.parent_span_id == ""
    assert root.attributes["jetway.operation"] == "getDocument"
    if connection == "close":  # the hot cache is the connection's: Cyclone's path reads Redis each time
        assert shared_collector.wait_for(lambda: children(shared_collector, root))


@pytest.mark.parametrize("connection", ["keep-alive", "close"], ids=["answered-by-the-connection", "by-cyclone"])
def test_a_problem_carries_its_trace_once_both_ways_it_is_answered(server, connection):
    """A problem's head has one ``traceparent``, and its ``trace_id`` member is that trace's, whoever answers."""
    with requests.Session() as session:
        response = session.get(server.url("/v1/users/none"), headers={"Connection": connection}, timeout=10)
    assert response.status_code == 404
    assert len(response.raw.headers.getlist("traceparent")) == 1
    assert response.json()["trace_id"] == trace_of(response)["trace_id"]


def test_a_token_is_named_never_shown(redis_server, redis_client, collector, tmp_path):
    jetway = JetwayServer(
        redis_server.url,
        tmp_path / "jetway.log",
        auth=True,
        env={"JETWAY_TRACING_ENDPOINT": collector.endpoint, "JETWAY_WORKERS": "1", "OTEL_BSP_SCHEDULE_DELAY": "50"},
    )
    token = jetway.make_token("billing-service", "read:*", "write:*")
    try:
        jetway.start()
        response = requests.put(
            jetway.url("/v1/orders/o1"),
            data=b"{}",
            headers={**JSON, "Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert response.status_code == 201
        root = server_span(collector, trace_of(response)["trace_id"])
        assert root.attributes["jetway.token.name"] == "billing-service"
        assert token not in repr(collector.spans)
    finally:
        jetway.stop()


@pytest.mark.parametrize(
    "traceparent",
    [
        f"ff-{PARENT_TRACE}-{PARENT_SPAN}-01",  # version ff is invalid
        f"00-{'0' * 32}-{PARENT_SPAN}-01",  # all-zero trace id
        f"00-{PARENT_TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"00-{PARENT_TRACE.upper()}-{PARENT_SPAN}-01",  # upper-case hex
        f"00-{PARENT_TRACE}-{PARENT_SPAN}-01-extra",  # version 00 has nothing after its flags
        f"00-{PARENT_TRACE}-{PARENT_SPAN}",  # no flags
    ],
)
def test_an_invalid_traceparent_is_ignored(server, shared_collector, traceparent):
    """W3C Trace Context: a traceparent that does not parse starts a new trace, and its tracestate is dropped."""
    response = requests.get(
        server.url("/v1/users/none"), headers={"traceparent": traceparent, "tracestate": "a=b"}, timeout=10
    )
    assert response.status_code == 404
    given = trace_of(response)
    assert given["trace_id"] not in (PARENT_TRACE, "0" * 32)
    assert server_span(shared_collector, given["trace_id"]).parent_span_id == ""


def test_a_traceparent_that_says_not_sampled_is_followed(server, shared_collector):
    """Sampled flag 00: nothing of that trace is exported, and the response says so; the next request, sampled by
    its parent, arrives (so the first one's spans would have arrived before it)."""
    quiet = requests.put(
        server.url("/v1/users/u3"),
        data=b"{}",
        headers={**JSON, "traceparent": f"00-{QUIET_TRACE}-{PARENT_SPAN}-00"},
        timeout=10,
    )
    assert quiet.status_code == 201
    assert trace_of(quiet) == {"trace_id": QUIET_TRACE, "span_id": trace_of(quiet)["span_id"], "flags": "00"}
    loud_trace = "1" * 32
    loud = requests.put(
        server.url("/v1/users/u4"), data=b"{}", headers={**JSON, "traceparent": f"00-{loud_trace}-{PARENT_SPAN}-01"}
    )
    server_span(shared_collector, loud_trace)
    assert shared_collector.trace(QUIET_TRACE) == []
    assert loud.status_code == 201


def test_a_sample_of_zero_exports_only_what_a_parent_sampled(redis_server, redis_client, collector, tmp_path):
    """JETWAY_TRACING_SAMPLE=0: a request without a parent is not exported, nor its Redis calls; one whose parent
    sampled it still is (parent-based)."""
    jetway = traced_server(redis_server.url, tmp_path / "jetway.log", collector.endpoint, JETWAY_TRACING_SAMPLE="0")
    try:
        for number in range(5):
            assert requests.put(jetway.url(f"/v1/users/q{number}"), data=b"{}", headers=JSON).status_code == 201
        sampled = requests.get(
            jetway.url("/v1/users/q1"), headers={"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"}, timeout=10
        )
        server_span(collector, PARENT_TRACE)
        assert {span.trace_id for span in collector.spans} == {PARENT_TRACE}
        assert sampled.status_code == 200
    finally:
        jetway.stop()


@pytest.mark.slow
def test_a_5xx_is_marked_failed_with_its_redis_error(own_redis, collector, tmp_path):
    """Redis stopped: the 503's span and its Redis call are errors, and the problem names the trace."""
    jetway = traced_server(own_redis.url, tmp_path / "jetway.log", collector.endpoint)
    try:
        assert requests.put(jetway.url("/v1/users/u5"), data=b"{}", headers=JSON).status_code == 201
        spec = requests.get(jetway.url("/openapi.json"), timeout=10).json()  # while Redis answers
        own_redis.stop()
        response = requests.put(jetway.url("/v1/users/u5"), data=b'{"a":1}', headers=JSON, timeout=20)
        assert response.status_code in (503, 504)
        given = trace_of(response)
        assert response.json()["trace_id"] == given["trace_id"]
        # The problem, its trace_id member among them, is what /openapi.json documents.
        problem = {"$ref": "#/components/schemas/Problem", "components": spec["components"]}
        jsonschema.Draft202012Validator(problem).validate(response.json())
        root = server_span(collector, given["trace_id"], given["span_id"])
        assert root.status_code == 2
        assert root.attributes["error.type"] == str(response.status_code)
        failed = collector.wait_for(lambda: [s for s in children(collector, root) if s.status_code == 2])
        assert failed[0].attributes["error.type"] in ("RedisUnavailable", "RedisTimeout")
    finally:
        jetway.stop()


def test_a_collector_that_is_down_costs_only_the_spans(redis_server, redis_client, tmp_path):
    """Nothing listens at the endpoint: requests are answered as ever, and the lost spans are counted."""
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    jetway = traced_server(redis_server.url, tmp_path / "jetway.log", endpoint)
    try:
        for number in range(3):
            assert requests.put(jetway.url(f"/v1/users/d{number}"), data=b"{}", headers=JSON).status_code == 201
            assert requests.get(jetway.url(f"/v1/users/d{number}")).status_code == 200

        def lost() -> int:
            text = requests.get(jetway.url("/metrics"), timeout=10).text
            found = re.search(r'jetway_trace_spans_dropped_total\{reason="export_failed"\} (\S+)', text)
            return int(float(found.group(1))) if found else 0

        wait_until(lambda: lost() > 0, 30, "the lost spans counted")
    finally:
        jetway.stop()

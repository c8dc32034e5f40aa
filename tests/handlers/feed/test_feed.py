"""The change feed's serving side on servers of their own: its cap, its bounds, drains, the log, CORS, off.

``tight`` has a small cap (16 events per collection: one per shard, which
Redis trims by whole listpack nodes of 100), a 64 KiB subscriber buffer, a
5 s send timeout, the access log on and one allowed origin. Authorization
is off where it is not the point (``tests/handlers/test_changes.py`` has it on).
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
import requests

from tests.handlers.test_changes import Writer
from tests.sse_client import SseClient
from tests.support import JetwayServer, wait_until, worker_pids

JSON = {"Content-Type": "application/json"}
ORIGIN = "https://app.example"


class Open:
    """What ``tests.handlers.test_changes`` needs of ``api``, for a server without authorization."""

    def __init__(self, server: JetwayServer) -> None:
        self.server = server
        self.auth_header: Dict[str, str] = {}

    def put_json(self, path: str, body: bytes, **kwargs) -> requests.Response:
        return requests.put(self.server.url(path), data=body, headers=JSON, timeout=10)


@pytest.fixture(scope="module")
def tight(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    env = {
        "JETWAY_FEED_MAX_EVENTS": "16",
        "JETWAY_FEED_BUFFER": "65536",
        "JETWAY_SEND_TIMEOUT": "5",
        "JETWAY_ACCESS_LOG": "on",
        "JETWAY_CORS_ORIGINS": ORIGIN,
    }
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("tight") / "jetway.log", env)
    try:
        yield server.start()
    finally:
        server.stop()


def now(server: JetwayServer, collection: str) -> str:
    return requests.get(server.url(f"/v1/_changes/{collection}"), timeout=10).json()["next"]


def open_stream(server: JetwayServer, collection: str, query: str = "", **headers: str) -> SseClient:
    return SseClient(server.port, f"/v1/_changes/{collection}{query}", dict(headers))


def test_a_position_older_than_the_cap_is_gone_for_a_poll_and_for_a_stream(tight, redis_client):
    old = now(tight, "capped")
    for n in range(350):
        assert requests.put(tight.url("/v1/capped/a"), data=b'{"n":%d}' % n, headers=JSON, timeout=10).ok
    polled = requests.get(tight.url(f"/v1/_changes/capped?since={old}"), timeout=10)
    assert polled.status_code == 410
    assert polled.headers["Content-Type"] == "application/problem+json"
    assert polled.json()["type"] == "urn:jetway:problem:feed-position-lost"
    assert "re-list the collection" in polled.json()["detail"]
    with open_stream(tight, "capped", **{"Last-Event-ID": old}) as client:
        assert client.response.status == 410  # an EventSource stops here instead of looping
    recent = now(tight, "capped")
    requests.put(tight.url("/v1/capped/a"), data=b"{}", headers=JSON, timeout=10)
    assert len(requests.get(tight.url(f"/v1/_changes/capped?since={recent}"), timeout=10).json()["events"]) == 1


def test_a_subscriber_that_does_not_read_falls_behind_and_is_closed_while_others_keep_up(tight, redis_client):
    doc = json.dumps({"pad": "x" * 100_000}).encode()
    stuck = open_stream(tight, "behind", "?include_docs=true")
    got: List = []
    with open_stream(tight, "behind", "?include_docs=true") as reader:
        reader.next_event()
        reading = threading.Thread(target=lambda: got.extend(reader.next_event(timeout=30) for _ in range(120)))
        reading.start()
        for n in range(120):
            assert requests.put(tight.url(f"/v1/behind/d{n % 5}"), data=doc, headers=JSON, timeout=10).ok
        reading.join(60)
    assert len(got) == 120 and all(event.json()["doc"]["pad"] for event in got)
    events = []
    while True:
        event = stuck.next_event(timeout=30)
        if event is None:
            break
        events.append(event)
    stuck.close()
    assert events[0].name == "ready" and events[-1].name == "fell-behind"
    assert 1 < len(events) < 121 and stuck.ended

    def counted() -> bool:
        metrics = requests.get(tight.url("/metrics"), timeout=10).text
        return re.search(r"^jetway_feed_fell_behind_total [1-9]", metrics, re.M) is not None

    # A scrape may land on the other worker, which sees this one's counts once it has flushed them (every second).
    wait_until(counted, 5, "the fell-behind stream counted in /metrics")


def test_the_stream_carries_cors_headers_for_an_allowed_origin(tight):
    with open_stream(tight, "corsfeed", Origin=ORIGIN) as client:
        headers = client.response.headers
        assert headers["access-control-allow-origin"] == ORIGIN
        assert "Origin" in headers["vary"]
    preflight = requests.options(
        tight.url("/v1/_changes/corsfeed"),
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "last-event-id",
        },
        timeout=10,
    )
    assert preflight.status_code == 204 and "Last-Event-ID" in preflight.headers["Access-Control-Allow-Headers"]


def test_the_access_log_counts_a_stream_once_with_its_duration(tight):
    with open_stream(tight, "logged", "?since=") as client:
        request_id = client.response.headers["x-request-id"]
        client.next_event()
        time.sleep(1.0)
    lines: List[dict] = []
    deadline = time.monotonic() + 10
    while not lines and time.monotonic() < deadline:
        time.sleep(0.2)
        lines = [json.loads(line) for line in Path(tight.log_path).read_text().splitlines() if request_id in line]
    assert len(lines) == 1
    assert lines[0]["path"] == "/v1/_changes/logged?since=" and lines[0]["status"] == 200
    assert lines[0]["duration_ms"] >= 900


@pytest.mark.slow  # waits 16 s for the heartbeat
def test_a_quiet_stream_gets_a_heartbeat_comment_every_15_seconds(tight):
    with open_stream(tight, "quiet") as client:
        client.next_event()
        with pytest.raises(TimeoutError):
            client.next_event(timeout=16)
        assert client.comments == 1


def test_draining_ends_each_stream_with_reconnect_at_once(redis_server, tmp_path):
    server = JetwayServer(redis_server.url, tmp_path / "jetway.log", {"JETWAY_GRACE": "20"})
    server.start(["--workers", "1"])
    try:
        with open_stream(server, "draining") as client:
            client.next_event()
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            last = client.next_event(timeout=10)
            assert last.name == "reconnect" and "shutting down" in last.json()["detail"]
            assert client.next_event(timeout=10) is None and client.ended
            assert time.monotonic() - started < 3  # not the 20 s grace
        server.process.wait(20)
    finally:
        server.stop()


def reload(server: JetwayServer, ends: List[str]) -> None:
    """SIGHUP, then wait until every worker is replaced and the stream ended with reconnect once more.

    The master ignores a SIGHUP while it reloads, and a worker took 2 to 10 s to start at a load
    average of 10: a next SIGHUP sent after a fixed time was lost, or came before this one ended the stream.
    """
    before, ended = set(worker_pids(server)), ends.count("reconnect")
    server.process.send_signal(signal.SIGHUP)
    wait_until(lambda: not before & set(worker_pids(server)), 60, "every worker to be replaced")
    wait_until(lambda: ends.count("reconnect") > ended, 30, "the stream to end with reconnect")


@pytest.mark.slow
def test_reloads_under_writes_lose_and_repeat_nothing_for_a_client_that_reconnects(redis_server, tmp_path):
    """SIGHUP twice while writes go on; each reload ends the stream with reconnect, and the client
    resumes with Last-Event-ID after each end, as EventSource does."""
    server = JetwayServer(redis_server.url, tmp_path / "jetway.log")
    server.start(["--workers", "2"])
    api = Open(server)
    events: List[Tuple[str, str]] = []
    ends: List[str] = []
    stop = threading.Event()
    position = now(server, "reload")

    def follow() -> None:
        nonlocal position
        while not stop.is_set():
            try:
                client = open_stream(server, "reload", **{"Last-Event-ID": position})
            except OSError:
                time.sleep(0.1)
                continue
            with client:
                if client.response.status != 200:
                    ends.append(f"status {client.response.status}")
                    time.sleep(0.1)
                    continue
                while not stop.is_set():
                    try:
                        event = client.next_event(timeout=0.5)
                    except TimeoutError:
                        continue
                    except OSError:
                        event = None
                    if event is None or event.name in ("reconnect", "fell-behind", "lost"):
                        ends.append(event.name if event else "closed")
                        break
                    if event.name == "message":
                        events.append((event.json()["id"], event.json()["etag"]))
                        position = event.id

    writer = Writer(api, "reload", [f"d{n}" for n in range(6)], pause=0.01)
    following = threading.Thread(target=follow)
    following.start()
    writer.start()
    try:
        wait_until(lambda: len(worker_pids(server)) == 2, 30, "both workers")
        for _ in range(2):
            time.sleep(1.5)  # writes before each reload, and after the last one below
            reload(server, ends)
        time.sleep(1.5)
    finally:
        writer.stopping.set()
        writer.join(30)
        deadline = time.monotonic() + 30
        while len(events) < writer.total and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        following.join(30)
        server.stop()
    assert not writer.failures, writer.failures[:5]
    seen: Dict[str, List[str]] = {doc: [] for doc in writer.etags}
    for doc, etag in events:
        seen[doc].append(etag)
    assert seen == writer.etags and writer.total > 100
    assert ends.count("reconnect") >= 2, ends


def test_with_the_feed_off_writes_log_nothing_and_the_feed_is_not_there(redis_server, redis_client, tmp_path):
    server = JetwayServer(redis_server.url, tmp_path / "jetway.log", {"JETWAY_FEED": "off"})
    server.start(["--workers", "1"])
    try:
        assert requests.put(server.url("/v1/quiet/a"), data=b"{}", headers=JSON, timeout=10).status_code == 201
        assert not [key for key in redis_client.scan_iter(b"jw:{quiet:*") if key.endswith(b":f")]
        for response in (
            requests.get(server.url("/v1/_changes/quiet"), timeout=10),
            requests.post(server.url("/v1/_changes/quiet/tickets"), timeout=10),
        ):
            assert response.status_code == 404 and response.json()["type"] == "urn:jetway:problem:feed-off"
    finally:
        server.stop()

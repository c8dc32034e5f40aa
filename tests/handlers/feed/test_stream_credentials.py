"""Change-feed streams and long polls end with their credential, on every worker, within a second.

A server of its own (2 workers, authorization on, tickets of 2 s). Streams
are opened on fresh connections until both workers hold some
(``tests.proc_sockets``). The moment of a revocation is when its message
reaches a subscriber of the test's own (a thread timestamping it), which is
how it reaches the workers; the moment of an expiry is the expiry itself.
Each test follows a collection of its own: Redis is flushed between tests,
and a worker's hub of a collection would find its position gone.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Iterator, List, Tuple

import pytest
import redis
import requests

from cache.credentials import tokens
from cache.credentials.tokens import CHANGED_CHANNEL, digest_of, token_key
from tests.proc_sockets import established_by_pid
from tests.sse_client import SseClient
from tests.support import JetwayServer, keys_cli, wait_every_worker_serving, worker_pids

# Within a second of the revocation or the expiry; what reading the events takes on top is in the bound.
WITHIN = 1.0


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    env = {"JETWAY_FEED_TICKET_TTL": "2"}
    jetway = JetwayServer(redis_server.url, tmp_path_factory.mktemp("creds") / "jetway.log", env, auth=True)
    try:
        jetway.start(["--workers", "2"])
        wait_every_worker_serving(jetway, 2)  # its streams must reach both
        yield jetway
    finally:
        jetway.stop()


@pytest.fixture
def fresh(server, redis_client) -> JetwayServer:
    return server


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def open_streams(server: JetwayServer, path: str, headers: dict, least: int = 4) -> List[SseClient]:
    """At least ``least`` streams, each past its ``ready`` event, held by both workers."""
    streams: List[SseClient] = []
    workers = set(worker_pids(server))
    while len(streams) < least or not workers <= set(established_by_pid(server.port)):
        assert len(streams) < 24, "the streams all went to one worker"
        stream = SseClient(server.port, path, dict(headers))
        assert stream.response.status == 200, stream.response
        assert stream.next_event().name == "ready"
        streams.append(stream)
    return streams


def endings(streams: List[SseClient]) -> List[Tuple[float, dict]]:
    """Each stream's last event (``unauthorized``): when it was read, its data; then the stream's end."""
    ended = []
    for stream in streams:
        event = stream.next_event(timeout=5)
        assert event is not None and event.name == "unauthorized", event
        ended.append((time.monotonic(), event.json()))
        assert stream.next_event(timeout=5) is None, "the stream goes on after its last event"
        stream.close()
    return ended


class Heard(threading.Thread):
    """When the revocation's message reached a subscriber (the test's own)."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(daemon=True)
        self.pubsub = client.pubsub()
        self.pubsub.subscribe(CHANGED_CHANNEL)
        self.pubsub.get_message(timeout=5)  # the subscription's confirmation
        self.at = 0.0
        self.start()

    def run(self) -> None:
        message = self.pubsub.get_message(timeout=30)
        if message is not None:
            self.at = time.monotonic()
        self.pubsub.close()


def revoke(redis_server, name: str, client: redis.Redis) -> float:
    heard = Heard(client)
    assert keys_cli(redis_server.url, "revoke", name).returncode == 0
    heard.join(10)
    assert heard.at
    return heard.at


def revoke_at_once(name: str, client: redis.Redis) -> float:
    """The CLI's own revocation script, without the CLI's start-up (a ticket here lives 2 s at most)."""
    heard = Heard(client)
    keys = [tokens.name_key(name), tokens.NAMES_KEY]
    assert client.eval(tokens._REVOKE.source, 2, *keys, name, token_key(b""), CHANGED_CHANNEL) == 1
    heard.join(10)
    assert heard.at
    return heard.at


def test_bearer_streams_on_every_worker_end_within_a_second_of_the_revocation(fresh, redis_server, redis_client):
    token = fresh.make_token("streamer", "read:*", "write:*")
    streams = open_streams(fresh, "/v1/_changes/bearer?include_docs=true", bearer(token))
    headers = {**bearer(token), "Content-Type": "application/json"}
    put = requests.put(fresh.url("/v1/bearer/a"), data=b'{"v":1}', headers=headers, timeout=10)
    assert put.status_code == 201
    assert all(stream.next_event().json()["doc"] == {"v": 1} for stream in streams)
    revoked_at = revoke(redis_server, "streamer", redis_client)
    ended = endings(streams)
    assert max(at for at, _ in ended) - revoked_at < WITHIN
    assert {data["reason"] for _, data in ended} == {"token-revoked"}
    assert ended[0][1]["detail"] == "the token was revoked or rotated"
    again = SseClient(fresh.port, "/v1/_changes/bearer", bearer(token))
    assert again.response.status == 401
    again.close()


def test_a_long_poll_answers_401_within_a_second_of_the_revocation(fresh, redis_server, redis_client):
    token = fresh.make_token("poller", "read:*")
    answers: List[Tuple[float, requests.Response]] = []

    def poll() -> None:
        response = requests.get(fresh.url("/v1/_changes/polled?wait=30"), headers=bearer(token), timeout=40)
        answers.append((time.monotonic(), response))

    polls = [threading.Thread(target=poll) for _ in range(6)]
    for thread in polls:
        thread.start()
    time.sleep(0.5)  # every poll waiting
    revoked_at = revoke(redis_server, "poller", redis_client)
    for thread in polls:
        thread.join(10)
    assert len(answers) == 6
    assert max(at for at, _ in answers) - revoked_at < WITHIN
    for _, response in answers:
        assert response.status_code == 401
        assert response.json()["detail"] == "the token was revoked or rotated"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")


def ticket_for(server: JetwayServer, token: str, collection: str) -> Tuple[str, float]:
    issued = requests.post(server.url(f"/v1/_changes/{collection}/tickets"), headers=bearer(token), timeout=10)
    assert issued.status_code == 201, issued.text
    body = issued.json()
    return body["ticket"], datetime.strptime(body["expires_at"] + "+0000", "%Y-%m-%dT%H:%M:%SZ%z").timestamp()


def test_ticket_streams_end_when_the_ticket_expires_and_not_before(fresh):
    token = fresh.make_token("ticketer", "read:*")
    ticket, expires = ticket_for(fresh, token, "ticketed")
    streams = open_streams(fresh, f"/v1/_changes/ticketed?ticket={ticket}", {})
    ended = endings(streams)
    lateness = [time.time() - (time.monotonic() - at) - expires for at, _ in ended]
    assert min(lateness) >= -0.05, "a ticket's stream ended before the ticket expired"
    assert max(lateness) < WITHIN
    assert ended[0][1] == {
        "reason": "ticket-expired",
        "detail": "the ticket expired: ask for a new one, then reconnect with Last-Event-ID",
    }


def test_ticket_streams_die_with_their_token(fresh, redis_client):
    token = fresh.make_token("ticket-owner", "read:*")
    ticket, _ = ticket_for(fresh, token, "owned")
    streams = open_streams(fresh, f"/v1/_changes/owned?ticket={ticket}", {})
    revoked_at = revoke_at_once("ticket-owner", redis_client)
    ended = endings(streams)
    assert max(at for at, _ in ended) - revoked_at < WITHIN
    assert ended[0][1] == {"reason": "token-revoked", "detail": "the ticket's token was revoked or rotated"}


def test_streams_end_when_their_token_expires(fresh, redis_client):
    token = fresh.make_token("short-lived", "read:*", expires="3")
    expires = int(redis_client.hget(token_key(digest_of(token)), "expires"))
    streams = open_streams(fresh, "/v1/_changes/expiring", bearer(token))
    ended = endings(streams)
    lateness = [time.time() - (time.monotonic() - at) - expires for at, _ in ended]
    assert min(lateness) >= -0.05 and max(lateness) < WITHIN
    assert ended[0][1] == {"reason": "token-expired", "detail": "the token expired"}


def test_a_revocation_whose_message_was_missed_still_ends_the_streams(fresh, redis_client):
    """The subscriptions are cut and the token's record deleted by hand (no message): the streams end all the same."""
    token = fresh.make_token("unheard", "read:*")
    streams = open_streams(fresh, "/v1/_changes/unheard", bearer(token))
    redis_client.client_kill_filter(_type="pubsub")
    redis_client.delete(token_key(digest_of(token)))
    deleted_at = time.monotonic()
    ended = endings(streams)
    assert max(at for at, _ in ended) - deleted_at < WITHIN + 0.5  # the subscription's reconnect: 0.2 s, then a lookup
    assert {data["reason"] for _, data in ended} == {"token-revoked"}

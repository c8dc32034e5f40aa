"""Idempotency-Key on POST and PATCH: a retry gets the first response, and nothing is written twice."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Iterator, Tuple

import pytest
import requests

from cache.credentials.tokens import digest_of
from cache.documents.idempotency import RECORD, fingerprint, record_key
from tests.conftest import document_keys
from tests.multinode import ReplicatedPair
from tests.redis_tap import RedisTap
from tests.support import JetwayServer, make_token

KEY = {"Idempotency-Key": '"8e03978e-40d5-43e8-bc93-6894a57f9324"'}


def token_digest(api) -> bytes:
    return digest_of(api.session.headers["Authorization"].split(" ", 1)[1])


def test_a_retried_post_creates_one_document_and_gets_the_first_answer(api, redis_client):
    first = api.post_json("/v1/orders", b'{"total":12}', headers=KEY)
    assert first.status_code == 201 and "Idempotency-Replayed" not in first.headers
    for _ in range(5):
        again = api.post_json("/v1/orders", b'{"total":12}', headers=KEY)
        assert again.status_code == 201 and again.headers["Idempotency-Replayed"] == "true"
        for name in ("Location", "ETag", "Last-Modified", "Content-Type"):
            assert again.headers[name] == first.headers[name]
        assert again.content == first.content
    assert len(api.get("/v1/orders").json()["items"]) == 1
    assert api.post_json("/v1/orders", b'{"total":12}').headers["Location"] != first.headers["Location"]


def test_the_same_key_for_another_request_is_422(api):
    assert api.post_json("/v1/orders", b'{"total":12}', headers=KEY).status_code == 201
    for method, path, body in (("POST", "/v1/orders", b'{"total":13}'), ("POST", "/v1/others", b'{"total":12}')):
        response = api.send(method, path, body, headers=KEY)
        assert response.status_code == 422
        assert response.json()["type"] == "urn:jetway:problem:idempotency-key-reused"
    assert len(api.get("/v1/orders").json()["items"]) == 1


def test_keys_belong_to_their_token(api, jetway, redis_client):
    other = jetway.make_token("other", "admin")
    assert api.post_json("/v1/orders", b'{"n":1}', headers=KEY).status_code == 201
    theirs = api.post_json("/v1/orders", b'{"n":1}', headers={**KEY, "Authorization": f"Bearer {other}"})
    assert theirs.status_code == 201 and "Idempotency-Replayed" not in theirs.headers
    assert len(api.get("/v1/orders").json()["items"]) == 2


def test_a_retry_while_the_first_runs_is_409_with_retry_after(api, redis_client):
    body = b'{"total":12}'
    mark = fingerprint("POST", "/v1/orders", "application/json", body)
    key = record_key(token_digest(api), KEY["Idempotency-Key"].strip('"'))
    redis_client.hset(key, mapping={"s": "running", "f": mark, "o": "x", "l": str(2**50), "p": b"ID E"})
    response = api.post_json("/v1/orders", body, headers=KEY)
    assert response.status_code == 409 and int(response.headers["Retry-After"]) >= 1
    assert response.json()["type"] == "urn:jetway:problem:idempotency-key-in-use"
    assert api.get("/v1/orders").json()["items"] == []


def test_a_claim_whose_lease_ended_is_carried_out_with_its_own_plan(api, redis_client):
    """What a retry after a killed worker does: the first attempt's id and ETag, written once."""
    body = b'{"total":12}'
    mark = fingerprint("POST", "/v1/orders", "application/json", body)
    key = record_key(token_digest(api), KEY["Idempotency-Key"].strip('"'))
    plan = b'01HZZZZZZZZZZZZZZZZZZZZZZZ "planned1"'
    redis_client.hset(key, mapping={"s": "running", "f": mark, "o": "dead", "l": "1", "p": plan})
    response = api.post_json("/v1/orders", body, headers=KEY)
    assert response.status_code == 201
    assert response.headers["Location"] == "/v1/orders/01HZZZZZZZZZZZZZZZZZZZZZZZ"
    assert response.headers["ETag"] == '"planned1"'
    again = api.post_json("/v1/orders", body, headers=KEY)
    assert again.headers["Idempotency-Replayed"] == "true" and again.headers["ETag"] == '"planned1"'
    assert len(api.get("/v1/orders").json()["items"]) == 1


def test_a_plan_already_written_is_answered_without_writing_again(api, redis_client):
    """The first attempt wrote and died before recording: the retry finds its ETag and writes nothing."""
    body = b'{"total":12}'
    mark = fingerprint("POST", "/v1/orders", "application/json", body)
    key = record_key(token_digest(api), KEY["Idempotency-Key"].strip('"'))
    written = api.put_json("/v1/orders/early", body)
    plan = b"early " + written.headers["ETag"].encode()
    redis_client.hset(key, mapping={"s": "running", "f": mark, "o": "dead", "l": "1", "p": plan})
    response = api.post_json("/v1/orders", body, headers=KEY)
    assert response.status_code == 201 and response.headers["Location"] == "/v1/orders/early"
    assert response.headers["ETag"] == written.headers["ETag"]
    assert response.headers["Last-Modified"] == written.headers["Last-Modified"]


def test_a_retried_patch_is_applied_once(api):
    etag = api.put_json("/v1/docs/d1", b'{"n":1}').headers["ETag"]
    first = api.patch_merge("/v1/docs/d1", b'{"m":2}', headers={**KEY, "If-Match": etag})
    assert first.status_code == 200
    again = api.patch_merge("/v1/docs/d1", b'{"m":2}', headers={**KEY, "If-Match": etag})
    assert again.status_code == 200 and again.headers["Idempotency-Replayed"] == "true"
    assert again.headers["ETag"] == first.headers["ETag"] == api.get("/v1/docs/d1").headers["ETag"]


def test_the_store_s_refusals_are_kept_and_the_request_s_own_are_not(api):
    missing = api.patch_merge("/v1/docs/nope", b'{"m":2}', headers=KEY)
    assert missing.status_code == 404
    api.put_json("/v1/docs/nope", b'{"n":1}')
    replay = api.patch_merge("/v1/docs/nope", b'{"m":2}', headers=KEY)
    assert replay.status_code == 404 and replay.headers["Idempotency-Replayed"] == "true"
    assert replay.json() == missing.json() and replay.headers["Cache-Control"] == "no-store"
    other = {"Idempotency-Key": "a-second-key"}
    assert api.send("POST", "/v1/orders", b"{", headers=other).status_code == 400  # never claimed
    assert api.post_json("/v1/orders", b'{"ok":1}', headers=other).status_code == 201


@pytest.mark.parametrize("value", ['""', "", '" "', '"' + "k" * 256 + '"', '"caf\u00e9"', '"a"b"'])
def test_a_malformed_key_is_400(api, value):
    response = api.post_json("/v1/orders", b"{}", headers={"Idempotency-Key": value.encode("utf-8")})
    assert response.status_code == 400
    assert response.json()["type"] == "urn:jetway:problem:invalid-idempotency-key"


def test_a_bare_key_and_its_quoted_form_are_the_same_key(api):
    assert api.post_json("/v1/orders", b"{}", headers={"Idempotency-Key": "k1"}).status_code == 201
    replay = api.post_json("/v1/orders", b"{}", headers={"Idempotency-Key": '"k1"'})
    assert replay.headers["Idempotency-Replayed"] == "true"


def test_records_expire_after_a_day(api, redis_client):
    api.post_json("/v1/orders", b"{}", headers=KEY)
    (key,) = [key for key in document_keys(redis_client) if key.startswith(b"jw:idem:")]
    assert 86000 < redis_client.ttl(key) <= 86400
    assert json.loads(redis_client.hget(key, "rh"))


@pytest.fixture
def tapped(own_redis, tmp_path):
    """A 1-worker Jetway whose Redis traffic passes a tap, with a 4 s lease; and a token."""
    tap = RedisTap(own_redis.socket_path).start()
    server = JetwayServer(
        tap.url, tmp_path / "jetway.log", env={"JETWAY_IDEMPOTENCY_LEASE": "4", "JETWAY_REDIS_POOL": "1"}, auth=True
    )
    try:
        server.start(["--workers", "1"])
        yield server, tap, make_token(own_redis.url, "killer", "admin"), own_redis.client()
    finally:
        server.stop()
        tap.stop()


def test_a_post_retried_100_times_after_its_worker_was_killed_mid_request_creates_one_document(tapped):
    """The worker is stopped right after its write and before it records the answer, then SIGKILLed."""
    server, tap, token, client = tapped
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", **KEY}
    url = server.url("/v1/orders")
    tap.freeze_at(RECORD.sha)
    outcome: list = []

    def first_attempt() -> None:
        try:
            outcome.append(requests.post(url, data=b'{"total":12}', headers=headers, timeout=30).status_code)
        except requests.RequestException as error:
            outcome.append(type(error).__name__)

    attempt = threading.Thread(target=first_attempt)
    attempt.start()
    assert tap.frozen.wait(20), "the worker never recorded a response"
    (worker,) = children(server.process.pid)
    os.kill(worker, signal.SIGKILL)
    attempt.join(30)
    assert outcome and outcome[0] not in (200, 201), outcome  # the client never got an answer
    assert len(order_keys(client)) == 1  # the first attempt did write

    statuses, locations = [], set()
    for _ in range(100):
        try:
            response = requests.post(url, data=b'{"total":12}', headers=headers, timeout=10)
        except requests.ConnectionError:
            statuses.append("refused")  # the master is starting the new worker
            time.sleep(0.05)
            continue
        statuses.append(response.status_code)
        if response.status_code == 201:
            locations.add(response.headers["Location"])
        else:
            time.sleep(0.1)  # 409 while the dead attempt's lease lasts
    counts = {status: statuses.count(status) for status in set(statuses)}
    print(f"first attempt: {outcome[0]}; 100 retries: {counts}; documents: {len(order_keys(client))}")
    assert set(statuses) <= {"refused", 409, 201}, statuses
    assert statuses[-1] == 201 and len(locations) == 1, statuses
    assert len(order_keys(client)) == 1
    (key,) = order_keys(client)
    assert key.endswith(next(iter(locations)).rsplit("/", 1)[1].encode())


def children(pid: int) -> list:
    for _ in range(100):
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if found:
            return [int(child) for child in found]
        time.sleep(0.1)
    raise AssertionError(f"master {pid} has no worker")


def order_keys(client) -> list:
    return [key for key in client.scan_iter(match=b"jw:{orders:*}:d:*")]


# -- a failure that is not recorded: the retry runs at once, with the same plan --


@pytest.fixture
def waits_for_a_replica(tmp_path) -> Iterator[Tuple[ReplicatedPair, JetwayServer]]:
    pair = ReplicatedPair(tmp_path / "pair")
    env = {"JETWAY_WRITE_REPLICAS": "1", "JETWAY_WRITE_TIMEOUT": "0.3"}
    server = JetwayServer(pair.url, tmp_path / "jetway.log", env=env)
    try:
        pair.start()
        yield pair, server.start(["--workers", "1"])
    finally:
        server.stop()
        pair.stop()


def test_a_retry_after_a_5xx_runs_at_once_and_writes_what_the_first_planned(waits_for_a_replica):
    pair, server = waits_for_a_replica
    url, headers = server.url("/v1/orders"), {"Content-Type": "application/json", **KEY}
    pair.replica.process.send_signal(signal.SIGSTOP)
    try:
        first = requests.post(url, data=b'{"total":12}', headers=headers, timeout=10)
    finally:
        pair.replica.process.send_signal(signal.SIGCONT)
    # Applied on the primary, not confirmed: not recorded, and the claim's lease ended.
    assert first.status_code == 503 and first.json()["type"] == "urn:jetway:problem:not-replicated"
    retry = requests.post(url, data=b'{"total":12}', headers=headers, timeout=10)
    assert retry.status_code == 201, retry.text
    assert "Idempotency-Replayed" not in retry.headers
    assert retry.headers["ETag"] == first.headers["ETag"]
    assert retry.headers["Location"] == first.headers["Location"]
    assert len(requests.get(url, timeout=10).json()["items"]) == 1
    again = requests.post(url, data=b'{"total":12}', headers=headers, timeout=10)
    assert again.headers["Idempotency-Replayed"] == "true" and again.content == retry.content

"""Authorization through real HTTP: tokens, scopes, rates, the admin CLI."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator, List

import pytest
import requests

from tests.support import JetwayServer, keys_cli, make_token

TOKEN_PATTERN = re.compile(r"jw_[A-Za-z0-9_-]{43}")


def bearer(token: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def get(server: JetwayServer, path: str, token: str = "", **headers: str) -> requests.Response:
    """A GET on a fresh connection (so requests spread over the workers)."""
    return requests.get(server.url(path), headers={**(bearer(token) if token else {}), **headers}, timeout=10)


def put(server: JetwayServer, path: str, token: str) -> requests.Response:
    headers = {"Content-Type": "application/json", **bearer(token)}
    return requests.put(server.url(path), data=b'{"a":1}', headers=headers, timeout=10)


@pytest.fixture
def server(jetway, redis_client, redis_server) -> JetwayServer:
    """The session's server (2 workers, auth on) on a flushed Redis without tokens."""
    return jetway


def assert_problem(response: requests.Response, status: int, problem: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    assert response.json()["type"] == f"urn:jetway:problem:{problem}"


@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Basic dXNlcjpwYXNz", "Bearer a b", "bearer"], ids=repr)
def test_missing_or_malformed_authorization_is_401_with_a_challenge(server, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    response = get(server, "/v1/users/u1", **headers)
    assert_problem(response, 401, "unauthorized")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_unknown_revoked_and_expired_tokens_get_the_same_answer(server, redis_server):
    revoked = server.make_token("revoked", "admin")
    assert keys_cli(redis_server.url, "revoke", "revoked").returncode == 0
    expired = server.make_token("expired", "admin", expires="1")
    time.sleep(1.1)
    answers = [get(server, "/v1/users/u1", token) for token in ("jw_" + "A" * 43, revoked, expired)]
    for response in answers:
        assert_problem(response, 401, "unauthorized")
    assert len({response.content for response in answers}) == 1, "the answer must not say whether a token exists"


def test_an_expiring_token_works_until_it_expires(server):
    token = server.make_token("short", "read:*", expires="2")
    assert get(server, "/v1/users/u1", token).status_code == 404
    time.sleep(2.2)
    assert get(server, "/v1/users/u1", token).status_code == 401


def test_scopes(server):
    admin = server.make_token("admin", "admin")
    reader = server.make_token("reader", "read:*")
    orders = server.make_token("orders", "read:orders", "write:orders")
    assert put(server, "/v1/orders/o1", orders).status_code == 201
    assert put(server, "/v1/users/u1", admin).status_code == 201
    assert get(server, "/v1/users/u1", reader).status_code == 200
    assert_problem(put(server, "/v1/users/u2", reader), 403, "forbidden")
    assert_problem(get(server, "/v1/users/u1", orders), 403, "forbidden")
    assert_problem(put(server, "/v1/users/u3", orders), 403, "forbidden")
    assert get(server, "/v1/orders?limit=5", orders).status_code == 200
    delete = requests.delete(server.url("/v1/orders/o1"), headers=bearer(reader), timeout=10)
    assert_problem(delete, 403, "forbidden")


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/openapi.json"])
def test_operational_routes_need_no_token(server, path):
    assert get(server, path).status_code == 200


def test_a_revoked_token_is_refused_by_every_worker_within_a_second(server, redis_server):
    token = server.make_token("soon-revoked", "read:*")
    # Warm both workers' caches: fresh connections spread over them.
    assert all(get(server, "/v1/users/x", token).status_code == 404 for _ in range(20))
    assert keys_cli(redis_server.url, "revoke", "soon-revoked").returncode == 0
    revoked_at = time.monotonic()
    time.sleep(0.2)
    statuses = [get(server, "/v1/users/x", token).status_code for _ in range(20)]
    assert statuses == [401] * 20
    assert time.monotonic() - revoked_at < 1.0 + 0.5  # the check itself takes a moment


def test_a_rotated_token_stops_working_and_its_successor_works(server, redis_server):
    old = server.make_token("rotating", "read:*")
    assert get(server, "/v1/users/x", old).status_code == 404
    result = keys_cli(redis_server.url, "rotate", "rotating")
    assert result.returncode == 0, result.stderr
    new = result.stdout.strip().splitlines()[-1]
    time.sleep(0.2)
    assert get(server, "/v1/users/x", old).status_code == 401
    assert get(server, "/v1/users/x", new).status_code == 404


def _hammer(server: JetwayServer, token: str, count: int, threads: int = 8) -> List[requests.Response]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: get(server, "/v1/users/x", token), range(count)))


def test_rate_limits_are_per_token(server):
    slow = server.make_token("slow", "read:*", rate="5/s")
    fast = server.make_token("fast", "read:*", rate="1000/s")
    slow_statuses = [response.status_code for response in _hammer(server, slow, 30)]
    fast_statuses = [response.status_code for response in _hammer(server, fast, 30)]
    assert fast_statuses == [404] * 30
    assert 5 <= slow_statuses.count(404) <= 15
    assert slow_statuses.count(429) >= 15


def test_a_limit_is_shared_by_both_workers(server):
    """Over a window, accepted requests stay within burst + rate x window, across workers."""
    token = server.make_token("shared", "read:*", rate="10/s")
    started = time.monotonic()
    responses = _hammer(server, token, 120, threads=12)
    elapsed = time.monotonic() - started
    accepted = sum(response.status_code == 404 for response in responses)
    assert accepted <= 10 + 10 * elapsed + 1, f"{accepted} accepted in {elapsed:.2f}s"
    assert accepted >= 10


def test_rate_headers_on_every_response_and_retry_after_on_429(server):
    token = server.make_token("headers", "read:*", "write:*", rate="3/m")
    responses = [
        put(server, "/v1/users/h1", token),
        get(server, "/v1/users/h1", token),
        get(server, "/v1/users/zz", token),
    ]
    assert [response.status_code for response in responses] == [201, 200, 404]
    assert [response.headers["RateLimit-Remaining"] for response in responses] == ["2", "1", "0"]
    assert all(response.headers["RateLimit-Limit"] == "3" for response in responses)
    limited = get(server, "/v1/users/h1", token)
    assert_problem(limited, 429, "rate-limited")
    assert 1 <= int(limited.headers["Retry-After"]) <= 20
    assert limited.headers["RateLimit-Remaining"] == "0"
    assert int(limited.headers["RateLimit-Reset"]) > 0


@pytest.mark.slow
def test_the_cli_end_to_end(redis_server, redis_client):
    url = redis_server.url
    token = make_token(url, "ci", "read:*", "write:orders", rate="100/s", expires="30d")
    assert TOKEN_PATTERN.fullmatch(token)
    listing = keys_cli(url, "list")
    assert listing.returncode == 0
    assert re.search(r"^ci\s+read:\* write:orders\s+100/s\s+\d{4}-", listing.stdout, re.MULTILINE), listing.stdout
    assert token not in listing.stdout + listing.stderr
    assert not TOKEN_PATTERN.search(listing.stdout)
    duplicate = keys_cli(url, "create", "--name", "ci", "--scope", "admin")
    assert duplicate.returncode == 1 and "exists" in duplicate.stderr
    assert keys_cli(url, "create", "--name", "x", "--scope", "root").returncode == 1
    assert keys_cli(url, "create", "--name", "x", "--scope", "admin", "--rate", "fast").returncode == 1
    assert keys_cli(url, "create", "--name", "x", "--scope", "admin", "--expires", "soon").returncode == 2
    assert keys_cli(url, "revoke", "ci").returncode == 0
    assert keys_cli(url, "revoke", "ci").returncode == 1
    assert "ci " not in keys_cli(url, "list").stdout
    # Redis keeps only the digest.
    assert not any(
        token.encode() in key or token.encode() in (redis_client.dump(key) or b"") for key in redis_client.scan_iter()
    )


@pytest.fixture
def logged_server(redis_server, redis_client, tmp_path) -> Iterator[JetwayServer]:
    server = JetwayServer(redis_server.url, tmp_path / "logged.log", env={"JETWAY_ACCESS_LOG": "on"}, auth=True)
    try:
        yield server.start(["--workers", "1"])
    finally:
        server.stop()


def test_tokens_never_appear_in_logs(logged_server, redis_server):
    token = logged_server.make_token("logged", "read:*", rate="2/s")
    for _ in range(5):
        get(logged_server, "/v1/users/x", token)
    get(logged_server, "/v1/users/x", "jw_" + "B" * 43)
    get(logged_server, f"/v1/users/x?token={token}", token)  # even in a query string it was sent in
    time.sleep(0.3)
    text = logged_server.log_path.read_text()
    assert "GET /v1/users/x" in text
    leaked = TOKEN_PATTERN.findall(text)
    assert not leaked, leaked


def test_with_auth_off_everyone_may(redis_server, redis_client, tmp_path):
    server = JetwayServer(redis_server.url, tmp_path / "open.log")  # JETWAY_AUTH=off
    try:
        server.start(["--workers", "1"])
        assert put(server, "/v1/users/u1", "").status_code == 201
    finally:
        server.stop()


def test_concurrent_cache_fill_is_safe(server):
    token = server.make_token("busy", "read:*")
    errors: List[int] = []

    def hit() -> None:
        status = get(server, "/v1/users/x", token).status_code
        if status != 404:
            errors.append(status)

    threads = [threading.Thread(target=hit) for _ in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

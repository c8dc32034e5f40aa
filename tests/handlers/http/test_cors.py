"""handlers.http.cors: browser origins allowed by the operator get CORS headers on every response."""

from typing import Iterator

import pytest
import requests

from api.config import ConfigError, from_environment
from handlers.http.cors import CorsPolicy
from tests.support import JetwayServer

ALLOWED = "http://app.example:3000"
OTHER = "http://evil.example"


@pytest.fixture(scope="module")
def cors_server(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    env = {"JETWAY_CORS_ORIGINS": f"{ALLOWED}, https://second.example"}
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("cors") / "jetway.log", env=env, auth=True)
    try:
        yield server.start(["--workers", "1"])
    finally:
        server.stop()


@pytest.fixture
def page_session(cors_server, redis_client):
    """A session that sends what a page on ``ALLOWED`` would, with a token of its own."""
    token = cors_server.make_token("page", "read:*", "write:things")
    with requests.Session() as session:
        session.headers.update({"Origin": ALLOWED, "Authorization": f"Bearer {token}"})
        yield cors_server, session


def cors_of(response) -> dict:
    return {name: value for name, value in response.headers.items() if name.lower().startswith("access-control-")}


def test_a_preflight_is_answered_without_a_token(cors_server):
    response = requests.options(
        cors_server.url("/v1/things/t1"),
        headers={
            "Origin": ALLOWED,
            "Access-Control-Request-Method": "PUT",
            "Access-Control-Request-Headers": "authorization, content-type, if-match",
        },
        timeout=10,
    )
    assert response.status_code == 204
    headers = cors_of(response)
    assert headers["Access-Control-Allow-Origin"] == ALLOWED
    assert {"PUT", "PATCH", "DELETE", "GET"} <= {m.strip() for m in headers["Access-Control-Allow-Methods"].split(",")}
    allowed = {h.strip().lower() for h in headers["Access-Control-Allow-Headers"].split(",")}
    assert {"authorization", "content-type", "if-match", "if-none-match", "idempotency-key"} <= allowed
    assert int(headers["Access-Control-Max-Age"]) > 0
    assert "Origin" in response.headers["Vary"]


def test_a_preflight_from_another_origin_gets_no_permission(cors_server):
    response = requests.options(
        cors_server.url("/v1/things/t1"),
        headers={"Origin": OTHER, "Access-Control-Request-Method": "GET"},
        timeout=10,
    )
    assert response.status_code == 204 and cors_of(response) == {}
    assert response.headers["Vary"] == "Origin"


def test_a_preflight_to_an_unknown_path_is_granted_so_the_page_reads_the_404(cors_server):
    preflight = requests.options(
        cors_server.url("/v2/nothing"),
        headers={"Origin": ALLOWED, "Access-Control-Request-Method": "GET"},
        timeout=10,
    )
    assert preflight.status_code == 204
    assert cors_of(preflight)["Access-Control-Allow-Origin"] == ALLOWED
    assert "GET" in cors_of(preflight)["Access-Control-Allow-Methods"].split(", ")
    response = requests.get(cors_server.url("/v2/nothing"), headers={"Origin": ALLOWED}, timeout=10)
    assert (response.status_code, response.json()["type"]) == (404, "urn:jetway:problem:no-route")
    assert cors_of(response)["Access-Control-Allow-Origin"] == ALLOWED
    # A plain OPTIONS there is still a 404, and another origin's preflight gets no permission.
    assert requests.options(cors_server.url("/v2/nothing"), timeout=10).status_code == 404
    refused = requests.options(
        cors_server.url("/v2/nothing"), headers={"Origin": OTHER, "Access-Control-Request-Method": "GET"}, timeout=10
    )
    assert cors_of(refused) == {}


def test_every_response_to_an_allowed_origin_carries_cors_headers(page_session):
    server, session = page_session
    written = session.put(server.url("/v1/things/t1"), data=b'{"a":1}', headers={"Content-Type": "application/json"})
    read = session.get(server.url("/v1/things/t1"))
    revalidated = session.get(server.url("/v1/things/t1"), headers={"If-None-Match": read.headers["ETag"]})
    missing = session.get(server.url("/v1/things/nope"))
    forbidden = session.put(server.url("/v1/other/x"), data=b"{}", headers={"Content-Type": "application/json"})
    unauthorized = session.get(server.url("/v1/things/t1"), headers={"Authorization": "Bearer jw_nope"})
    too_large = session.put(
        server.url("/v1/things/t2"),
        data=b"{" + b" " * (2 * 1024 * 1024) + b"}",
        headers={"Content-Type": "application/json"},
    )
    responses = [written, read, revalidated, missing, forbidden, unauthorized, too_large]
    assert [r.status_code for r in responses] == [201, 200, 304, 404, 403, 401, 413]
    for response in responses:
        headers = cors_of(response)
        assert headers["Access-Control-Allow-Origin"] == ALLOWED, response.status_code
        exposed = {h.strip() for h in headers["Access-Control-Expose-Headers"].split(",")}
        assert {"ETag", "Location", "Retry-After", "RateLimit-Remaining", "X-Request-ID"} <= exposed
        assert "Origin" in response.headers["Vary"]


def test_a_rate_limited_answer_is_readable_by_the_page(cors_server, redis_client):
    token = cors_server.make_token("slow", "read:*", rate="1/m")
    headers = {"Origin": ALLOWED, "Authorization": f"Bearer {token}"}
    statuses = [requests.get(cors_server.url("/v1/things/x"), headers=headers, timeout=10) for _ in range(3)]
    limited = statuses[-1]
    assert limited.status_code == 429
    assert cors_of(limited)["Access-Control-Allow-Origin"] == ALLOWED
    assert limited.headers["Retry-After"] and limited.headers["RateLimit-Remaining"] == "0"


def test_other_origins_and_requests_without_origin_get_none(cors_server):
    assert cors_of(requests.get(cors_server.url("/healthz"), headers={"Origin": OTHER}, timeout=10)) == {}
    plain = requests.get(cors_server.url("/healthz"), timeout=10)
    assert cors_of(plain) == {} and plain.headers["Vary"] == "Origin"


def test_a_server_without_origins_sends_no_cors_headers(api):
    response = api.get("/v1/things/x", headers={"Origin": ALLOWED})
    assert cors_of(response) == {} and "Vary" not in response.headers
    assert api.request("OPTIONS", "/v1/things/x", headers={"Origin": ALLOWED}).status_code == 204


def test_options_says_what_the_path_allows(api):
    response = api.request("OPTIONS", "/v1/things")
    assert response.status_code == 204
    assert {m.strip() for m in response.headers["Allow"].split(",")} == {"GET", "HEAD", "POST", "OPTIONS"}


@pytest.mark.parametrize("value", ["app.example", "http://app.example/", "http://app.example/path", "ftp://x"])
def test_an_origin_that_is_not_one_names_the_variable(value):
    with pytest.raises(ConfigError, match="JETWAY_CORS_ORIGINS"):
        from_environment({"JETWAY_CORS_ORIGINS": value})


def test_origins_are_read_as_browsers_send_them():
    settings = from_environment({"JETWAY_CORS_ORIGINS": "HTTP://App.Example:3000, https://[::1]:8443,*"})
    assert settings.cors_origins == ("http://app.example:3000", "https://[::1]:8443", "*")


def test_any_origin_is_answered_with_a_star_and_one_set_of_headers():
    policy = CorsPolicy(("*",))
    first = policy.response_headers("http://a.example")
    assert ("Access-Control-Allow-Origin", "*") in first and all(name != "Vary" for name, _ in first)
    for n in range(100):
        policy.response_headers(f"http://{n}.example")
    assert len(policy._made) == 1


def test_response_lines_are_the_headers_as_head_lines_made_once_per_allowed_origin():
    policy = CorsPolicy((ALLOWED,))
    lines = policy.response_lines(ALLOWED)
    assert lines == b"".join(b"%s: %s\r\n" % (n.encode(), v.encode()) for n, v in policy.response_headers(ALLOWED))
    assert lines.startswith(b"Access-Control-Allow-Origin: " + ALLOWED.encode() + b"\r\n")
    assert policy.response_lines(ALLOWED) is lines
    assert policy.response_lines(None) == policy.response_lines(OTHER) == b"Vary: Origin\r\n"
    for n in range(100):
        policy.response_lines(f"http://{n}.example")
    assert len(policy._lines) == 2
    anyone = CorsPolicy(("*",))
    assert anyone.response_lines(None) == b""
    assert anyone.response_lines(OTHER).startswith(b"Access-Control-Allow-Origin: *\r\n")
    for n in range(100):
        anyone.response_lines(f"http://{n}.example")
    assert len(anyone._lines) == 2
    assert CorsPolicy(()).response_lines(ALLOWED) == b""

"""Collection settings through real HTTP and the CLI, on a real redis-server.

The admin API (ETags, If-Match, the admin scope), every write checked
before it is stored (PUT, POST, the merged result of PATCH), the default
TTL, the size limit, a collection's own write concern, the OpenAPI
document following the settings, and a change reaching both workers of
the session's 2-worker server within a second.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import requests

from cache.collection_settings import CHANGED_CHANNEL, NAMES_KEY, settings_key
from cache.keys import document_key
from tests.conftest import document_keys
from tests.support import ROOT

PROBLEM = "urn:jetway:problem:"
USERS_SCHEMA = {
    "type": "object",
    "required": ["email", "name"],
    "properties": {
        "email": {"type": "string", "format": "email"},
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0},
    },
}


def settings(api, collection: str, values: dict, **headers: str) -> requests.Response:
    return api.put_json(f"/v1/_collections/{collection}", json.dumps(values).encode(), headers=headers)


def problem(response: requests.Response, status: int, slug: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == PROBLEM + slug, body
    return body


# -- the admin API ----------------------------------------------------------------


def test_settings_are_stored_answered_and_removed_with_etags(api, redis_client):
    created = settings(api, "users", {"schema": USERS_SCHEMA, "ttl": 60})
    assert created.status_code == 201, created.text
    etag = created.headers["ETag"]
    got = api.get("/v1/_collections/users")
    assert got.status_code == 200 and got.headers["ETag"] == etag
    assert got.json() == {"schema": USERS_SCHEMA, "ttl": 60}
    assert got.content == redis_client.hget(settings_key(b"users"), "s"), "answered as stored"
    assert api.get("/v1/_collections/users", headers={"If-None-Match": etag}).status_code == 304

    problem(settings(api, "users", {"ttl": 5}, **{"If-None-Match": "*"}), 412, "precondition-failed")
    problem(settings(api, "users", {"ttl": 5}, **{"If-Match": '"stale"'}), 412, "precondition-failed")
    replaced = settings(api, "users", {"ttl": 5}, **{"If-Match": etag})
    assert replaced.status_code == 200 and replaced.headers["ETag"] != etag

    assert settings(api, "orders", {"max_bytes": 100}).status_code == 201
    listed = api.get("/v1/_collections").json()["items"]
    assert [(item["collection"], item["settings"]) for item in listed] == [
        ("orders", {"max_bytes": 100}),
        ("users", {"ttl": 5}),
    ]

    problem(api.delete("/v1/_collections/users", headers={"If-Match": etag}), 412, "precondition-failed")
    assert api.delete("/v1/_collections/users").status_code == 204
    problem(api.get("/v1/_collections/users"), 404, "not-found")
    problem(api.delete("/v1/_collections/users"), 404, "not-found")


def test_settings_need_the_admin_scope(api, jetway):
    writer = jetway.make_token("writer-everything", "read:*", "write:*")
    headers = {"Authorization": f"Bearer {writer}", "Content-Type": "application/json"}
    put = requests.put(jetway.url("/v1/_collections/users"), data=b"{}", headers=headers, timeout=10)
    problem(put, 403, "forbidden")
    problem(requests.get(jetway.url("/v1/_collections"), headers=headers, timeout=10), 403, "forbidden")
    problem(requests.get(jetway.url("/v1/_collections")), 401, "unauthorized")


def test_an_invalid_schema_is_refused_saying_why(api, redis_client):
    body = problem(settings(api, "users", {"schema": {"type": "strnig"}}), 422, "invalid-schema")
    assert "/type" in body["detail"] and "strnig" in body["detail"]
    problem(settings(api, "users", {"schema": {"pattern": "\\p{L}"}}), 422, "invalid-schema")
    # A malformed escape is refused (the u flag's grammar), never read as another pattern: Annex B's \x+1 is x+1.
    body = problem(settings(api, "users", {"schema": {"pattern": "^\\x+1$"}}), 422, "invalid-schema")
    assert "malformed \\x escape" in body["detail"]
    problem(settings(api, "users", {"ttl": 0}), 422, "invalid-settings")
    problem(settings(api, "users", {"max_bytes": "big"}), 422, "invalid-settings")
    body = problem(settings(api, "users", {"tll": 5}), 422, "invalid-settings")
    assert "'tll'" in body["detail"]
    assert redis_client.exists(settings_key(b"users")) == 0


# -- writes obey the settings -------------------------------------------------------


def test_a_collection_without_settings_takes_any_object(api):
    assert settings(api, "users", {"schema": USERS_SCHEMA}).status_code == 201
    assert api.put_json("/v1/other/x", b'{"anything":[1,2]}').status_code == 201


def test_put_post_and_patch_are_checked_before_anything_is_stored(api, redis_client):
    assert settings(api, "users", {"schema": USERS_SCHEMA}).status_code == 201
    bad = problem(api.put_json("/v1/users/u1", b'{"email":"nope","age":-3}'), 422, "schema-violation")
    found = {(error["pointer"], error["keyword"]) for error in bad["errors"]}
    assert found == {("/email", "format"), ("/age", "minimum"), ("", "required")}
    assert all(error["message"] for error in bad["errors"])
    problem(api.post_json("/v1/users", b'{"email":"a@example.com"}'), 422, "schema-violation")
    assert [key for key in document_keys(redis_client) if b"{collections}" not in key] == [], "nothing stored"

    stored = b'{"email":"a@example.com","name":"Ada"}'
    assert api.put_json("/v1/users/u1", stored).status_code == 201
    assert api.post_json("/v1/users", stored).status_code == 201
    patched = api.patch_merge("/v1/users/u1", b'{"name":null}')
    assert problem(patched, 422, "schema-violation")["errors"][0]["keyword"] == "required"
    assert api.get("/v1/users/u1").content == stored, "the refused patch changed nothing"
    assert api.patch_merge("/v1/users/u1", b'{"age":36}').json()["age"] == 36


def settled(send, status: int, within: float = 3.0) -> requests.Response:
    """``send()`` again until it answers ``status`` (a change reaches each worker within a second)."""
    deadline = time.monotonic() + within
    response = send()
    while response.status_code != status and time.monotonic() < deadline:
        time.sleep(0.05)
        response = send()
    return response


def test_a_schema_change_applies_to_the_writes_after_it(api):
    assert api.put_json("/v1/users/u1", b'{"free":true}').status_code == 201
    assert settings(api, "users", {"schema": USERS_SCHEMA}).status_code == 201
    problem(settled(lambda: api.put_json("/v1/users/u1", b'{"free":true}'), 422), 422, "schema-violation")
    assert api.delete("/v1/_collections/users").status_code == 204
    assert settled(lambda: api.put_json("/v1/users/u1", b'{"free":true}'), 200).status_code == 200


def test_the_default_ttl_applies_when_a_write_gives_none(api, redis_client):
    assert settings(api, "sessions", {"ttl": 600}).status_code == 201
    assert api.put_json("/v1/sessions/s1", b"{}").status_code == 201
    assert 590 < redis_client.ttl(document_key(b"sessions", b"s1")) <= 600
    assert api.put_json("/v1/sessions/s2?ttl=30", b"{}").status_code == 201
    assert 20 < redis_client.ttl(document_key(b"sessions", b"s2")) <= 30
    location = api.post_json("/v1/sessions", b"{}").headers["Location"]
    new_id = location.rsplit("/", 1)[1].encode()
    assert 590 < redis_client.ttl(document_key(b"sessions", new_id)) <= 600
    assert api.put_json("/v1/other/o1", b"{}").status_code == 201
    assert redis_client.ttl(document_key(b"other", b"o1")) == -1


def test_max_bytes_is_a_413_that_says_so(api):
    assert settings(api, "small", {"max_bytes": 20}).status_code == 201
    assert api.put_json("/v1/small/a", b'{"n":"0123456789"}').status_code == 201
    body = problem(api.put_json("/v1/small/a", b'{"n":"0123456789abc"}'), 413, "body-too-large")
    assert "21 bytes" in body["detail"] and "small" in body["detail"] and "20" in body["detail"]
    problem(api.patch_merge("/v1/small/a", b'{"m":1}'), 413, "body-too-large")
    problem(api.post_json("/v1/small", b'{"n":"0123456789abc"}'), 413, "body-too-large")


def test_a_collections_write_replicas_waits_for_replicas_it_does_not_have(api):
    """The suite's Redis has no replica: write_replicas=1 answers not-replicated, other collections do not wait."""
    assert settings(api, "careful", {"write_replicas": 1}).status_code == 201
    started = time.monotonic()
    body = problem(api.put_json("/v1/careful/c1", b"{}"), 503, "not-replicated")
    assert time.monotonic() - started < 5
    assert "0 of 1 replicas" in body["detail"]
    assert api.put_json("/v1/careless/c1", b"{}").status_code == 201
    assert settings(api, "careful", {"write_replicas": 0}).status_code == 200
    # A fresh id each try: a try the old setting answered 503 has written its document all the same.
    ids = itertools.count(2)
    again = settled(lambda: api.put_json(f"/v1/careful/c{next(ids)}", b"{}"), 201)
    assert again.status_code == 201, again.text


def test_the_cache_policy_is_checked_as_the_variable_is_and_stored_normalized(api):
    assert settings(api, "pages", {"cache_control": "Public,  MAX-AGE=60"}).status_code == 201
    assert api.get("/v1/_collections/pages").json() == {"cache_control": "public, max-age=60"}
    problem(settings(api, "pages", {"cache_control": "a\nb"}), 422, "invalid-settings")
    body = problem(settings(api, "pages", {"cache_control": "max-age"}), 422, "invalid-settings")
    assert "cache_control" in body["detail"] and "max-age=N" in body["detail"]
    body = problem(settings(api, "pages", {"cache_control": "public, private"}), 422, "invalid-settings")
    assert "contradict" in body["detail"]


def fresh_name(prefix: str) -> str:
    """A collection no worker has looked up yet, so none holds a stale entry for it."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_a_collections_cache_policy_replaces_the_default_on_its_reads_and_pages(api):
    cached, plain = fresh_name("cached"), fresh_name("plain")
    assert settings(api, cached, {"cache_control": "private, max-age=60"}).status_code == 201
    for collection in (cached, plain):
        assert api.put_json(f"/v1/{collection}/d1", b'{"a":1}').status_code == 201
    # Twice each, so both the first read (settings read alongside) and a cached one are seen.
    for _ in range(4):
        read = api.get(f"/v1/{cached}/d1")
        assert read.headers["Cache-Control"] == "private, max-age=60"
        not_modified = api.get(f"/v1/{cached}/d1", headers={"If-None-Match": read.headers["ETag"]})
        assert not_modified.status_code == 304 and not_modified.headers["Cache-Control"] == "private, max-age=60"
        for path in (f"/v1/{cached}", f"/v1/{cached}?ids=d1"):
            assert api.get(path).headers["Cache-Control"] == "private, max-age=60"
        by_post = api.post_json(f"/v1/_get/{cached}", b'{"ids":["d1"]}')
        assert by_post.status_code == 200 and by_post.headers["Cache-Control"] == "private, max-age=60"
        # Another collection, and errors, keep theirs.
        assert api.get(f"/v1/{plain}/d1").headers["Cache-Control"] == "no-cache"
        assert api.get(f"/v1/{plain}").headers["Cache-Control"] == "no-cache"
        assert api.get(f"/v1/{cached}/missing").headers["Cache-Control"] == "no-store"


def test_a_cache_policy_change_reaches_the_reads_within_a_second(api):
    collection = fresh_name("policy")
    assert api.put_json(f"/v1/{collection}/d1", b'{"a":1}').status_code == 201
    assert api.get(f"/v1/{collection}/d1").headers["Cache-Control"] == "no-cache"
    assert settings(api, collection, {"cache_control": "max-age=5"}).status_code == 201
    time.sleep(1.0)  # the documented bound for a change to reach every worker
    assert {api.get(f"/v1/{collection}/d1").headers["Cache-Control"] for _ in range(6)} == {"max-age=5"}
    assert api.delete(f"/v1/_collections/{collection}").status_code == 204
    time.sleep(1.0)
    assert {api.get(f"/v1/{collection}/d1").headers["Cache-Control"] for _ in range(6)} == {"no-cache"}


# -- Idempotency-Key and a schema -----------------------------------------------------


def test_a_schema_violation_under_an_idempotency_key_is_recorded_and_replayed(api, redis_client):
    """POST and PATCH: the 422 is the request's answer; a retry gets it again, even once the schema allows it."""
    collection = fresh_name("idem")
    assert settings(api, collection, {"schema": USERS_SCHEMA}).status_code == 201
    invalid = b'{"email":"not an email","name":"x"}'
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = api.post_json(f"/v1/{collection}", invalid, headers=key)
    body = problem(first, 422, "schema-violation")
    assert [error["keyword"] for error in body["errors"]] == ["format"]
    assert settings(api, collection, {}).status_code == 200  # no schema any more
    time.sleep(1.0)
    again = api.post_json(f"/v1/{collection}", invalid, headers=key)
    assert again.status_code == 422 and again.headers["Idempotency-Replayed"] == "true"
    assert again.content == first.content
    assert api.get(f"/v1/{collection}").json()["items"] == [], "nothing was stored"

    assert settings(api, collection, {"schema": USERS_SCHEMA}).status_code == 200
    assert api.put_json(f"/v1/{collection}/u1", b'{"email":"a@example.com","name":"A"}').status_code == 201
    time.sleep(1.0)
    key = {"Idempotency-Key": uuid.uuid4().hex}
    patched = api.patch_merge(f"/v1/{collection}/u1", b'{"name":""}', headers=key)
    assert [e["keyword"] for e in problem(patched, 422, "schema-violation")["errors"]] == ["minLength"]
    retried = api.patch_merge(f"/v1/{collection}/u1", b'{"name":""}', headers=key)
    assert retried.status_code == 422 and retried.headers["Idempotency-Replayed"] == "true"
    assert retried.content == patched.content
    assert api.get(f"/v1/{collection}/u1").json()["name"] == "A"


# -- every worker, within a second ----------------------------------------------------


def worker_of(response: requests.Response) -> str:
    """The answering worker: a request id's first 16 hex digits are its worker's."""
    return response.headers["X-Request-ID"][:16]


def fresh_puts(api, path: str, body: bytes, count: int):
    """PUTs on fresh connections, so the kernel spreads them over the workers."""
    headers = {**api.auth_header, "Content-Type": "application/json"}
    return [requests.put(api.server.url(path), data=body, headers=headers, timeout=10) for _ in range(count)]


def test_a_change_reaches_both_workers_within_a_second(api):
    free = b'{"anything":1}'
    # Both workers learn that "users" has no settings (and would keep believing it without the publish).
    warm = fresh_puts(api, "/v1/users/u1", free, 30)
    assert {response.status_code for response in warm} <= {200, 201}
    assert len({worker_of(response) for response in warm}) == 2, "both workers must have answered"

    assert settings(api, "users", {"schema": USERS_SCHEMA}).status_code == 201
    changed_at = time.monotonic()
    time.sleep(max(0.0, 1.0 - (time.monotonic() - changed_at)))
    after = fresh_puts(api, "/v1/users/u1", free, 30)
    assert [response.status_code for response in after] == [422] * 30
    assert len({worker_of(response) for response in after}) == 2, "both workers must have answered"

    assert api.delete("/v1/_collections/users").status_code == 204
    time.sleep(1.0)
    again = fresh_puts(api, "/v1/users/u1", free, 30)
    assert {response.status_code for response in again} == {200}


# -- /openapi.json follows the settings ------------------------------------------------


def test_openapi_shows_a_collections_schema_as_its_write_bodies(api):
    assert settings(api, "users", {"schema": {**USERS_SCHEMA, "$defs": {"n": {"type": "integer"}}}}).status_code == 201
    time.sleep(0.3)
    spec = api.get("/openapi.json").json()
    component = spec["components"]["schemas"]["UsersDocument"]
    assert component["required"] == ["email", "name"] and "$schema" not in component
    put = spec["paths"]["/v1/users/{id}"]["put"]
    assert put["operationId"] == "putUsersDocument"
    assert put["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/UsersDocument"}
    assert spec["paths"]["/v1/users"]["post"]["operationId"] == "createUsersDocument"
    assert "/v1/{collection}/{id}" in spec["paths"], "the generic paths stay"

    assert api.delete("/v1/_collections/users").status_code == 204
    time.sleep(0.3)
    assert "/v1/users/{id}" not in api.get("/openapi.json").json()["paths"]


# -- the CLI ----------------------------------------------------------------------


def cli(redis_url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "api", "collections", *args],
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_the_cli_sets_shows_lists_and_deletes(api, redis_server, tmp_path):
    schema_file = tmp_path / "users.json"
    schema_file.write_text(json.dumps(USERS_SCHEMA))
    made = cli(redis_server.url, "set", "users", "--schema", str(schema_file), "--ttl", "1h", "--max-bytes", "4096")
    assert made.returncode == 0, made.stderr
    shown = cli(redis_server.url, "show", "users")
    assert json.loads(shown.stdout) == {"schema": USERS_SCHEMA, "ttl": 3600, "max_bytes": 4096}
    assert api.get("/v1/_collections/users").json()["ttl"] == 3600
    time.sleep(0.3)
    problem(api.put_json("/v1/users/u1", b"{}"), 422, "schema-violation")
    listed = cli(redis_server.url, "list").stdout.splitlines()
    assert listed[1].split()[:4] == ["users", "yes", "3600", "4096"]

    schema_file.write_text('{"type": "nope"}')
    refused = cli(redis_server.url, "set", "users", "--schema", str(schema_file))
    assert refused.returncode == 1 and "not a Draft 2020-12 schema" in refused.stderr
    assert cli(redis_server.url, "delete", "users").returncode == 0
    assert cli(redis_server.url, "show", "users").returncode == 1
    assert cli(redis_server.url, "set", "Bad").returncode == 2


def store_raw_settings(redis_client, collection: str, body: bytes) -> None:
    """Settings written straight into Redis as cache.collection_settings lays them out, no check (by hand)."""
    redis_client.hset(settings_key(collection.encode()), mapping={"s": body, "e": f'"raw-{uuid.uuid4().hex}"'})
    redis_client.zadd(NAMES_KEY, {collection: 0})
    redis_client.publish(CHANGED_CHANNEL, collection)
    time.sleep(0.1)  # the message reaches each worker's subscription within a round trip; a request may overtake it


REFUSED_SETTINGS = [
    (b'{"ttl":0,"cache_control":"max-age=7"}', "ttl must be a whole number from 1"),
    (b'{"max_bytes":1,"cache_control":"max-age=7"}', "max_bytes must be a whole number of at least 2"),
    (b'{"write_replicas":99,"cache_control":"max-age=7"}', "write_replicas must be"),
    (b'{"cache_control":"a\\nb"}', "cache_control must be"),
    (b'{"colour":"red","cache_control":"max-age=7"}', "unknown member 'colour'"),
    (b"[1,2]", "must be a JSON object"),
    (b"{not json", ""),
]


def test_stored_settings_that_fail_their_checks_refuse_writes_with_a_409_and_reads_carry_on(api, redis_client):
    """Each write (direct PUT, handler PUT, POST, PATCH, a batch's put) is a 409 stored-settings-refused; reads 200."""
    for body, words in REFUSED_SETTINGS:
        name = fresh_name("raw")
        assert api.put_json(f"/v1/{name}/kept", b'{"a":1}').status_code == 201
        store_raw_settings(redis_client, name, body)
        probe = f"/v1/{name}/probe"
        assert settled(lambda: api.put_json(probe, b"{}"), 409).status_code == 409  # noqa: B023 (called here)
        writes = [api.put_json(f"/v1/{name}/d", b'{"a":2}') for _ in range(4)]  # both workers, the direct path
        writes += [api.post_json(f"/v1/{name}", b'{"a":3}'), api.patch_merge(f"/v1/{name}/kept", b'{"a":4}')]
        for response in writes:
            refused = problem(response, 409, "stored-settings-refused")
            assert words in refused["detail"] and f"PUT /v1/_collections/{name}" in refused["detail"], refused
        operations = [{"op": "put", "collection": name, "id": "b", "document": {}}]
        operations.append({"op": "get", "collection": name, "id": "kept"})
        first, second = api.post_json("/v1/_batch", json.dumps({"operations": operations}).encode()).json()["results"]
        assert first["status"] == 409 and first["problem"]["type"] == PROBLEM + "stored-settings-refused", first
        assert second["status"] == 200 and second["document"] == {"a": 1}
        for _ in range(4):
            read = api.get(f"/v1/{name}/kept")
            assert read.status_code == 200 and read.json() == {"a": 1}
            if b"max-age=7" in body:
                assert read.headers["Cache-Control"] == "max-age=7", "a member that passes its check still applies"
        assert api.get(f"/v1/{name}").status_code == 200
        assert api.get(f"/v1/_collections/{name}").status_code == 200
        assert not redis_client.exists(document_key(name.encode(), b"d"))


def test_refused_stored_settings_are_read_once_per_version_and_new_settings_end_the_refusal(api, redis_client):
    name = fresh_name("raw")
    store_raw_settings(redis_client, name, b'{"ttl":-5}')
    assert settled(lambda: api.put_json(f"/v1/{name}/d", b"{}"), 409).status_code == 409
    for _ in range(4):
        problem(api.put_json(f"/v1/{name}/d", b"{}"), 409, "stored-settings-refused")
    redis_client.execute_command("CONFIG", "RESETSTAT")
    for _ in range(10):
        problem(api.put_json(f"/v1/{name}/d", b"{}"), 409, "stored-settings-refused")
    assert "cmdstat_hmget" not in redis_client.info("commandstats"), "the refusal is kept, not read again"
    assert settings(api, name, {"ttl": 60}).status_code == 200
    assert settled(lambda: api.put_json(f"/v1/{name}/d", b"{}"), 201).status_code == 201

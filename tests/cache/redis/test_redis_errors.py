"""Redis error replies mapped by their class, each provoked on a real redis-server.

Out of memory → 507; a replica, a master down, a busy script → 503 with
``Retry-After`` (a retry may succeed); anything else → 502, with the Redis
error class in the worker's log and never in the response body.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import pytest
import redis
import requests

from cache import keys
from tests.support import JetwayServer, RedisServer, free_port, wait_until

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis-errors"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(own_redis, tmp_path_factory) -> Iterator[JetwayServer]:
    jetway = JetwayServer(own_redis.url, tmp_path_factory.mktemp("redis-errors") / "jetway.log")
    try:
        yield jetway.start(["--workers", "1"])
    finally:
        jetway.stop()


@pytest.fixture
def client(own_redis) -> Iterator[redis.Redis]:
    connection = own_redis.client()
    connection.flushall()
    try:
        yield connection
    finally:
        # Whatever a test did to this Redis, the next one finds a writable master.
        connection.config_set("maxmemory", 0)
        connection.config_set("replica-serve-stale-data", "yes")
        connection.execute_command("REPLICAOF", "NO", "ONE")
        connection.close()


def put(server: JetwayServer, doc_id: str) -> requests.Response:
    return requests.put(server.url(f"/v1/things/{doc_id}"), data=b'{"a":1}', headers=JSON, timeout=10)


def problem_type(response: requests.Response) -> str:
    assert response.headers["Content-Type"] == "application/problem+json"
    return response.json()["type"].rsplit(":", 1)[1]


def test_out_of_memory_is_507(server, client):
    assert put(server, "a").status_code == 201
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    response = put(server, "b")
    assert response.status_code == 507
    assert problem_type(response) == "redis-out-of-memory"
    assert "Retry-After" not in response.headers
    # Reads still work: only writes are refused.
    assert requests.get(server.url("/v1/things/a"), timeout=10).status_code == 200


def become_replica(client: redis.Redis) -> None:
    """A replica of a master that is not there: its link stays down."""
    client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))


def test_a_replica_refuses_writes_with_503_and_retry_after(server, client):
    assert put(server, "a").status_code == 201
    become_replica(client)
    response = put(server, "b")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert problem_type(response) == "redis-not-ready"
    # A replica that serves stale data still answers reads.
    assert requests.get(server.url("/v1/things/a"), timeout=10).status_code == 200


def test_a_replica_whose_master_is_down_refuses_reads_with_503(server, client):
    """MASTERDOWN: a replica told not to serve stale data while its link is down."""
    client.config_set("replica-serve-stale-data", "no")
    become_replica(client)
    response = requests.get(server.url("/v1/things/a"), timeout=10)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"


def test_a_busy_script_is_503_and_the_next_read_after_it_is_killed_succeeds(server, client, own_redis):
    assert put(server, "a").status_code == 201
    client.config_set("busy-reply-threshold", 100)
    looping = own_redis.client()
    spinning = threading.Thread(target=_spin, args=(looping,))
    spinning.start()
    try:
        wait_until(lambda: _busy(client), 5, "the script to make Redis busy")
        response = requests.get(server.url("/v1/things/a"), timeout=10)
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "1"
    finally:
        wait_until(lambda: _kill_script(client), 10, "the script killed")
        spinning.join(10)
        looping.close()
        client.config_set("busy-reply-threshold", 5000)
    assert requests.get(server.url("/v1/things/a"), timeout=10).status_code == 200


def _spin(connection: redis.Redis) -> None:
    with contextlib.suppress(redis.ResponseError):  # killed by SCRIPT KILL, as meant
        connection.eval("while true do end", 0)


def _busy(client: redis.Redis) -> bool:
    try:
        client.ping()
    except redis.exceptions.BusyLoadingError:
        return True
    except redis.ResponseError as error:
        return str(error).startswith("BUSY")
    return False


def _kill_script(client: redis.Redis) -> bool:
    try:
        client.execute_command("SCRIPT", "KILL")
    except redis.ResponseError as error:
        return "NOTBUSY" in str(error)
    return True


def test_any_other_error_is_502_and_only_the_log_names_its_class(server, client):
    client.rpush(keys.document_key(b"things", b"listy"), b"not a hash")
    response = requests.get(server.url("/v1/things/listy"), timeout=10)
    assert response.status_code == 502
    assert problem_type(response) == "redis-error"
    assert b"WRONGTYPE" not in response.content
    wait_until(lambda: "with WRONGTYPE" in server.log_path.read_text(), 5, "the log line naming WRONGTYPE")

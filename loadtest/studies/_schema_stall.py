"""How long a worker stops answering ``/healthz`` while it compiles a collection schema (issue 44, item 1).

One worker (so every request reaches the same reactor), a private
redis-server, no auth. A thread asks ``/healthz`` every 10 ms on one
keep-alive connection and keeps each answer's latency; the script PUTs a
fresh ~32 KiB schema as a collection's settings, then PUTs a document into
that collection (the first write under the new version), and reports the
longest ``/healthz`` answer during each, cold (the first schema the worker
ever sees) and warm (the next rounds, each a new schema). With
``--elsewhere`` the settings are written into Redis as another worker's PUT
writes them, so the first write is this worker's first use of the version
(its compile):

    PYTHONPATH=. .venv/bin/python -m loadtest.studies._schema_stall [--rounds 6] [--elsewhere]
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Optional, Tuple

from cache.collection_settings import CHANGED_CHANNEL, NAMES_KEY, settings_key
from cache.schemas.bounds import MAX_SCHEMA_BYTES
from tests.support import JetwayServer, RedisServer


def big_schema(seed: int, limit: int = MAX_SCHEMA_BYTES) -> dict:
    """An ordinary-looking object schema just under ``limit`` bytes, different for each ``seed``."""
    properties: dict = {}
    schema = {"type": "object", "properties": properties, "required": []}
    index = 0
    while True:
        name = f"f{seed}_{index}"
        kinds = (
            {"type": "string", "maxLength": 64, "pattern": f"^[a-z]{{1,{index % 9 + 1}}}$"},
            {"type": "integer", "minimum": 0, "maximum": index + 10},
            {"type": "array", "items": {"type": "string", "format": "email"}, "maxItems": 5},
            {"type": "object", "properties": {"x": {"type": "number"}}, "additionalProperties": False},
        )
        properties[name] = kinds[index % 4]
        if len(json.dumps(schema, separators=(",", ":"))) > limit - 200:
            del properties[name]
            return schema
        index += 1


class Probe(threading.Thread):
    """``GET /healthz`` every 10 ms; ``(sent at, seconds to answer)`` for each."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.samples: List[Tuple[float, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stopping.is_set():
            sent = time.monotonic()
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            self.samples.append((sent, time.monotonic() - sent))
            time.sleep(max(0.0, 0.01 - (time.monotonic() - sent)))

    def worst(self, start: float, end: float) -> float:
        """The longest answer to a probe sent in [start, end], or still pending at ``start``."""
        return max((took for sent, took in self.samples if sent <= end and sent + took >= start), default=0.0)


def timed(port: int, method: str, path: str, body: bytes) -> Tuple[float, float, int]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    start = time.monotonic()
    connection.request(method, path, body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read()
    return start, time.monotonic(), response.status


def stored_elsewhere(redis: RedisServer, collection: str, body: bytes) -> Tuple[float, float, int]:
    """The settings as another worker's PUT stores them (``cache.collection_settings``), and its message."""
    client = redis.client()
    start = time.monotonic()
    client.hset(settings_key(collection.encode()), mapping={"s": body, "e": f'"x-{collection}"'})
    client.zadd(NAMES_KEY, {collection: 0})
    client.publish(CHANGED_CHANNEL, collection)
    return start, time.monotonic(), 201


def one_round(port: int, probe: Probe, seed: int, redis: Optional[RedisServer]) -> Tuple[float, ...]:
    """(settings PUT s, its worst /healthz s, first write s, its worst /healthz s)."""
    body = json.dumps({"schema": big_schema(seed)}, separators=(",", ":")).encode()
    if redis is None:
        start, end, status = timed(port, "PUT", f"/v1/_collections/c{seed}", body)
    else:
        start, end, status = stored_elsewhere(redis, f"c{seed}", body)
    assert status in (200, 201), status
    time.sleep(0.1)  # let the probe see the end of the stall, and the invalidation arrive
    put = (end - start, probe.worst(start, end + 0.05))
    start, end, status = timed(port, "PUT", f"/v1/c{seed}/d1", b"{}")
    assert status in (200, 201), status
    time.sleep(0.1)
    return (*put, end - start, probe.worst(start, end + 0.05))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--elsewhere", action="store_true", help="settings written into Redis, not PUT here")
    args = parser.parse_args()
    print(f"schema of {len(json.dumps(big_schema(0), separators=(',', ':')))} bytes")
    with tempfile.TemporaryDirectory() as directory:
        redis = RedisServer(Path(directory) / "redis").start()
        server = JetwayServer(redis.url, Path(directory) / "jetway.log")
        try:
            server.start(["--workers", "1"])
            probe = Probe(server.port)
            probe.start()
            time.sleep(0.5)
            print("round     PUT settings  its /healthz   first write  its /healthz")
            for seed in range(args.rounds):
                figures = one_round(server.port, probe, seed, redis if args.elsewhere else None)
                label = "cold" if seed == 0 else f"warm {seed}"
                print(f"{label:8}" + "".join(f"{value * 1000:11.1f} ms" for value in figures))
            probe.stopping.set()
            probe.join(5)
        finally:
            server.stop()
            redis.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

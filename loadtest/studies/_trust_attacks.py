"""Issue 44's attacks, as ``loadtest.studies._trust`` repeats them against one server.

Each attack is a function of a ``Target`` (the server's port, an admin
token, the tree whose CLI to run, the loopback listener's port) and the
round number; it returns the HTTP statuses it saw (``timeout`` when the
client gave up after ``CLIENT_TIMEOUT``, ``error`` when the connection broke)
and, for some, a figure of its own (``Outcome.figures``). Every request goes
to 127.0.0.1, and every one is bounded in time.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

CLIENT_TIMEOUT = 30.0
STREAM_WAIT = 15.0
MIB = 1024 * 1024
# Just under JETWAY_MAX_BODY's default (1 MiB) with its wrapper.
BIG_DOCUMENT = b'{"pad":"' + b"x" * (MIB - 16) + b'"}'
PAGE_DOCUMENTS = 64


@dataclass
class Target:
    port: int
    master: int
    token: str
    tree: Path
    python: Path
    redis_url: str
    listener_port: int
    slowest: float = 0.0  # seconds, the longest request ``call`` made since it was last reset

    def headers(self, content_type: str = "application/json") -> Dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Content-Type": content_type}

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """``python -m api ARGS`` of this tree, against this server's Redis."""
        return subprocess.run(
            [str(self.python), "-m", "api", *args],
            cwd=self.tree,
            env={**os.environ, "REDIS_URL": self.redis_url},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


@dataclass
class Outcome:
    statuses: List[str] = field(default_factory=list)
    figures: Dict[str, object] = field(default_factory=dict)


def call(
    target: Target, method: str, path: str, body: Optional[bytes] = None, content_type: str = "application/json"
) -> Tuple[str, bytes]:
    """One request on a fresh connection: its status (or timeout/error) and at most 64 KB of its body."""
    connection = http.client.HTTPConnection("127.0.0.1", target.port, timeout=CLIENT_TIMEOUT)
    started = time.monotonic()
    try:
        connection.request(method, path, body, target.headers(content_type))
        response = connection.getresponse()
        kept = response.read(65536)
        while response.read(MIB):  # a huge answer is read and dropped, not held
            pass
        return str(response.status), kept
    except socket.timeout:
        return "timeout", b""
    except (OSError, http.client.HTTPException):
        return "error", b""
    finally:
        connection.close()
        target.slowest = max(target.slowest, time.monotonic() - started)


def fresh(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def nested(levels: int, key: str, inner: object) -> object:
    for _ in range(levels):
        inner = {key: inner}
    return inner


def schema_then_write(target: Target, schema: object, document: object) -> List[str]:
    """A collection's settings PUT with ``schema``, then a PUT of ``document`` into it."""
    collection = fresh("s")
    settings = json.dumps({"schema": schema}).encode()
    first, _ = call(target, "PUT", f"/v1/_collections/{collection}", settings)
    second, _ = call(target, "PUT", f"/v1/{collection}/d", json.dumps(document).encode())
    return [first, second]


def redos(target: Target, _round: int) -> Outcome:
    schema = {"properties": {"s": {"pattern": "^(a+)+$"}}}
    return Outcome(schema_then_write(target, schema, {"s": "a" * 25 + "!"}))


def remote_ref(target: Target, _round: int) -> Outcome:
    """The settings PUT, a write, then a batch: one operation on that collection and two good ones."""
    collection = fresh("r")
    schema = {"$ref": f"http://127.0.0.1:{target.listener_port}/x.json"}
    statuses = [call(target, "PUT", f"/v1/_collections/{collection}", json.dumps({"schema": schema}).encode())[0]]
    statuses.append(call(target, "PUT", f"/v1/{collection}/d", b'{"a":1}')[0])
    operations = [
        {"op": "put", "collection": "plain", "id": "good", "document": {"a": 1}},
        {"op": "put", "collection": collection, "id": "e", "document": {"a": 1}},
        {"op": "get", "collection": "plain", "id": "good"},
    ]
    status, body = call(target, "POST", "/v1/_batch", json.dumps({"operations": operations}).encode())
    statuses.append(status)
    outcome = Outcome(statuses)
    try:
        outcome.figures["batch operations"] = [result["status"] for result in json.loads(body)["results"]]
    except (ValueError, KeyError, TypeError):
        outcome.figures["batch operations"] = "none (not per operation)"
    return outcome


CYCLE = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


def ref_cycle(target: Target, _round: int) -> Outcome:
    return Outcome(schema_then_write(target, CYCLE, {"x": 1}))


def ref_cycle_unevaluated(target: Target, _round: int) -> Outcome:
    return Outcome(schema_then_write(target, {**CYCLE, "unevaluatedProperties": False}, {"x": 1}))


def not_nested(target: Target, _round: int) -> Outcome:
    return Outcome(schema_then_write(target, nested(300, "not", {}), {"x": 1}))


def recursive_document(target: Target, _round: int) -> Outcome:
    schema = {"type": "object", "properties": {"c": {"$ref": "#"}}}
    return Outcome(schema_then_write(target, schema, nested(400, "c", {})))


def big_schema(seed: int, size: int = 800_000) -> dict:
    """An ordinary object schema of about ``size`` bytes, different for each ``seed``."""
    kinds = (
        {"type": "string", "maxLength": 64},
        {"type": "integer", "minimum": 0},
        {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        {"type": "object", "properties": {"x": {"type": "number"}}},
    )
    one = len(json.dumps({f"f{seed}_00000": kinds[2]}))
    count = size // one
    return {"type": "object", "properties": {f"f{seed}_{i:05d}": kinds[i % 4] for i in range(count)}}


def schema_800k(target: Target, round_number: int) -> Outcome:
    return Outcome(schema_then_write(target, big_schema(round_number + int(time.time())), {"f0_00000": "x"}))


def store_big(target: Target) -> None:
    """users/big (1 MiB) and PAGE_DOCUMENTS more in ``pages``, for the answers composed of many."""
    for path in ["/v1/users/big"] + [f"/v1/pages/p{n:03d}" for n in range(PAGE_DOCUMENTS)]:
        status, body = call(target, "PUT", path, BIG_DOCUMENT)
        if status not in ("200", "201"):
            raise RuntimeError(f"PUT {path}: {status} {body[:200]!r}")


def ids_300(target: Target, _round: int) -> Outcome:
    return Outcome([call(target, "GET", "/v1/users?ids=" + ",".join(["big"] * 300))[0]])


def post_get_1000(target: Target, _round: int) -> Outcome:
    return Outcome([call(target, "POST", "/v1/_get/users", json.dumps({"ids": ["big"] * 1000}).encode())[0]])


def batch_1000_gets(target: Target, _round: int) -> Outcome:
    operations = [{"op": "get", "collection": "users", "id": "big"}] * 1000
    return Outcome([call(target, "POST", "/v1/_batch", json.dumps({"operations": operations}).encode())[0]])


def list_page(target: Target, _round: int) -> Outcome:
    return Outcome([call(target, "GET", "/v1/pages?limit=1000")[0]])


# The bodies; the 4,301-digit integer may be stored verbatim (or refused), the others must be a 400.
INVALID_BODIES = [
    b'{"a":"\\u 123"}',
    b'{"a":"\\u+123"}',
    b'{"a":"\\u1_23"}',
    b'{"a":"\\u-123"}',
    '{"a":1\u0661}'.encode(),
    '{"a":1e\u0665}'.encode(),
    '{"a":"\\uD\uff1800"}'.encode(),
]
LONG_INTEGER = b'{"a":' + b"1" * 4301 + b"}"


def invalid_json(target: Target, _round: int) -> Outcome:
    """Each body through PUT, POST, PATCH (merge patch) and a batch's put."""
    call(target, "PUT", "/v1/junk/base", b'{"a":0}')
    outcome = Outcome()
    accepted = []
    for number, body in enumerate([*INVALID_BODIES, LONG_INTEGER]):
        batch = b'{"operations":[{"op":"put","collection":"junk","id":"b%d","document":%s}]}' % (number, body)
        statuses = [
            call(target, "PUT", f"/v1/junk/p{number}", body)[0],
            call(target, "POST", "/v1/junk", body)[0],
            call(target, "PATCH", "/v1/junk/base", body, "application/merge-patch+json")[0],
        ]
        status, answer = call(target, "POST", "/v1/_batch", batch)
        if status == "200":  # the batch answers per operation: its one operation's status is the verdict
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                status = f"200/op {json.loads(answer)['results'][0]['status']}"
        statuses.append(status)
        outcome.statuses += statuses
        if body is not LONG_INTEGER:
            accepted += [s for s in statuses if s.startswith("2") and not s.startswith("200/op 4")]
    outcome.figures["invalid bodies accepted (2xx)"] = len(accepted)
    return outcome


def stream_revoked(target: Target, round_number: int) -> Outcome:
    """An SSE stream opened with a token, the token revoked by the CLI: how long until the stream ends."""
    name = f"stream-{round_number}-{uuid.uuid4().hex[:6]}"
    made = target.cli("keys", "create", "--name", name, "--scope", "read:*")
    token = made.stdout.strip().splitlines()[-1] if made.returncode == 0 and made.stdout.strip() else ""
    sock = socket.create_connection(("127.0.0.1", target.port), timeout=CLIENT_TIMEOUT)
    try:
        request = "GET /v1/_changes/users HTTP/1.1\r\nHost: trust\r\nAccept: text/event-stream\r\n"
        sock.sendall((request + f"Authorization: Bearer {token}\r\n\r\n").encode())
        seen = _read_until(sock, b"event: ready", CLIENT_TIMEOUT)
        status = seen[9:12].decode() if seen.startswith(b"HTTP/1.1 ") else "error"
        if status != "200":
            return Outcome([status], {"stream end after the CLI returned (s)": f"not opened ({status})"})
        started = time.monotonic()
        target.cli("keys", "revoke", name)
        revoked = time.monotonic()
        seen += _read_until(sock, None, STREAM_WAIT)
        ended = time.monotonic()
    finally:
        sock.close()
    outcome = Outcome([status])
    still_open = ended - revoked >= STREAM_WAIT - 0.05
    outcome.figures["stream end after the CLI returned (s)"] = None if still_open else round(ended - revoked, 3)
    outcome.figures["revoke CLI took (s)"] = round(revoked - started, 2)
    outcome.figures["unauthorized event"] = b"event: unauthorized" in seen
    return outcome


def _read_until(sock: socket.socket, marker: Optional[bytes], wait: float) -> bytes:
    """What arrives until ``marker`` (or the end of the stream, with None), for at most ``wait`` s."""
    received = b""
    end = time.monotonic() + wait
    while time.monotonic() < end:
        sock.settimeout(max(0.01, end - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        except OSError:
            break
        if not chunk:
            break
        received += chunk
        if marker is not None and marker in received:
            break
    return received


def hangup(target: Target, _round: int) -> Outcome:
    """``kill -HUP -PGID`` while a client writes steadily: its failed requests, 12 s from the signal."""
    stop = threading.Event()
    outcome = Outcome()

    def steady() -> None:
        number = 0
        while not stop.is_set():
            status, _ = call(target, "PUT", f"/v1/hup/d{number % 100}", b'{"n":%d}' % number)
            outcome.statuses.append(status)
            number += 1

    client = threading.Thread(target=steady, daemon=True)
    client.start()
    time.sleep(1.0)
    os.killpg(target.master, signal.SIGHUP)
    time.sleep(12.0)
    stop.set()
    client.join(CLIENT_TIMEOUT + 5)
    failed = [status for status in outcome.statuses if not status.startswith("2")]
    outcome.figures["failed requests"] = f"{len(failed)} of {len(outcome.statuses)}"
    return outcome


@dataclass(frozen=True)
class Attack:
    name: str
    what: str
    run: Callable[[Target, int], Outcome]
    prepare: Optional[Callable[[Target], None]] = None
    rounds: Optional[int] = None  # fixed, whatever --rounds says


ATTACKS = [
    Attack("redos", 'pattern "^(a+)+$", PUT of 25 a\'s and "!"', redos),
    Attack("remote-ref", "$ref to the listener: settings PUT, a write, a batch (1 op on it + 2 good)", remote_ref),
    Attack("ref-cycle", "$defs a -> a, settings PUT + a write", ref_cycle),
    Attack("ref-cycle-uneval", "the same cycle + unevaluatedProperties:false", ref_cycle_unevaluated),
    Attack("not-300", '{"not":{"not":…}} nested 300 levels, + a write', not_nested),
    Attack("recursive-400", "properties.c = $ref #, a document nested 400 deep", recursive_document),
    Attack("schema-800k", "an 800 KB schema (new each round), + a write", schema_800k),
    Attack("ids-300", "GET /v1/users?ids=big x300 (1 MiB document)", ids_300, store_big),
    Attack("post-get-1000", "POST /v1/_get/users, big x1000", post_get_1000, store_big),
    Attack("batch-1000-gets", "a batch of 1,000 gets of big", batch_1000_gets, store_big),
    Attack("list-1000", f"GET /v1/pages?limit=1000 over {PAGE_DOCUMENTS} documents of 1 MiB", list_page, store_big),
    Attack("invalid-json", "8 bodies x PUT, POST, PATCH, batch", invalid_json),
    Attack("stream-revoked", "SSE stream, its token revoked by the CLI (5 trials)", stream_revoked, rounds=5),
    Attack("hup-pgid", "kill -HUP -PGID under a steady writer", hangup),
]

"""Records a history: concurrent keep-alive clients over a few documents, every operation with its times and result.

Each client thread loops over GET, HEAD, a GET revalidated with
``If-None-Match``, unconditional PUT, PUT with ``If-Match`` (compare-and-set
on the ETag it last saw), PUT with ``If-None-Match: *``, PATCH (merge
patch), DELETE (with and without ``If-Match``), the multi-get and batches,
on 3-10 ids, so operations collide. Each is recorded with its invocation
and completion times (``time.monotonic_ns``) and its result; a timeout, a
reset connection or a 5xx is *indeterminate* (``status`` None: it may or may
not have taken effect), never a failure. Multi-gets and batches are
recorded as one entry per document, each with the request's times (sound:
a batch is not atomic, and each part took effect within the request).

Every written value is unique (client and sequence number), so a read names
the write it saw. Values are kept in canonical JSON (sorted keys, compact),
as the Go checker writes them too.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

TIMEOUT = 5.0
MERGE_PATCH = "application/merge-patch+json"
Record = Dict[str, Any]


def canonical(value: Any) -> Optional[str]:
    return None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


# (kind, weight); kinds are documented in checker/model.go.
MIX = [
    ("get", 18),
    ("head", 5),
    ("get304", 5),
    ("mget", 8),
    ("put", 12),
    ("cas", 14),
    ("create", 6),
    ("patch", 12),
    ("delete", 5),
    ("cdelete", 4),
    ("batch", 8),
]
# Mostly reads, for the scenarios about stale reads: a cached document stays cached between writes.
READ_HEAVY = [
    ("get", 40),
    ("head", 5),
    ("get304", 10),
    ("mget", 15),
    ("put", 4),
    ("cas", 4),
    ("create", 1),
    ("patch", 3),
    ("delete", 1),
    ("cdelete", 1),
    ("batch", 3),
]
MIXES = {"default": MIX, "read-heavy": READ_HEAVY}
BATCH_KINDS = ["get", "put", "cas", "create", "patch", "delete", "cdelete"]


class Recorder:
    """``clients`` threads against ``port`` until ``ops`` operations are recorded (or ``seconds`` pass)."""

    def __init__(
        self,
        port: int,
        token: str,
        collection: str,
        clients: int = 8,
        docs: int = 5,
        ops: int = 600,
        seconds: float = 120.0,
        seed: Optional[int] = None,
        mix: str = "default",
    ) -> None:
        self.port = port
        self.auth = f"Bearer {token}"
        self.collection = collection
        self.clients = clients
        self.doc_ids = [f"d{n}" for n in range(docs)]
        self.target = ops
        self.seconds = seconds
        self.mix = MIXES[mix]
        self.seed = seed if seed is not None else random.randrange(1 << 30)
        self.lock = threading.Lock()
        self.records: List[Record] = []
        self.requests = 0
        self.stopping = threading.Event()
        self.released = threading.Event()  # the fault is over: stop at ``ops``
        self.next_group = 0

    # --- the run -------------------------------------------------------------

    def run(self, busy: Callable[[], bool] = lambda: False, tail: float = 1.0) -> None:
        """Until ``ops`` are recorded and ``busy()`` (a fault at work) has been false for ``tail`` seconds."""
        threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(self.clients)]
        self.started = time.monotonic_ns()
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + self.seconds
        while busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(tail)
        self.released.set()
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stopping.set()
        for thread in threads:
            thread.join(TIMEOUT * 3)
        self.ended = time.monotonic_ns()

    def progress(self) -> float:
        """Fraction of the operations recorded so far."""
        return self.requests / self.target

    def _client(self, number: int) -> None:
        rng = random.Random(self.seed * 1000 + number)
        client = _Client(self, number, rng)
        kinds, weights = zip(*self.mix)
        while not self.stopping.is_set():
            with self.lock:
                if self.requests >= self.target and self.released.is_set():
                    return
                self.requests += 1
            kind = rng.choices(kinds, weights)[0]
            client.one(kind)
        client.close()

    def add(self, records: List[Record]) -> None:
        with self.lock:
            for record in records:
                record["n"] = len(self.records)
                self.records.append(record)

    def group(self) -> int:
        with self.lock:
            self.next_group += 1
            return self.next_group


class _Client:
    """One client: a keep-alive connection, the ETags it last saw, its write counter."""

    def __init__(self, recorder: Recorder, number: int, rng: random.Random) -> None:
        self.r = recorder
        self.number = number
        self.rng = rng
        self.seq = 0
        self.etags: Dict[str, str] = {}
        self.conn: Optional[http.client.HTTPConnection] = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # --- HTTP ----------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None
    ) -> Tuple[int, int, int, Dict[str, str], bytes]:
        """(call, ret, status, headers, body); status 0 when the outcome is unknown (timeout, reset, refused)."""
        all_headers = {"Authorization": self.r.auth, **(headers or {})}
        if body is not None and "Content-Type" not in all_headers:
            all_headers["Content-Type"] = "application/json"
        call = time.monotonic_ns()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.r.port, timeout=TIMEOUT)
            self.conn.request(method, path, body=body, headers=all_headers)
            response = self.conn.getresponse()
            data = response.read()
            ret = time.monotonic_ns()
            answer = {k.lower(): v for k, v in response.getheaders()}
            if answer.get("connection", "").lower() == "close":
                self.close()
            return call, ret, response.status, answer, data
        except (OSError, http.client.HTTPException, socket.timeout):
            ret = time.monotonic_ns()
            self.close()
            time.sleep(0.02)  # an outage: do not fill the history with refusals
            return call, ret, 0, {}, b""

    def value(self) -> Dict[str, Any]:
        self.seq += 1
        return {"w": f"c{self.number}n{self.seq}", "f": self.rng.randrange(5)}

    def patch_body(self) -> Dict[str, Any]:
        self.seq += 1
        choice = self.rng.randrange(4)
        if choice == 0:
            return {"f": self.rng.randrange(5)}
        if choice == 1:
            return {"g": f"c{self.number}n{self.seq}"}
        if choice == 2:
            return {"g": None, "o": None}
        return {"o": {"a": f"c{self.number}n{self.seq}"}}

    def doc(self) -> str:
        return self.rng.choice(self.r.doc_ids)

    def path(self, doc: str) -> str:
        return f"/v1/{self.r.collection}/{doc}"

    # --- operations ------------------------------------------------------------

    def one(self, kind: str) -> None:
        if kind == "mget":
            self.mget()
        elif kind == "batch":
            self.batch()
        else:
            self.single(kind, self.doc())

    def single(self, kind: str, doc: str) -> None:
        method, headers, body, given = self.plan(kind, doc)
        call, ret, status, answer, data = self.request(method, self.path(doc), body, headers)
        record = self.record(kind, doc, "http", call, ret, given)
        self.result(record, status, answer.get("etag"), data, method)
        self.r.add([record])

    def plan(self, kind: str, doc: str) -> Tuple[str, Dict[str, str], Optional[bytes], Dict[str, Any]]:
        """Method, headers, body, and what the checker is told of the input."""
        seen = self.etags.get(doc, '"none"')
        if kind in ("get", "head"):
            return kind.upper(), {}, None, {}
        if kind == "get304":
            return "GET", {"If-None-Match": seen}, None, {"inm": seen}
        if kind in ("put", "cas", "create"):
            value = self.value()
            headers = {"If-Match": seen} if kind == "cas" else {"If-None-Match": "*"} if kind == "create" else {}
            given = {"value": canonical(value), **({"if_match": seen} if kind == "cas" else {})}
            return "PUT", headers, json.dumps(value).encode(), given
        if kind == "patch":
            patch = self.patch_body()
            return "PATCH", {"Content-Type": MERGE_PATCH}, json.dumps(patch).encode(), {"patch": canonical(patch)}
        if kind == "delete":
            return "DELETE", {}, None, {}
        if kind == "cdelete":
            return "DELETE", {"If-Match": seen}, None, {"if_match": seen}
        raise ValueError(kind)

    def record(self, kind: str, doc: str, via: str, call: int, ret: int, given: Dict[str, Any]) -> Record:
        return {"client": self.number, "kind": kind, "doc": doc, "via": via, "call": call, "ret": ret, "in": given}

    def result(self, record: Record, status: int, etag: Optional[str], data: bytes, method: str) -> None:
        """Status, ETag and value into ``record``; a 5xx or no answer is indeterminate (status None)."""
        record["status"] = status if 0 < status < 500 else None
        record["http_status"] = status
        value = None
        if status in (200, 201) and method in ("GET", "PUT", "PATCH") and data:
            value = canonical(json.loads(data))
        elif status >= 500 and data:
            problem = _json_or_none(data)
            if isinstance(problem, dict):
                record["problem"] = problem.get("type")
                etag = problem.get("etag", etag)  # not-replicated: the write was applied on the primary
        record["etag"] = etag if (status in (200, 201, 304) or status >= 500) else None
        record["value"] = value
        if record["kind"] == "head" and status == 200:
            record["value"] = None
        if etag and status in (200, 201, 304):
            self.etags[record["doc"]] = etag
        elif status == 404:
            self.etags.pop(record["doc"], None)

    def mget(self) -> None:
        docs = self.rng.sample(self.r.doc_ids, min(len(self.r.doc_ids), self.rng.randint(2, 3)))
        path = f"/v1/{self.r.collection}?ids={','.join(docs)}"
        call, ret, status, _, data = self.request("GET", path)
        records = []
        items = json.loads(data)["items"] if status == 200 else [None] * len(docs)
        for doc, item in zip(docs, items):
            record = self.record("mget", doc, "mget", call, ret, {})
            record["status"] = (200 if item is not None else 404) if status == 200 else None
            record["http_status"] = status
            record["value"] = canonical(item)
            record["etag"] = None
            records.append(record)
        self.r.add(records)

    def batch(self) -> None:
        docs = self.rng.sample(self.r.doc_ids, min(len(self.r.doc_ids), self.rng.randint(2, 3)))
        group = self.r.group()
        operations, planned = [], []
        for doc in docs:
            kind = self.rng.choice(BATCH_KINDS)
            operation: Dict[str, Any] = {"collection": self.r.collection, "id": doc}
            seen = self.etags.get(doc, '"none"')
            given: Dict[str, Any] = {}
            if kind == "get":
                operation["op"] = "get"
            elif kind in ("put", "cas", "create"):
                value = self.value()
                operation.update(op="put", document=value)
                given["value"] = canonical(value)
                if kind == "cas":
                    operation["if_match"] = given["if_match"] = seen
                if kind == "create":
                    operation["if_none_match"] = "*"
            elif kind == "patch":
                patch = self.patch_body()
                operation.update(op="patch", patch=patch)
                given["patch"] = canonical(patch)
            else:
                operation["op"] = "delete"
                if kind == "cdelete":
                    operation["if_match"] = given["if_match"] = seen
            operations.append(operation)
            planned.append((kind, doc, given))
        body = json.dumps({"operations": operations}).encode()
        call, ret, status, _, data = self.request("POST", "/v1/_batch", body)
        results = json.loads(data)["results"] if status == 200 else [None] * len(planned)
        records = []
        for (kind, doc, given), result in zip(planned, results):
            record = self.record(kind, doc, "batch", call, ret, given)
            record["group"] = group
            if result is None:
                self.result(record, status or 0, None, b"", "POST")
            else:
                document = result.get("document")
                raw = json.dumps(document).encode() if document is not None else b""
                method = "GET" if kind == "get" else "DELETE" if "delete" in kind else "PUT"
                problem = result.get("problem") or {}
                etag = result.get("etag") or problem.get("etag")
                self.result(record, result["status"], etag, raw, method)
            records.append(record)
        self.r.add(records)


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None

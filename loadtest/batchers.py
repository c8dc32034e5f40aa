"""Batch writers: many documents per request through ``POST /v1/_batch``.

A visit sends ``--batch-size`` operations over the ``--write-docs`` ids of
the ``PREFIX-batch`` collection (its own, so batch writers never race the
other writers' If-Match): ``--batch-get-share`` of them reads, the rest
PUTs of a small document (``batch``). The request fails when it is not
200 or when any operation's own status is not 200 or 201.

Off by default (``--batch-writer-weight 0``): the gate's baseline
(``loadtest/baseline.json``) was recorded without them, and adding a user
class changes every figure it compares.
"""

from __future__ import annotations

import json
import random
from typing import Any, Dict, List

import _data
from _jetway import JetwayUser
from locust import task

BATCH = "batch"


class BatchWriterUser(JetwayUser):
    weight_option = "batch_writer_weight"

    def on_start(self) -> None:
        self.rng = random.Random()
        self.ids = _data.ids("b", self.scenario.write_docs)
        self.collection = f"{self.scenario.collection_prefix}-{BATCH}"
        self.version = 0
        self.written: List[str] = []

    @task
    def write_many(self) -> None:
        body = json.dumps({"operations": [self._operation() for _ in range(self.scenario.batch_size)]})
        headers = self.headers(**{"Content-Type": "application/json", "Prefer": "return=minimal"})
        with self.client.post("/v1/_batch", data=body, name="batch", headers=headers, catch_response=True) as reply:
            if reply.status_code != 200:
                reply.failure(f"expected 200, got {reply.status_code}")
                return
            refused = [result for result in reply.json()["results"] if result["status"] not in (200, 201)]
            if refused:
                reply.failure(f"{len(refused)} operations refused, the first: {refused[0]}")

    def _operation(self) -> Dict[str, Any]:
        # A get reads what this user wrote already: another id may not exist yet (a 404).
        if self.written and self.rng.random() < self.scenario.batch_get_share:
            doc_id = self.written[self.rng.randrange(len(self.written))]
            return {"op": "get", "collection": self.collection, "id": doc_id}
        doc_id = self.ids[self.rng.randrange(len(self.ids))]
        self.version += 1
        self.written.append(doc_id)
        document = json.loads(_data.document(doc_id, self.scenario.small_bytes, self.version))
        return {"op": "put", "collection": self.collection, "id": doc_id, "document": document}

"""Writers: read-modify-write with PUT or merge PATCH and ``If-Match``.

A write reads the document (``GET write doc``) for its ETag, then sends the
new version (``PUT``/``PATCH write doc``) with ``If-Match``. Writers share
``--write-docs`` documents, so two of them sometimes race between the read
and the write: the loser gets a 412, which is the API working as it should.
It is counted under its own name (``write doc 412``) as a success, and the
writer reads again and retries, up to ``--max-retries`` times; running out
of retries is a failure.
"""

from __future__ import annotations

import json
import random
from typing import Optional

import _data
from _jetway import WRITE, JetwayUser
from locust import task

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class WriterUser(JetwayUser):
    weight_option = "writer_weight"

    def on_start(self) -> None:
        self.rng = random.Random()
        self.ids = self.scenario.ids(WRITE)
        self.version = 0

    @task
    def write(self) -> None:
        doc_id = self.ids[self.rng.randrange(len(self.ids))]
        path = f"/v1/{self.scenario.collection(WRITE)}/{doc_id}"
        patching = self.rng.random() < self.scenario.patch_share
        for _ in range(self.scenario.max_retries + 1):
            etag = self._read(path)
            if etag is None:
                return
            self.version += 1
            if patching:
                body = json.dumps({"version": self.version, "by": id(self)}).encode()
                outcome = self._send("PATCH", path, body, MERGE_PATCH, etag)
            else:
                body = _data.document(doc_id, self.scenario.small_bytes, self.version)
                outcome = self._send("PUT", path, body, JSON, etag)
            if outcome != 412:
                return
        self._give_up(patching)

    def _send(self, method: str, path: str, body: bytes, content_type: str, etag: str) -> Optional[int]:
        headers = self.headers(**{"Content-Type": content_type, "If-Match": etag})
        with self.client.request(
            method, path, name="write doc", data=body, headers=headers, catch_response=True
        ) as response:
            if response.status_code == 412:
                response.request_meta["name"] = "write doc 412"
                response.success()
            elif response.status_code != 200:
                response.failure(f"expected 200 or 412, got {response.status_code}")
            return response.status_code

    def _read(self, path: str) -> Optional[str]:
        with self.client.get(path, name="write doc", headers=self.auth, catch_response=True) as response:
            if response.status_code != 200 or not response.headers.get("ETag"):
                response.failure(f"expected 200 with an ETag, got {response.status_code}")
                return None
            return response.headers["ETag"]

    def _give_up(self, patching: bool) -> None:
        method = "PATCH" if patching else "PUT"
        self.environment.events.request.fire(
            request_type=method,
            name="write doc gave up",
            response_time=0,
            response_length=0,
            exception=RuntimeError(f"still 412 after {self.scenario.max_retries} retries"),
            context={},
        )

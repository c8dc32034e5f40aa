"""Readers: hot and cold documents, small and large, revalidated with ETags.

A reader remembers the ETag of each document it has read; with the
``--revalidate-share`` probability it asks for a known one again with
``If-None-Match`` and expects a 304. The request names say what was asked:
``doc small hot``, ``doc large cold``, ``doc small revalidate``, …
"""

from __future__ import annotations

import random
from typing import Dict

from _jetway import LARGE, SMALL, JetwayUser, pick
from locust import task


class ReaderUser(JetwayUser):
    weight_option = "reader_weight"

    def on_start(self) -> None:
        self.rng = random.Random()
        self.etags: Dict[str, str] = {}
        self.ids = {kind: self.scenario.ids(kind) for kind in (SMALL, LARGE)}

    @task
    def read(self) -> None:
        kind = LARGE if self.rng.random() < self.scenario.large_share else SMALL
        doc_id, hot = pick(self.rng, self.ids[kind], self.scenario.hot_docs, self.scenario.hot_share)
        path = f"/v1/{self.scenario.collection(kind)}/{doc_id}"
        etag = self.etags.get(path)
        if etag and self.rng.random() < self.scenario.revalidate_share:
            self._revalidate(path, etag, f"doc {kind} revalidate")
        else:
            self._read(path, f"doc {kind} {'hot' if hot else 'cold'}")

    def _read(self, path: str, name: str) -> None:
        with self.client.get(path, name=name, headers=self.auth, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"expected 200, got {response.status_code}")
            elif not response.headers.get("ETag"):
                response.failure("no ETag")
            else:
                self.etags[path] = response.headers["ETag"]

    def _revalidate(self, path: str, etag: str, name: str) -> None:
        headers = self.headers(**{"If-None-Match": etag})
        with self.client.get(path, name=name, headers=headers, catch_response=True) as response:
            if response.status_code == 200:
                self.etags[path] = response.headers.get("ETag", "")  # changed meanwhile: fine
            elif response.status_code != 304:
                response.failure(f"expected 304 or 200, got {response.status_code}")

"""Listers: pages of a collection followed by cursor, and multi-gets.

A lister either pages through the small documents (``list first page``,
then ``list next page`` while ``next`` is set, up to ``--max-pages``), or
asks for ``--multi-get`` random ids in one request (``multi-get``), or, for
``--multi-get-post-share`` of those, ``--multi-get-post`` ids in the body of
``POST /v1/_get/{coll}`` (``multi-get 500 in body``).
"""

from __future__ import annotations

import json
import random
from typing import Any
from urllib.parse import quote

from _jetway import SMALL, JetwayUser
from locust import task


class ListerUser(JetwayUser):
    weight_option = "lister_weight"

    def on_start(self) -> None:
        self.rng = random.Random()
        self.ids = self.scenario.ids(SMALL)
        self.base = f"/v1/{self.scenario.collection(SMALL)}"

    @task
    def visit(self) -> None:
        if self.rng.random() < self.scenario.multi_get_share:
            self.multi_get()
        else:
            self.page_through()

    def page_through(self) -> None:
        cursor = None
        for number in range(self.scenario.max_pages):
            path = f"{self.base}?limit={self.scenario.page_size}"
            if cursor:
                path += f"&cursor={quote(cursor)}"
            name = "list next page" if number else "list first page"
            with self.client.get(path, name=name, headers=self.auth, catch_response=True) as response:
                if response.status_code != 200:
                    response.failure(f"expected 200, got {response.status_code}")
                    return
                page = response.json()
                if not isinstance(page.get("items"), list) or not page["items"]:
                    response.failure("a page with no items")
                    return
                cursor = page.get("next")
            if not cursor:
                return

    def multi_get(self) -> None:
        if self.rng.random() < self.scenario.multi_get_post_share:
            self.multi_get_by_post()
            return
        count = min(self.scenario.multi_get, len(self.ids))
        wanted = self.rng.sample(self.ids, count)
        path = f"{self.base}?ids={','.join(wanted)}"
        with self.client.get(path, name="multi-get", headers=self.auth, catch_response=True) as response:
            self._check_items(response, count)

    def multi_get_by_post(self) -> None:
        """As many ids as asked (duplicates when there are fewer documents), in a body."""
        count = self.scenario.multi_get_post
        wanted = [self.rng.choice(self.ids) for _ in range(count)]
        path = f"/v1/_get/{self.scenario.collection(SMALL)}"
        name = f"multi-get {count} in body"
        headers = self.headers(**{"Content-Type": "application/json"})
        body = json.dumps({"ids": wanted})
        with self.client.post(path, data=body, name=name, headers=headers, catch_response=True) as response:
            self._check_items(response, count)

    def _check_items(self, response: Any, count: int) -> None:
        if response.status_code != 200:
            response.failure(f"expected 200, got {response.status_code}")
        elif len(response.json().get("items", ())) != count or None in response.json()["items"]:
            response.failure(f"expected {count} documents")

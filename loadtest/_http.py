"""One JSON request to a served Jetway, as the studies' set-up sends them: its status and body, errors included."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Optional, Tuple


def send(base: str, method: str, path: str, token: str, data: Optional[bytes] = None) -> Tuple[int, bytes]:
    """``method`` ``path`` with ``token`` as its bearer and ``data`` as its JSON body; an HTTP error's answer too."""
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()

"""Checks on what a request carries, before anything reaches Redis.

Each function takes plain values and either returns them in the form the
store wants or raises an ``ApiError`` that says what was wrong.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from cache.json import codec
from handlers.http.errors import ApiError, bad_request

COLLECTION_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,63}\Z")
ID_PATTERN = re.compile(r"[A-Za-z0-9._~-]{1,128}\Z")
MAX_TTL = 31_536_000
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
MAX_IDS = 1000
JSON = "application/json"
MERGE_PATCH_JSON = "application/merge-patch+json"
_ENTITY_TAG = re.compile(r'\s*(W/)?("[\x21\x23-\x7e\x80-\xff]*")\s*(?:,|\Z)')
# Valid collection names seen, encoded: a worker serves few collections, each many times.
MAX_KNOWN_COLLECTIONS = 4096
_COLLECTIONS: Dict[str, bytes] = {}
# An entity tag no stored ETag can equal: what a header with no usable tag becomes.
_NEVER_MATCHES = b"!"


def collection_name(text: str) -> bytes:
    known = _COLLECTIONS.get(text)
    if known is not None:
        return known  # checked before: a dictionary lookup, not the pattern and an encode per request
    if not COLLECTION_PATTERN.match(text):
        raise bad_request(f"collection name {text!r} must match ^[a-z][a-z0-9_-]{{0,63}}$", "invalid-collection")
    name = text.encode("ascii")
    if len(_COLLECTIONS) < MAX_KNOWN_COLLECTIONS:  # only valid names, and a bounded number of them
        _COLLECTIONS[text] = name
    return name


def admit_collection(text: str) -> Callable[[], None]:
    """Take ``text`` as a collection name, whatever the grammar, until the call returned is made.

    Only for the warm-up's scratch collection (``api.warm_up_scratch``), before the worker serves: a
    name the grammar refuses is one no client's data can be under."""
    _COLLECTIONS[text] = text.encode("ascii")
    return lambda: _COLLECTIONS.pop(text, None) and None


def document_id(text: str) -> bytes:
    if text.isalnum() and text.isascii() and len(text) <= 128:
        return text.encode("ascii")  # the usual id (letters and digits): no match object made per request
    if not ID_PATTERN.match(text) or text in (".", ".."):
        raise bad_request(
            f"document id {text!r} must match ^[A-Za-z0-9._~-]{{1,128}}$ and not be . or ..",
            "invalid-id",
        )
    return text.encode("ascii")


def json_document(body: bytes, content_type: Optional[str], media_type: str, max_body: int) -> Any:
    """Check the media type, size and syntax of a body; return it parsed."""
    require_media_type(content_type, media_type)
    if len(body) > max_body:
        raise ApiError(413, "body-too-large", f"the body is {len(body)} bytes; the limit is {max_body}")
    try:
        value = codec.loads(body)
    except codec.JsonError as error:
        raise bad_request(str(error), "malformed-json") from None
    if not isinstance(value, dict):
        raise bad_request("the body must be a JSON object", "not-an-object")
    return value


def require_media_type(content_type: Optional[str], expected: str) -> None:
    """Accept ``expected`` with at most a ``charset=utf-8`` parameter."""
    media, *params = [part.strip().lower() for part in (content_type or "").split(";")]
    charset_ok = all(param.replace(" ", "") in ("charset=utf-8", 'charset="utf-8"') for param in params)
    if media != expected or not charset_ok:
        raise ApiError(
            415,
            "unsupported-media-type",
            f"the body must be {expected} (charset=utf-8 allowed), not {content_type or 'unlabelled'}",
        )


def ttl(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    return _bounded_int("ttl", text, 1, MAX_TTL)


def limit(text: Optional[str]) -> int:
    if text is None:
        return DEFAULT_LIMIT
    return _bounded_int("limit", text, 1, MAX_LIMIT)


def _bounded_int(name: str, text: str, low: int, high: int) -> int:
    if not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
        raise bad_request(f"{name} must be a whole number from {low} to {high}, not {text!r}", f"invalid-{name}")
    return int(text)


def encode_cursor(doc_id: bytes) -> bytes:
    return base64.urlsafe_b64encode(doc_id).rstrip(b"=")


def decode_cursor(text: Optional[str]) -> Optional[bytes]:
    """The id a cursor continues after; any id is a valid place to resume."""
    if text is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        document_id(raw.decode("ascii"))
    except (binascii.Error, ValueError, ApiError):
        raise bad_request(f"cursor {text!r} is not one this API made", "invalid-cursor") from None
    return raw


def id_list(values: List[str], max_ids: int = MAX_IDS) -> List[bytes]:
    """The ids of ``?ids=a,b&ids=c``: comma-separated, repeated, or both, in order.

    Repeated parameters are what most generated clients and query-string
    libraries send for an array, whatever the document's ``explode: false``.
    """
    return _checked_ids([doc_id for value in values for doc_id in value.split(",")], max_ids)


def limit_beside_ids(text: Optional[str], count: int) -> None:
    """A ``limit`` sent with ``ids`` is ignored unless it would cut the answer.

    Clients that fill in every parameter send one with each multi-get; only a
    limit smaller than the number of ids contradicts the request.
    """
    if text is not None and limit(text) < count:
        raise bad_request(
            f"limit {text} is less than the {count} ids asked; a multi-get answers every id", "invalid-ids"
        )


def id_array(body: Any, max_ids: int = MAX_IDS) -> List[bytes]:
    """The ids of a multi-get body, ``{"ids": ["a", "b", ...]}`` and nothing else."""
    ids = body.get("ids")
    if set(body) != {"ids"} or not isinstance(ids, list):
        detail = 'the body must be {"ids": [...]}: an array of document ids, and no other member'
        raise bad_request(detail, "invalid-ids")
    for doc_id in ids:
        if not isinstance(doc_id, str):
            raise bad_request(f"every id must be a string, not {codec.dumps(doc_id)[:64].decode()}", "invalid-id")
    return _checked_ids(ids, max_ids)


def _checked_ids(ids: List[str], max_ids: int) -> List[bytes]:
    if len(ids) > max_ids:
        raise bad_request(f"at most {max_ids} ids may be asked at once, not {len(ids)}", "invalid-ids")
    return [document_id(doc_id) for doc_id in ids]


def entity_tags(header: Optional[str], weak: bool) -> bytes:
    """``If-Match`` / ``If-None-Match`` as the store wants them.

    ``b''`` for no header, ``b'*'``, or the tags joined by spaces. With
    ``weak`` (If-None-Match) a ``W/`` tag counts by its opaque part; without
    it (If-Match, strong comparison) a weak tag never matches.
    """
    if header is None:
        return b""
    if header.strip() == "*":
        return b"*"
    tags: List[Tuple[str, str]] = _ENTITY_TAG.findall(header)
    usable = [tag for prefix, tag in tags if weak or not prefix]
    return " ".join(usable).encode("latin-1") if usable else _NEVER_MATCHES


def wants_fresh(cache_control: Optional[str]) -> bool:
    """Whether a request's ``Cache-Control`` asks for a response from the source (RFC 9111 5.2.1):
    ``no-cache``, or ``max-age=0`` (what a browser's reload sends)."""
    if not cache_control:
        return False
    for directive in cache_control.lower().split(","):
        name, _, value = directive.strip().partition("=")
        if name == "no-cache" or (name == "max-age" and value.strip().strip('"') == "0"):
            return True
    return False

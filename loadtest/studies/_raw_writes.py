"""The pace at which Redis runs an import's own writes with no script around them: issue #60's import ceiling.

An import writes each document as a PUT does, inside ``WRITE_MANY``'s Lua:
the hash (body, ETag, Last-Modified) and the change feed's event, with the
id index's entry and the reads that keep them exact. Issue #60 measures an
import against "the rate at which Redis runs the same commands pipelined
without a script (the hash write and the feed event per document)": here,
per document, ``HSET <doc> b <body> e <etag> m <time>`` and
``XADD <shard's feed> MAXLEN ~ 6250 * o put i <id> e <etag>``, keys shaped
and sharded as Jetway's (``cache.keys``), sent by ``redis-cli --pipe`` as
one stream of commands, the replies read as they come.

``redis-benchmark -P 100 -t hset`` (the figure the study gave before) writes
a 3-byte value into one hash: no document, no event, so not this ceiling.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any, Callable, Dict, List, Sequence

from cache import keys
from loadtest import _data

# A shard's stream keeps the feed's default cap over 16 shards (JETWAY_FEED_MAX_EVENTS, cache.feed.streams).
STREAM_CAP = b"6250"
COLLECTION = b"rawceiling"


def resp(parts: Sequence[Any]) -> bytes:
    """One command in Redis's protocol, as ``redis-cli --pipe`` reads it (``_index_writes`` sends its scripts so)."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def commands(documents: int, size: int) -> bytes:
    """Each document's hash write and feed event as RESP, in one stream."""
    sent: List[bytes] = []
    modified = b"Tue, 01 Dec 2026 05:00:00 GMT"
    for number in range(documents):
        doc_id = b"d%09d" % number
        shard = keys.shard_of(doc_id)
        etag = b'"%016x"' % number
        body = _data.document(doc_id.decode(), size)
        sent.append(resp([b"HSET", keys.document_key(COLLECTION, doc_id), b"b", body, b"e", etag, b"m", modified]))
        event = [b"o", b"put", b"i", doc_id, b"e", etag]
        sent.append(resp([b"XADD", keys.feed_key(COLLECTION, shard), b"MAXLEN", b"~", STREAM_CAP, b"*", *event]))
    return b"".join(sent)


def ceiling(socket_path: str, documents: int, size: int, redis_cpu: Callable[[str], float]) -> Dict[str, float]:
    """Documents/s of wall time and Redis's CPU µs per document, for ``documents`` of ~``size`` bytes."""
    stream = commands(documents, size)
    cpu_before, started = redis_cpu(socket_path), time.monotonic()
    # redis-cli --pipe exits non-zero when Redis refused any command: then there is no rate to report.
    subprocess.run(["redis-cli", "-s", socket_path, "--pipe"], input=stream, capture_output=True, check=True)
    took, cpu = time.monotonic() - started, redis_cpu(socket_path) - cpu_before
    return {"documents/s": documents / took, "redis µs/document": cpu / documents * 1e6}

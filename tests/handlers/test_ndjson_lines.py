"""handlers.ndjson_lines: lines in groups from a body in any chunking, in linear time."""

from __future__ import annotations

import random
from typing import List, Optional

from handlers.http.body_stream import BodyStream
from handlers.ndjson_lines import Line, LineReader


def read_all(pieces: List[bytes], max_line: int, group: int = 3) -> tuple[List[Line], LineReader]:
    """Every line a reader gives, its stream fed ``pieces`` one read at a time."""
    stream = BodyStream(1 << 30)
    reader = LineReader(stream, max_line)
    lines: List[Line] = []
    pending = list(pieces)
    while not reader.ended:
        got = reader.group(group)
        while not got.called:
            if pending:
                stream.feed(pending.pop(0))
            else:
                stream.finish()
        lines += got.result
    return lines, reader


def chunked(body: bytes, sizes: random.Random) -> List[bytes]:
    pieces, at = [], 0
    while at < len(body):
        size = sizes.choice([1, 2, 3, 7, 50, 4096])
        pieces.append(body[at : at + size])
        at += size
    return pieces


def expected(body: bytes, max_line: int) -> List[Line]:
    found: List[Line] = []
    parts = body.split(b"\n")
    for number, line in enumerate(parts if not body.endswith(b"\n") else parts[:-1], 1):
        line = line[:-1] if line.endswith(b"\r") else line
        kept: Optional[bytes] = None if len(line) > max_line else line
        if kept is None or kept.strip(b" \t"):
            found.append((number, kept))
    return found


def test_any_chunking_gives_the_lines_of_one_piece():
    rng = random.Random(3)
    for _ in range(200):
        lines = [bytes(rng.choice(b"ab \r{}") for _ in range(rng.choice([0, 1, 5, 20, 40]))) for _ in range(12)]
        body = b"\n".join(lines) + rng.choice([b"", b"\n", b"\r\n"])
        whole, _ = read_all([body], 16)
        assert whole == expected(body, 16)
        assert read_all(chunked(body, rng), 16)[0] == whole


def test_a_line_too_long_is_given_as_none_and_the_rest_of_it_skipped():
    body = b'{"a":1}\n' + b"x" * 100 + b'\n{"b":2}\n'
    lines, _ = read_all([body[i : i + 3] for i in range(0, len(body), 3)], 20)
    assert lines == [(1, b'{"a":1}'), (2, None), (3, b'{"b":2}')]


def test_a_long_line_in_small_pieces_is_searched_once_not_once_per_piece():
    """Linear: a 1 MB line in 50-byte pieces is searched for its newline about once (it was once per piece)."""
    line = b'{"pad":"' + b"x" * 1_000_000 + b'"}\n'
    pieces = [line[i : i + 50] for i in range(0, len(line), 50)]
    lines, reader = read_all(pieces, 2_000_000, group=100)
    assert lines == [(1, line[:-1])]
    assert reader.scanned_bytes <= 2 * len(line)

"""cache.json.spans: each operation's document found as its exact bytes in a batch's body, whatever they hold."""

from __future__ import annotations

import json
import random
from typing import Any, List, Optional

import pytest

from cache.json import codec
from cache.json import spans as json_spans
from cache.json.spans import element_member_spans

# Characters that a walk by brackets and quotes could trip over, and some that are not ASCII.
TRICKY = ['"', "\\", "{", "}", "[", "]", ",", ":", " ", "\n", "é", "\u2028", "😀", "\x01", "a", "/"]


@pytest.fixture(autouse=True, params=["walk_bytes", "search_structure"])
def skipper(request, monkeypatch):
    """Every test with both ways of skipping a container: PyPy's loop over bytes, and CPython's search."""
    monkeypatch.setattr(json_spans, "_skip_container", getattr(json_spans, "_" + request.param))


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(["object", "array", "string", "number", "literal"] if depth < 4 else ["string", "number"])
    if kind == "object":
        return {random_string(rng): random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}
    if kind == "array":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    if kind == "string":
        return random_string(rng)
    if kind == "number":
        return rng.choice([0, -1, 12345678901234567890, 2.5, -1e-7])
    return rng.choice([True, False, None])


def random_string(rng: random.Random) -> str:
    return "".join(rng.choice(TRICKY) for _ in range(rng.randint(0, 12)))


def random_text(rng: random.Random, value: Any) -> bytes:
    """``value`` as JSON in one of the ways a client may write it: spaced or not, escaped or not, indented."""
    options = rng.choice(
        [
            {"separators": (",", ":")},
            {"separators": (" , ", " : "), "ensure_ascii": False},
            {"indent": 1},
            {"indent": "\t", "ensure_ascii": False},
        ]
    )
    return json.dumps(value, **options).encode()


def spans_of(body: bytes) -> List[Optional[bytes]]:
    codec.loads(body)  # what the handler has done first: the walk takes only what the strict reader passed
    spans = element_member_spans(body, "operations", "document")
    return [None if span is None else body[span[0] : span[1]] for span in spans]


def test_each_document_is_its_exact_bytes_for_random_documents_written_any_way():
    rng = random.Random(46)
    for _ in range(300):
        documents = [random_text(rng, {"d": random_value(rng)}) if rng.random() < 0.8 else None for _ in range(6)]
        operations = []
        for document in documents:
            members = [b'"op" : "put"', b'"id":"x"', b'"patch":{"document":[1,{"document":2}]}']
            if document is not None:
                members.insert(rng.randint(0, len(members)), b'"document" :\n ' + document)
            operations.append(b"{ " + b" ,".join(members) + b" }")
        body = b'\n{ "operations" : [ ' + b",\n".join(operations) + b" ] }\n"
        assert spans_of(body) == documents


def test_elements_that_are_not_objects_or_have_no_document():
    body = b'{"operations":[1,"document",[{"document":{}}],{},{"op":"get"},null,{"document":{ }}]}'
    assert spans_of(body) == [None, None, None, None, None, None, b"{ }"]


def test_a_name_written_with_escapes_is_the_name_it_means():
    body = b'{"oper\\u0061tions":[{"docum\\u0065nt":{"a":1},"document\\"":{"b":2}}]}'
    assert spans_of(body) == [b'{"a":1}']


def test_the_operations_member_need_not_come_first():
    body = b'{"x":{"operations":[{"document":{"no":1}}]},"operations":[{"document":{"yes":1}}],"y":[]}'
    assert spans_of(body) == [b'{"yes":1}']


def test_strings_past_what_one_match_takes_many_escapes_and_many_strings():
    escaped = '"' + '\\\\\\"' * 100 + "}]" * 5 + '"'  # 200 escapes, brackets inside the string
    many = "[" + ",".join(['"s\\"}"'] * 1000) + "]"
    document = '{"a":' + escaped + ',"b":' + many + ',"c":"\\\\","d":{}}'
    body = ('{"operations":[{"document":' + document + '},{"document":{"e":"\\\\\\\\"}}]}').encode()
    assert spans_of(body) == [document.encode(), b'{"e":"\\\\\\\\"}']


def test_a_large_flat_array_of_strings_is_walked_to_its_end():
    document = b'{"a":[' + b",".join([b'""'] * 200_000) + b'],"b":"end"}'
    body = b'{"operations":[{"document":' + document + b'},{"document":{}}]}'
    assert spans_of(body) == [document, b"{}"]


def test_no_operations_member_or_an_empty_one():
    assert spans_of(b"{}") == []
    assert spans_of(b'{"operations":[]}') == []
    assert spans_of(b'{"operations":{"document":{}}}') == []

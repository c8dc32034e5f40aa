"""cache.json.codec: strict RFC 8259 parsing, compact serialization."""

import contextlib
import random

import pytest

from cache.json import codec


@pytest.mark.parametrize("text", [b"NaN", b'{"a":Infinity}', b'{"a":-Infinity}', b"{'a':1}", b'{"a":1,}', b""])
def test_rejects_what_rfc_8259_does_not_allow(text):
    with pytest.raises(codec.JsonError):
        codec.loads(text)


def test_rejects_invalid_utf8_and_a_byte_order_mark():
    with pytest.raises(codec.JsonError, match="UTF-8"):
        codec.loads(b'{"a":"\xff"}')
    with pytest.raises(codec.JsonError):
        codec.loads(b'\xef\xbb\xbf{"a":1}')


def test_parses_big_numbers_exactly():
    assert codec.loads(b'{"n":123456789012345678901234567890}') == {"n": 123456789012345678901234567890}


def test_dumps_is_compact_utf8_without_escaped_slashes():
    assert codec.dumps({"a": "é/", "b": [1, 2.5, None, True]}) == '{"a":"é/","b":[1,2.5,null,true]}'.encode()


def test_dumps_refuses_non_finite_numbers():
    with pytest.raises(codec.JsonError):
        codec.dumps({"a": float("inf")})


# Texts where PyPy's hookless parser and the strict one could part: non-finite
# numbers, hidden deep inside, and malformed texts each refuses in its words.
EDGE_TEXTS = [
    b'{"a":[1,{"b":[2.5,NaN]}]}',
    b'{"a":{"b":{"c":1e400}}}',
    b"[-1e400]",
    b'{"a":1e-400}',
    b'{"a":-0.0,"b":1E+2,"c":2.5e-3}',
    b'{"a":"\\ud834\\udd1e","b":"\\u00e9"}',
    b'{"a":"\t"}',
    b'{"a":"\\x"}',
    b"[1,]",
    b'{"a" 1}',
    b"tru",
    b"-",
    b"1.",
    b".5",
    b"01",
    b'{"a":1} x',
    b"[" * 100_000,
]


@pytest.mark.parametrize("text", EDGE_TEXTS, ids=lambda text: text[:30].decode())
def test_parsing_agrees_with_the_strict_parser(text):
    """``loads`` (on PyPy: hookless first) returns what the strict parser returns, or refuses what it refuses.

    (Their words may differ: the grammar names the first error, where the
    hooked parser may first run out of stack.)
    """
    try:
        expected = ("value", codec._strict_loads(text.decode()))
    except codec.JsonError:
        expected = ("error",)
    try:
        got = ("value", codec.loads(text))
    except codec.JsonError:
        got = ("error",)
    assert got == expected


def test_non_finite_numbers_are_refused_with_what_they_are():
    with pytest.raises(codec.JsonError, match="NaN is not a JSON value"):
        codec.loads(b'{"a":[1,{"b":NaN}]}')
    with pytest.raises(codec.JsonError, match="1e400 is out of range"):
        codec.loads(b'{"a":{"b":1e400}}')


# I-JSON (RFC 7493): names repeated at any depth, however escaped, and lone
# surrogates, high or low, in values or names.
DUPLICATES = [
    (b'{"a":1,"a":2}', "a"),
    (b'{"x":{"b":1,"c":{"d":[{"e":1,"e":1}]}}}', "e"),
    (b'{"a":1,"\\u0061":2}', "a"),
    (b'[{"k":"v:w","k":"z"}]', "k"),
    (b'{"":1,"":2}', ""),
]


@pytest.mark.parametrize(("text", "name"), DUPLICATES)
def test_refuses_a_repeated_member_name_and_names_it(text, name):
    with pytest.raises(codec.JsonError, match=f"duplicate member name {name!r}"):
        codec.loads(text)


LONE_SURROGATES = [
    b'{"a":"\\ud800"}',
    b'{"a":"x\\uDFFFy"}',
    b'{"\\udbff":1}',
    b'{"a":["\\ude00\\ud83d"]}',  # a low then a high: not a pair
    b'{"a":"\\ud83d\\u0041"}',
]


@pytest.mark.parametrize("text", LONE_SURROGATES)
def test_refuses_a_lone_surrogate(text):
    with pytest.raises(codec.JsonError, match="lone surrogate"):
        codec.loads(text)


ACCEPTED = [
    (b'{"a":"\\ud83d\\ude00"}', {"a": "\U0001f600"}),
    (b'{"a":"\\\\ud800"}', {"a": "\\ud800"}),  # an escaped backslash, then text
    (b'{"t":"12:30","u":"http://x/y","q":"\\":","n":{"a":":"},"a:b":1}', None),
    (b'{"a":"\\"","b":"\\\\","c":{"a":1},"d":[{"a":1},{"a":2}]}', None),
    ('{"ünï":"çödé:"}'.encode(), {"ünï": "çödé:"}),
]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED)
def test_accepts_pairs_and_names_that_only_look_alike(text, expected):
    value = codec.loads(text)
    if expected is not None:
        assert value == expected


def test_a_colon_written_as_an_escape_does_not_hide_a_repeated_name():
    with pytest.raises(codec.JsonError, match="duplicate member name 'a'"):
        codec.loads(b'{"a":1,"a":2,"\\u003a":3}')
    assert codec.loads(b'{"\\u003A":"\\u003a:"}') == {":": "::"}


# What the stdlib's pure-Python decoder (PyPy's path for a body its fast
# parser refused) took or answered 500 for: int(…, 16) reads a \u escape,
# and its number pattern's \d matches any Unicode digit.
LAX_DECODER_TEXTS = [
    '{"a":"\\u 123"}',
    '{"a":"\\u+123"}',
    '{"a":"\\u1_23"}',
    '{"a":"\\u-123"}',
    '{"a":"\\uD\uff1800"}',
    '{"a":"\\u\u0661\u0662\u0663\u0664"}',
    '{"a":1\u0661}',
    '{"a":1e\u0665}',
    '{"a":1.\u0665}',
    '{"a":-\u0665}',
    '{"\\u 123":1}',
]


@pytest.mark.parametrize("text", LAX_DECODER_TEXTS)
def test_refuses_escapes_and_digits_that_are_not_ascii_hex_or_ascii(text):
    with pytest.raises(codec.JsonError, match="malformed JSON"):
        codec.loads(text.encode())


def test_an_integer_too_long_to_convert_is_refused_not_an_error_of_the_server():
    with pytest.raises(codec.JsonError, match="an integer has more than 4300 digits"):
        codec.loads(b'{"a":' + b"1" * 4301 + b"}")
    with pytest.raises(codec.JsonError, match="more than 4300 digits"):
        codec.loads(b'{"a":[1,{"b":-' + b"9" * 10_000 + b"}]}")
    assert codec.loads(b'{"a":' + b"1" * 4300 + b"}") == {"a": int("1" * 4300)}
    # A float of any length converts (rounded): kept.
    assert codec.loads(b'{"a":0.' + b"1" * 10_000 + b"}") == {"a": 0.1111111111111111}


def test_a_valid_text_too_deep_for_the_stack_is_refused_as_too_deep():
    with pytest.raises(codec.JsonError, match="nested too deeply"):
        codec.loads(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def test_a_lone_surrogate_behind_a_fullwidth_digit_is_not_a_way_past_i_json():
    with pytest.raises(codec.JsonError, match="invalid escape"):
        codec.loads('{"a":"\\uD\uff1800"}'.encode())
    with pytest.raises(codec.JsonError, match="lone surrogate"):
        codec.loads(b'{"a":"\\uD800"}')


def test_loads_raises_nothing_but_json_error():
    """10,000 mutations of valid texts with characters lax parsers take: each is a value or a JsonError."""
    chooser = random.Random(5)
    alphabet = [*'0123456789-+._eEuU"\\:,{}[] \t\u00a0\u0661\uff18\x00', "\\u", "\\uD800", "NaN", "1e400", "9" * 4400]
    seed = '{"a":"x\\u00e9","b":[1,-2.5e+3,true,null],"c":{"d":"\\ud83d\\ude00"}}'
    for _ in range(10_000):
        text = seed
        for _ in range(chooser.randint(1, 3)):
            at = chooser.randrange(len(text) + 1)
            text = text[:at] + chooser.choice(alphabet) + text[at + chooser.choice((0, 1)) :]
        with contextlib.suppress(codec.JsonError):
            codec.loads(text.encode())

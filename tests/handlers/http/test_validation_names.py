"""handlers.http.validation: a document id is accepted exactly when its pattern says so, by either way of checking."""

from __future__ import annotations

import random

import pytest

from handlers.http import validation
from handlers.http.errors import ApiError

_SAMPLES = [
    "u1",
    "a" * 128,
    "a" * 129,
    ".",
    "..",
    "...",
    "a.b",
    "a~b-c_d",
    "",
    "²",
    "٣",
    "é",
    "\uff41",
    "a b",
    "a/b",
    "Ω1",
]


def _accepted(text: str) -> bool:
    try:
        return validation.document_id(text) == text.encode("ascii")
    except ApiError as error:
        assert error.status_code == 400 and error.problem == "invalid-id"
        return False


def test_an_id_is_accepted_exactly_when_the_pattern_matches_it_and_it_is_not_a_dot_path():
    rng = random.Random(7)
    alphabet = "aZ09._~-/ %²٣é\uff41"
    texts = _SAMPLES + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(5000)]
    for text in texts:
        expected = validation.ID_PATTERN.match(text) is not None and text not in (".", "..")
        assert _accepted(text) is expected, repr(text)


@pytest.mark.parametrize("text", ["²", "٣", "\uff41", "a" * 129])
def test_letters_and_digits_outside_ascii_or_too_many_are_refused(text):
    assert not _accepted(text)

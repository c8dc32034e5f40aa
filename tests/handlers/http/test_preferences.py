"""``Prefer`` read as RFC 7240 and PostgREST read it: the count asked, the rest ignored unless handling=strict."""

from __future__ import annotations

import pytest

from handlers.http.errors import ApiError
from handlers.http.preferences import count_asked


@pytest.mark.parametrize(
    "header,count",
    [
        ("count=exact", "exact"),
        ("count=estimated", "estimated"),
        ("COUNT=Exact", "exact"),
        ('count="exact"', "exact"),
        ("return=minimal, count=exact;x=1", "exact"),
        ("foo,count=estimated", "estimated"),  # two Prefer headers, joined by a comma
        ("count=exact, count=estimated", "exact"),  # the first of a repeated preference
        ("count=planned", None),
        ("count=nonsense", None),
        ("count", None),
        ("handling=lenient, foo", None),
        ("", None),
        (" , ,", None),
    ],
)
def test_the_count_asked_and_the_rest_ignored(header: str, count: str) -> None:
    assert count_asked(header) == count


@pytest.mark.parametrize("header", ["handling=strict, count=planned", "count=exact, handling=strict, foo=1"])
def test_strict_handling_refuses_what_would_be_ignored_naming_it(header: str) -> None:
    with pytest.raises(ApiError) as raised:
        count_asked(header)
    assert raised.value.status_code == 400 and raised.value.problem == "invalid-preference"
    assert header.split(", ")[-1] in raised.value.detail


def test_strict_handling_with_only_a_count_is_that_count() -> None:
    assert count_asked("handling=strict, count=exact") == "exact"

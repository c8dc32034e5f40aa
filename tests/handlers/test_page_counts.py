"""A page's ``Content-Range`` from its count: PostgREST's form, and always inside its total."""

from __future__ import annotations

from cache.indexes.counts import Count
from handlers.page_counts import content_range


def test_a_page_is_its_first_and_last_positions_over_the_total() -> None:
    assert content_range(Count(3573, 0), 20) == "0-19/3573"
    assert content_range(Count(3573, 20), 20) == "20-39/3573"
    assert content_range(Count(3573, 3570), 3) == "3570-3572/3573"


def test_an_empty_page_is_a_star_over_the_total() -> None:
    assert content_range(Count(0, 0), 0) == "*/0"
    assert content_range(Count(3573, 3573), 0) == "*/3573"


def test_a_count_that_writes_overtook_is_kept_around_the_page() -> None:
    """The count and the page are two scripts: a range outside its total is lowered, a total below the page's
    own documents raised to them."""
    assert content_range(Count(10, 9), 3) == "7-9/10"
    assert content_range(Count(2, 0), 3) == "0-2/3"

"""cache.read_size: the read size follows what reads bring, within its bounds."""

from cache.read_size import MAX_READ, MIN_READ, next_read_size


def test_a_full_read_doubles_the_size_up_to_the_maximum():
    assert next_read_size(MIN_READ, MIN_READ) == 2 * MIN_READ
    assert next_read_size(MAX_READ, MAX_READ) == MAX_READ


def test_a_read_under_a_quarter_halves_it_down_to_the_minimum():
    assert next_read_size(4 * MIN_READ, MIN_READ - 1) == 2 * MIN_READ
    assert next_read_size(MIN_READ, 10) == MIN_READ


def test_a_read_between_a_quarter_and_full_keeps_it():
    assert next_read_size(4 * MIN_READ, MIN_READ) == 4 * MIN_READ
    assert next_read_size(4 * MIN_READ, 4 * MIN_READ - 1) == 4 * MIN_READ

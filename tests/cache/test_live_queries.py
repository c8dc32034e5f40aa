"""``cache.indexes.queries.within``, what a live query judges by, against Redis's own ``ZRANGEBYLEX``."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

entries = st.lists(st.binary(min_size=1, max_size=6), min_size=1, max_size=20, unique=True)
bounds = st.one_of(
    st.sampled_from([b"-", b"+"]),
    st.builds(lambda kind, value: kind + value, st.sampled_from([b"[", b"("]), st.binary(max_size=6)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(members=entries, low=bounds, high=bounds)
def test_within_is_what_zrangebylex_lists(redis_client, members, low, high) -> None:
    from cache.indexes.queries import within

    redis_client.delete(b"lex")  # the fixture flushes once per test, not per example
    redis_client.zadd(b"lex", {member: 0 for member in members})
    listed = set(redis_client.zrangebylex(b"lex", low, high))
    assert {member for member in members if within(member, low, high)} == listed


marks = st.lists(
    st.tuples(st.sampled_from([b"x:i:1", b"w:i:1", b"x:j:1", b"w:j:1"]), st.binary(max_size=6)), max_size=4
)


@settings(max_examples=100, deadline=None)
@given(
    queries=st.lists(
        st.tuples(st.sampled_from([b"i", b"j"]), st.lists(st.tuples(bounds, bounds), min_size=1, max_size=3)),
        min_size=1,
        max_size=30,
    ),
    events=st.lists(marks, min_size=1, max_size=10),
)
def test_the_index_of_many_live_queries_judges_as_each_query_alone(queries, events) -> None:
    """``LiveIndex`` only narrows: an event's judgements are those of every query judged one by one (a query of
    several ranges, an ``in``'s, judged once)."""
    from cache.feed.live_queries import LiveIndex, LiveQuery
    from cache.feed.streams import Event

    live = [LiveQuery(b"x:%s:1" % name, b"w:%s:1" % name, tuple(ranges)) for name, ranges in queries]
    index = LiveIndex(live)
    for n, event_marks in enumerate(events):
        event = Event(0, (n, 0), b"put", b"d", b'"e"', tuple(event_marks))
        alone = {query: query.judge(event) for query in live}
        assert index.judge(event) == {query: matches for query, matches in alone.items() if matches is not None}


def test_an_event_is_judged_against_the_queries_its_entries_can_be_in_not_every_query() -> None:
    """2,000 distinct equality filters: an event is judged exactly by the one or two whose range holds an entry."""
    from cache.feed.live_queries import LiveIndex, LiveQuery
    from cache.feed.streams import Event

    judged = []

    class Counted(LiveQuery):
        def judge(self, event: Event):
            judged.append(self)
            return super().judge(event)

    live = [Counted(b"x:k:1", b"w:k:1", ((b"[v%04d\0\0" % n, b"(v%04d\0\1" % n),)) for n in range(2000)]
    live.append(Counted(b"x:k:1", b"w:k:1", ((b"-", b"+"),)))  # one wide range: it does not widen the others
    index = LiveIndex(live)
    event = Event(0, (1, 0), b"put", b"d", b'"e"', ((b"x:k:1", b"v0042\0\0d"), (b"w:k:1", b"v1999\0\0d")))
    assert index.judge(event) == {live[42]: True, live[1999]: False, live[2000]: True}
    assert len(judged) == 3

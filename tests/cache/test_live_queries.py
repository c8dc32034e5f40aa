"""``cache.index_queries.within``, what a live query judges by, against Redis's own ``ZRANGEBYLEX``."""

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
    from cache.index_queries import within

    redis_client.delete(b"lex")  # the fixture flushes once per test, not per example
    redis_client.zadd(b"lex", {member: 0 for member in members})
    listed = set(redis_client.zrangebylex(b"lex", low, high))
    assert {member for member in members if within(member, low, high)} == listed

"""handlers.http.deferreds: is_deferred agrees with isinstance, without asking the ABC."""

from __future__ import annotations

from twisted.internet import defer

from handlers.http.deferreds import is_deferred


class OwnDeferred(defer.Deferred):
    pass


def test_a_deferred_of_any_kind_is_one_and_nothing_else_is():
    deferreds = [defer.Deferred(), defer.succeed(1), OwnDeferred(), defer.DeferredList([])]
    others = [None, 0, "x", b"x", [], {}, object(), defer.Deferred]  # the class is no Deferred
    assert all(is_deferred(value) for value in deferreds)
    assert not any(is_deferred(value) for value in others)
    assert [is_deferred(value) for value in deferreds + others] == [
        isinstance(value, defer.Deferred) for value in deferreds + others
    ]

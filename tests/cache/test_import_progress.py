"""documents.import_progress on a real redis-server, in a reactor: a lease renewed while its import lives, released only
by its owner, and a plan that gives each line the same ETag and id on every attempt."""

from __future__ import annotations

from cache.documents.import_progress import Plan
from tests.cache.test_tracking import run_script

LEASES = """
from cache.documents.import_progress import (
    LEASE_SECONDS,
    MARGIN_SECONDS,
    RENEW_SECONDS,
    ImportProgress,
    LeaseLost,
    import_key,
)

async def settle(reactor):
    await task.deferLater(reactor, 0.05, lambda: None)

def pttl(path, key):
    return int(redis(path, b"PTTL", key)[1:].split(b"\\r")[0])

async def run(reactor, path):
    link = RedisLink(parse_redis_url("unix://" + path), reactor, 5.0)
    progress = ImportProgress(link)
    clock = task.Clock()
    busy = import_key(b"t", b"c", "k") + b":busy"
    first = await progress.claim(b"t", b"c", "k", clock)
    second = await progress.claim(b"t", b"c", "k", clock)
    redis(path, b"PEXPIRE", busy, b"200")
    clock.advance(RENEW_SECONDS)  # the timer renews it, with no group written meanwhile
    await settle(reactor)
    renewed = pttl(path, busy)
    await first.lease.record(150)
    redis(path, b"SET", busy, b"someone-else")  # the lease ran out and another import took it
    try:
        await first.lease.record(250)
        lost_on_record = False
    except LeaseLost:
        lost_on_record = True
    try:
        first.lease.check()
        stopped = False
    except LeaseLost:
        stopped = True
    await first.lease.release()
    other_kept = redis(path, b"GET", busy)
    redis(path, b"DEL", busy)
    third = await progress.claim(b"t", b"c", "k", clock)
    silent = third.lease
    redis(path, b"SET", busy, silent._owner)
    clock.advance(LEASE_SECONDS - MARGIN_SECONDS - 0.01)
    await settle(reactor)
    alive = True
    try:
        silent.check()
    except LeaseLost:
        alive = False
    await link.close()  # renewals now fail: the lease must stop the import before it can run out
    clock.advance(LEASE_SECONDS)
    await settle(reactor)
    try:
        silent.check()
        stopped_unrenewed = False
    except LeaseLost:
        stopped_unrenewed = True
    silent.release()
    out(first=first.lease is not None, second=second.lease is not None, busy_for=second.busy_for, renewed=renewed,
        lost_on_record=lost_on_record, stopped=stopped, other_kept=other_kept.decode(), resumed_after=third.last_line,
        same_since=third.since_ms == first.since_ms, alive=alive, stopped_unrenewed=stopped_unrenewed)
"""


def test_a_lease_is_renewed_while_its_import_lives_and_never_freed_by_another(own_redis):
    figures = run_script(own_redis, LEASES)
    assert (figures["first"], figures["second"]) == (True, False)  # a second import under the key is refused
    assert 0 < figures["busy_for"] <= 15
    assert figures["renewed"] > 10_000  # the timer renewed a lease that had 200 ms left
    assert figures["lost_on_record"] and figures["stopped"]  # a lost lease records nothing and writes no more
    assert figures["other_kept"].startswith("$12\r\nsomeone-else")  # its release left the other's lease alone
    assert figures["resumed_after"] == 150 and figures["same_since"]
    assert figures["alive"] and figures["stopped_unrenewed"]


def test_a_plan_gives_a_line_the_same_etag_and_id_each_time_and_ids_sort_by_line():
    plan = Plan.of(b"digest", b"coll", "key-1", 1_700_000_000_000)
    again = Plan.of(b"digest", b"coll", "key-1", 1_700_000_000_000)
    other = Plan.of(b"digest", b"coll", "key-2", 1_700_000_000_000)
    assert plan.etag(7) == again.etag(7) != other.etag(7)
    assert plan.etag(7) != plan.etag(8)
    ids = [plan.new_id(line) for line in (1, 2, 10, 255, 1000, 2**39)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) and all(len(i) == 26 for i in ids)
    assert plan.new_id(5) == again.new_id(5) != other.new_id(5)
    later = Plan.of(b"digest", b"coll", "key-1", 1_700_086_400_000)  # the key again, once its records expired
    assert later.etag(7) != plan.etag(7) and later.new_id(7) != plan.new_id(7)

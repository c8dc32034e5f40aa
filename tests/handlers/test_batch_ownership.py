"""``handlers.batch_ownership``: a bound caller's batch writes pinned to the versions its pre-read judged.

The race a single request's pin closes, held still: the documents are read
and the writes pinned (``pin_writes``), then someone else writes each of
them (a service reassigning it), then the batch runs. Each write is a 412,
and every document is as the other writer left it. On a real redis-server,
in a script (``tests.cache.test_batch_hot_cache.run_script``).
"""

from __future__ import annotations

from tests.cache.test_batch_hot_cache import run_script


def test_a_document_written_by_another_between_the_read_and_the_write_makes_that_write_a_412(own_redis):
    figures = run_script(
        own_redis,
        """
        from cache.collection_settings import parse_settings
        from cache.documents.write_plan import patch_planner
        from handlers.batch_ownership import judged, pin_writes

        async def run(reactor, path):
            link = RedisLink(parse_redis_url("unix://" + path), reactor, 5.0)
            store = DocumentStore(link)
            runner = BatchRunner(store, link, PRIMARY_ONLY)
            rules = parse_settings("notes", b'{"owner": {"pointer": "/owner"}}', b'"s"')
            owners = {b"notes": (rules, "alice")}
            for name in (b"a", b"b", b"c"):
                await store.put(b"notes", name, b'{"owner":"alice","v":1}')
            operations = [
                Operation("put", b"notes", b"a", b'{"owner":"alice","v":2}', etag=b'"p1"'),
                Operation("patch", b"notes", b"b", patch={"v": 2}, etag=b'"p2"', planner=patch_planner(rules, b"b")),
                Operation("delete", b"notes", b"c", etag=b'"p3"'),
                Operation("put", b"notes", b"d", b'{"owner":"alice","v":2}', etag=b'"p4"'),
            ]
            pinned = await pin_writes(runner, operations, owners, 1 << 20, 1 << 24)
            for name in (b"a", b"b", b"c", b"d"):  # a service gives each to bob meanwhile
                await store.put(b"notes", name, b'{"owner":"bob","v":9}')
            results = list(judged(await runner.run(pinned), owners))
            stored = [(await store.get(b"notes", name, fresh=True)).body.decode() for name in (b"a", b"b", b"c", b"d")]
            out(errors=[type(result.error).__name__ for result in results], stored=stored)
        """,
    )
    assert figures["errors"] == ["PreconditionFailed"] * 4
    assert figures["stored"] == ['{"owner":"bob","v":9}'] * 4

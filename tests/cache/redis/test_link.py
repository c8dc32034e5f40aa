"""cache.redis.link and cache.redis.resp on a real Redis: batches, replies in order, the per-connection deadline.

The link runs in a Twisted reactor, so each test runs a short script in the
app's interpreter against the suite's redis-server and checks what it printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any, Dict

import pytest

from tests.support import ROOT

PRELUDE = """
import json, socket, sys, time
from twisted.internet import defer, task
from cache.redis.address import parse_redis_url
from cache.errors import RedisReplyError, RedisTimeout
from cache.redis.link import RedisLink

def out(**figures):
    print(json.dumps(figures), flush=True)

def pause_redis(path, milliseconds):
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(path)
        raw.sendall(b"CLIENT PAUSE %d ALL\\r\\n" % milliseconds)
        assert raw.recv(64).startswith(b"+OK")

async def pool_up(reactor, link, size=4):
    while len(link._factory.pool) < size:
        await task.deferLater(reactor, 0.05, lambda: None)

def main(reactor, url, path):
    return defer.ensureDeferred(run(reactor, RedisLink(parse_redis_url(url), reactor, TIMEOUT), path))
"""


def run_script(redis_server: Any, body: str, workers_reactor: bool = False) -> Dict[str, Any]:
    """``body`` run after PRELUDE; ``workers_reactor``: on the workers' reactor (``api.event_loop``), not Twisted's."""
    install = "from api import event_loop; event_loop.install()\n" if workers_reactor else ""
    code = install + PRELUDE + textwrap.dedent(body) + "\ntask.react(main, [sys.argv[1], sys.argv[2]])\n"
    result = subprocess.run(
        [sys.executable, "-c", code, redis_server.url, redis_server.socket_path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_batch_answers_in_order_and_an_error_reply_is_the_batchs_or_its_commands(redis_server, redis_client):
    figures = run_script(
        redis_server,
        """
        TIMEOUT = 2.0
        async def run(reactor, link, path):
            replies = await link.pipeline([(b"SET", b"k", b"1"), (b"INCR", b"k"), (b"GET", b"k"), (b"GET", b"none")])
            bad = [(b"SET", b"s", b"x"), (b"HGET", b"s", b"f"), (b"GET", b"s")]
            try:
                await link.pipeline(bad)
                failed = None
            except RedisReplyError as error:
                failed = str(error)
            outcomes = await link.send_each(bad)
            empty = await link.pipeline([])
            after_empty = await link.execute(b"GET", b"k")
            await link.close()
            out(replies=[r.decode() if isinstance(r, bytes) else r for r in replies], failed=failed,
                outcomes=[[ok, value.decode() if isinstance(value, bytes) else type(value).__name__]
                          for ok, value in outcomes], empty=empty, after_empty=after_empty.decode())
        """,
    )
    assert figures["replies"] == ["OK", 2, "2", None]
    assert figures["failed"].startswith("WRONGTYPE")
    assert figures["outcomes"] == [[True, "str"], [False, "RedisReplyError"], [True, "x"]]
    assert (figures["empty"], figures["after_empty"]) == ([], "2")  # an empty batch takes no reply


def test_scripts_redis_lacks_are_loaded_and_the_batch_sent_again_other_errors_are_the_callers(
    redis_server, redis_client
):
    redis_client.script_flush()
    figures = run_script(
        redis_server,
        """
        from cache.redis.script import Script
        TIMEOUT = 2.0
        async def run(reactor, link, path):
            echo = Script(b"return ARGV[1]")
            fails = Script(b"return redis.error_reply('ERR refused by the script')")
            replies = await link.pipeline_scripts([(b"SET", b"k", b"v"), echo.call([], [b"hi"])], [echo])
            try:
                await link.pipeline_scripts([fails.call([], [])], [fails])
                error = None
            except RedisReplyError as failure:
                error = str(failure)
            await link.close()
            out(replies=[r if isinstance(r, str) else r.decode() for r in replies], error=error)
        """,
    )
    assert figures["replies"] == ["OK", "hi"]  # NOSCRIPT, then loaded and sent again
    assert "refused by the script" in figures["error"]


def test_many_commands_in_flight_share_one_deadline_timer_per_connection(redis_server, redis_client):
    figures = run_script(
        redis_server,
        """
        TIMEOUT = 2.0
        async def run(reactor, link, path):
            await link.execute(b"PING")  # the pool is up
            for n in range(300):
                await link.execute(b"SET", b"key:%d" % n, b"%d" % n)
            pending = [link.execute(b"GET", b"key:%d" % n) for n in range(300)]
            timers = len(reactor.getDelayedCalls())
            replies = await defer.gatherResults(pending)
            await link.close()
            out(timers=timers, right=sum(r == b"%d" % n for n, r in enumerate(replies)))
        """,
    )
    assert figures["right"] == 300
    # txredisapi set a timer per command (300 here); a connection keeps one.
    assert figures["timers"] <= 10, figures


def test_a_reply_overdue_fails_its_batch_with_a_timeout_then_the_link_serves_again(redis_server, redis_client):
    figures = run_script(
        redis_server,
        """
        TIMEOUT = 0.5
        async def run(reactor, link, path):
            await link.execute(b"SET", b"k", b"v")
            pause_redis(path, 1500)
            started = time.monotonic()
            try:
                await link.execute(b"GET", b"k")
                outcome = "answered"
            except RedisTimeout:
                outcome = "timeout"
            waited = time.monotonic() - started
            await task.deferLater(reactor, 1.5, lambda: None)  # the pause is over
            after = await link.execute(b"GET", b"k")
            await link.close()
            out(outcome=outcome, waited=waited, after=after.decode())
        """,
    )
    assert figures["outcome"] == "timeout"
    assert 0.4 <= figures["waited"] < 1.4, figures  # the deadline, not the pause's end
    assert figures["after"] == "v"


def test_large_replies_arrive_whole_through_each_connections_reply_buffer(redis_server, redis_client):
    redis_client.set(b"big", bytes(range(256)) * 4096)  # 1 MiB: many reads of the buffer
    redis_client.set(b"small", b"s")
    figures = run_script(
        redis_server,
        """
        TIMEOUT = 5.0
        async def run(reactor, link, path):
            await pool_up(reactor, link)
            direct = [c.transport.doRead == c._read_replies for c in link._factory.pool]
            # Sent on every connection at once, so that their reads interleave.
            keys = [b"big", b"small"] * 8
            replies = await defer.gatherResults(
                [c.execute_command(b"GET", key) for c, key in zip(list(link._factory.pool) * 4, keys)]
            )
            await link.close()
            out(direct=direct, intact=all(r == (bytes(range(256)) * 4096 if k == b"big" else b"s")
                                          for k, r in zip(keys, replies)))
        """,
    )
    assert figures["direct"] == [True] * 4
    assert figures["intact"]


def test_commands_keep_to_one_connection_and_a_standby_takes_over_when_it_is_lost(redis_server, redis_client):
    figures = run_script(
        redis_server,
        """
        TIMEOUT = 2.0
        async def run(reactor, link, path):
            await pool_up(reactor, link)
            ids = {c: int(await c.execute_command(b"CLIENT", b"ID")) for c in link._factory.pool}
            pool = sorted(ids.values())
            used = {int(r) for r in await defer.gatherResults([link.execute(b"CLIENT", b"ID") for _ in range(30)])}
            used |= {int(await link.execute(b"CLIENT", b"ID")) for _ in range(10)}
            with socket.socket(socket.AF_UNIX) as raw:  # Redis drops the connection in use
                raw.connect(path)
                raw.sendall(b"CLIENT KILL ID %d\\r\\n" % min(used))
                assert raw.recv(64) == b":1\\r\\n"  # one client killed
            while len(link._factory.pool) == 4:  # until the link sees the loss
                await task.deferLater(reactor, 0.01, lambda: None)
            queued = [ids.get(c) for c in link._factory.connectionQueue.pending]
            after = {int(await link.execute(b"CLIENT", b"ID")) for _ in range(10)}
            await link.close()
            out(pool=pool, used=sorted(used), after=sorted(after), queued=queued)
        """,
    )
    assert len(figures["used"]) == 1, figures  # not spread over the pool
    assert len(figures["after"]) == 1 and figures["after"] != figures["used"], figures
    # A connection of the pool that stood by, not one dialled since.
    assert set(figures["after"]) <= set(figures["pool"]), figures
    assert figures["used"][0] not in figures["queued"], figures  # the lost one left the queue


def test_a_batch_sent_at_once_is_on_redis_socket_before_the_reactor_runs_again(redis_server, redis_client):
    """``sent_at_once`` (an export's next page): the batch leaves in the call; any other waits for the pass."""
    figures = run_script(
        redis_server,
        """
        TIMEOUT = 2.0
        from cache.redis.resp import sent_at_once
        from cache.twisted_internals import unsent_bytes

        def queued(link):
            return sum(unsent_bytes(connection.transport) for connection in link._factory.pool)

        async def run(reactor, link, path):
            await link.execute(b"PING")
            with sent_at_once():
                at_once = link.pipeline([(b"SET", b"at-once", b"1"), (b"GET", b"at-once")])
            queued_at_once = queued(link)
            later = link.pipeline([(b"SET", b"later", b"2"), (b"GET", b"later")])
            queued_later = queued(link)
            replies = [await at_once, await later]
            await link.close()
            out(queued_at_once=queued_at_once, queued_later=queued_later, replies=[r[1].decode() for r in replies])
        """,
    )
    assert figures == {"queued_at_once": 0, "queued_later": figures["queued_later"], "replies": ["1", "2"]}
    assert figures["queued_later"] > 0


@pytest.mark.parametrize("workers_reactor", [True, False])
def test_a_pass_commands_leave_in_one_write_before_the_reactor_waits_on_the_workers_reactor(
    redis_server, redis_client, workers_reactor
):
    """On the workers' reactor a pass's batches go in one write straight from the socket before the reactor
    waits (no write interest asked of epoll); on another they are queued on the transport for its next pass.
    A batch ``sent_at_once`` never overtakes one given before it."""
    figures = run_script(
        redis_server,
        """
        TIMEOUT = 2.0
        from cache.redis import resp
        from cache.twisted_internals import unsent_bytes

        writes = []
        straight = resp.send_at_once

        def counted(transport, data):
            writes.append(data.count(b"\\r\\n$4\\r\\nINCR") + data.count(b"\\r\\n$3\\r\\nGET"))
            return straight(transport, data)

        resp.send_at_once = counted

        async def run(reactor, link, path):
            await link.execute(b"DEL", b"n")
            connection = link._factory.pool[0]
            transport = connection.transport
            asked = []
            start_writing = transport.startWriting
            transport.startWriting = lambda: (asked.append(1), start_writing())
            writes.clear()
            first = connection.send([(b"INCR", b"n")])
            second = connection.send([(b"INCR", b"n"), (b"GET", b"n")])
            queued = unsent_bytes(transport)
            with resp.sent_at_once():
                third = connection.send([(b"GET", b"n")])
            at_once = list(writes)
            replies = [await first, await second, await third]
            writes.clear()
            fourth = connection.send([(b"INCR", b"n")])
            fifth = connection.send([(b"GET", b"n")])
            replies += [await fourth, await fifth]
            writing_asked = len(asked)  # before the close, whose loseConnection asks for it
            await link.close()
            out(
                queued=queued, at_once=at_once, pass_writes=writes, asked=writing_asked,
                replies=[[r.decode() if isinstance(r, bytes) else r for r in reply] for reply in replies],
            )
        """,
        workers_reactor=workers_reactor,
    )
    assert figures["replies"] == [[1], [2, "2"], ["2"], [3], ["3"]], figures
    if workers_reactor:
        # The first two waited in the connection, not on the transport; the third took them along, ahead of it.
        assert figures["queued"] == 0 and figures["at_once"] == [4], figures
        assert figures["pass_writes"] == [2] and figures["asked"] == 0, figures  # both in one write, no EPOLLOUT
    else:
        assert figures["queued"] > 0 and figures["pass_writes"] == [] and figures["asked"] > 0, figures

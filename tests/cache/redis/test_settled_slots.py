"""cache.redis.settled_slots: a script call as a cluster gets it, run on a real Redis.

That a write then waits for a migrating slot instead of failing half done is
tests/cache/redis/test_cluster.py's ``test_no_write_runs_on_a_slot_while_it_migrates``
(make test-cluster).
"""

from __future__ import annotations

from cache.redis.script import Script
from cache.redis.settled_slots import settled, settled_calls, settled_key
from cache.redis.slots import command_key, key_slot

ECHO = Script(b"local seen = {} for i, key in ipairs(KEYS) do seen[i] = key end seen[#seen + 1] = ARGV[1] return seen")


def test_the_settled_key_is_of_the_first_keys_slot():
    for key in (b"jw:{users:06}:d:u1", b"ji:{a:01}:fb", b"plain", b"a{b"):
        assert key_slot(settled_key(key)) == key_slot(key), key
    assert settled_key(b"jw:{users:06}:d:u1") == b"ji:{users:06}:settled"


def test_a_call_declares_the_settled_key_first_and_the_script_never_sees_it(redis_client):
    keys = [b"jw:{c:01}:d:x", b"jw:{c:01}:i"]
    (call,), scripts = settled_calls([ECHO.call(keys, [b"arg"])], [ECHO])
    assert scripts == [settled(ECHO)] and call[1] == settled(ECHO).sha
    assert call[2] == 3 and command_key(call) == b"ji:{c:01}:settled"
    assert redis_client.eval(scripts[0].source, *call[2:]) == [*keys, b"arg"]
    assert redis_client.exists(b"ji:{c:01}:settled") == 0  # declared, never written


def test_other_commands_and_keyless_calls_go_as_they_were():
    commands = [(b"HGET", b"jw:{c:01}:d:x", b"b"), ECHO.call([], [b"arg"]), (b"EVALSHA", b"f" * 40, 1, b"k")]
    assert settled_calls(commands, [ECHO])[0] == commands
    # A key without a tag that holds a "}" has no settled key of its slot.
    for key in (b"a}b", b"{}x"):
        odd = ECHO.call([key], [])
        assert settled_calls([odd], [ECHO])[0] == [odd]

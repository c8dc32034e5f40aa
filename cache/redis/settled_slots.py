"""On a Redis Cluster, no script runs on a slot while that slot migrates.

Redis checks only a script's declared keys before it runs it. On the source
of a migrating slot, a script whose declared keys are all still there runs,
and the first undeclared key it touches that has already moved (an index's
sorted set, the feed's byte count: keys the script derives from its
arguments) fails it with "Script attempted to access a non local key"
after the writes it made before (Redis does not roll a script back: a
document written without its feed event). On the target, asked with
``ASKING``, a script runs once its declared keys have arrived and reads the
undeclared ones that have not as missing.

So every script goes to a cluster with one more declared key, first: a key
of the same slot that nothing ever writes (``ji:{<tag>}:settled``). While
the slot migrates, that key is missing on both nodes and the others are
not all missing, so both answer ``TRYAGAIN`` before running anything, and
``cache.redis.cluster`` tries again after a pause until the slot has moved
(within its deadline). The script Redis runs is the stored one with a first
line that drops that key from ``KEYS``: the scripts themselves, and a
single Redis, know nothing of it. Measured on Redis 7.0 by hand with
``CLUSTER SETSLOT ... MIGRATING/IMPORTING`` and ``MIGRATE``; tested by
``tests/cache/redis/test_cluster.py``'s reshard under load.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from cache.redis.link import Command
from cache.redis.script import Script
from cache.redis.slots import arg_bytes, hashed_part, key_slot

# Shadows the global KEYS for the whole chunk: the expression reads the global, before the local exists.
# (A loop, not unpack: a script may declare more keys than Lua's stack takes.)
_DROP_FIRST_KEY = (
    b"local KEYS = (function(all) local keys = {} for i = 2, #all do keys[i - 1] = all[i] end return keys end)(KEYS)\n"
)

_variants: Dict[bytes, Script] = {}


def settled(script: Script) -> Script:
    """``script`` as a cluster runs it: with the settled-slot key declared first."""
    variant = _variants.get(script.sha)
    if variant is None:
        variant = _variants[script.sha] = Script(_DROP_FIRST_KEY + script.source)
    return variant


def settled_key(key: bytes) -> bytes:
    """The key of ``key``'s slot that is never written (its hash tag, or the whole key, as the tag)."""
    return b"ji:{" + hashed_part(key) + b"}:settled"


def settled_calls(commands: Sequence[Command], scripts: Sequence[Script]) -> Tuple[List[Command], List[Script]]:
    """``commands`` with each call of one of ``scripts`` (with keys) made a call of its settled variant."""
    variants = {script.sha: settled(script) for script in scripts}
    calls = [_settled_call(command, variants) for command in commands]
    return calls, list(variants.values())


def _settled_call(command: Command, variants: Dict[bytes, Script]) -> Command:
    if len(command) < 4 or arg_bytes(command[0]).upper() != b"EVALSHA":
        return command
    variant = variants.get(arg_bytes(command[1]))
    count = int(command[2])
    if variant is None or count == 0:
        return command
    first = arg_bytes(command[3])
    settled_first = settled_key(first)
    if key_slot(settled_first) != key_slot(first):
        return command  # a key without a tag, holding a "}": no settled key of its slot; sent as it was
    return (command[0], variant.sha, count + 1, settled_first, *command[3:])

"""Redis Cluster behind the same interface as ``RedisLink``.

txredisapi knows nothing of Redis Cluster (a ``MOVED`` comes back as a plain
error reply), so this layer sits on top of one ``RedisLink`` (one pool) per
node:

- The slot map (which master serves each of the 16384 hash slots) comes from
  ``CLUSTER SLOTS``, asked of every known node at once, first answer wins.
  It is loaded at start and again whenever a node says it is stale.
- A command goes to the master of its key's slot (``cache.redis.slots``:
  CRC16 of the key or of its ``{hash tag}``; for ``EVALSHA`` the first key
  after ``numkeys``). ``cache.keys`` lays keys out so that no command and
  no script spans two slots, so the first key is enough.
- A pipeline is split by node; each node's part goes down one of its
  connections back to back, every node at once, and the replies are put back
  in the order of the commands: still one round trip.
- ``MOVED`` (the slot has a new owner): the map is corrected and reloaded,
  and the command goes again to the node named. ``ASK`` (the slot is being
  migrated and the key may already be on the target): ``ASKING`` and the
  command go to the target on one connection; the map is left as it is.
  ``TRYAGAIN`` (a script's keys are split between source and target: every
  script's are while its slot migrates, ``cache.redis.settled_slots``) and
  ``CLUSTERDOWN``: again after a short pause. ``NOSCRIPT`` (the
  node never ran the script, e.g. it just took the slot over): loaded there,
  then the command again. None of these replies means that the command ran,
  so sending it again is safe; all of it happens within the link's deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from twisted.internet import defer, task
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.python.failure import Failure
from zope.interface import implementer

from cache.redis.address import Node, RedisAddress
from cache.redis.errors import RedisReplyError, RedisUnavailable, StoreError
from cache.redis.link import Arg, Command, RedisLink, endpoint_for
from cache.redis.script import Script
from cache.redis.settled_slots import settled_calls
from cache.redis.slots import SLOTS, arg_bytes, command_key, first_success, key_slot, redirection, slot_owners

# MOVED/ASK hops for one command; a healthy cluster needs at most two.
MAX_REDIRECTIONS = 8
# Between tries after TRYAGAIN or CLUSTERDOWN; a migrating slot's keys move
# within milliseconds, a failover takes seconds (beyond the deadline anyway).
RETRY_PAUSE = 0.02


@dataclass(frozen=True)
class _Attempt:
    """One command of a pipeline, and how to send it next time."""

    index: int
    command: Command
    node: Optional[Node] = None  # where a redirection pointed; None: the slot's owner
    asking: bool = False
    load: Optional[bytes] = None  # a script's source to load on the node first
    pause: bool = False
    wait: Optional[Command] = None  # a WAIT to send right after the command, on its connection


class ClusterLink:
    """Sends commands to the right masters of a Redis Cluster, following its redirections."""

    def __init__(
        self, address: RedisAddress, reactor: Any, timeout: float, poolsize: int = 4, spread: bool = False
    ) -> None:
        self._address = address
        self._reactor = reactor
        self._timeout = timeout
        self._poolsize = poolsize
        self._spread = spread  # each node's pool (RedisLink)
        self._links: Dict[Node, RedisLink] = {}
        self._owners: List[Optional[Node]] = [None] * SLOTS
        self._loaded_owners: List[Optional[Node]] = []
        self._mapped = False
        self._scripts: Dict[Node, set] = {}  # the shas each node is known to hold
        self._waiting: List[defer.Deferred] = []
        self._closed = False
        # Told of every change of the slot map, and of every redirection (the hot cache's feed).
        self._on_map: List[Callable[[List[Node]], Any]] = []
        self._on_redirect: List[Callable[[], Any]] = []
        self._stale()

    def execute(self, *command: Arg) -> defer.Deferred:
        return self.pipeline([command]).addCallback(lambda replies: replies[0])

    def pipeline(self, commands: Sequence[Command]) -> defer.Deferred:
        return self._run(commands, ())

    def pipeline_scripts(self, commands: Sequence[Command], scripts: Sequence[Script]) -> defer.Deferred:
        """``pipeline``; a node that lacks one of ``scripts`` gets it loaded, and the call is sent again."""
        return self._run(commands, scripts)

    def run_script(self, script: Script, keys: Sequence[bytes], args: Sequence[Arg]) -> defer.Deferred:
        return self.pipeline_scripts([script.call(keys, args)], [script]).addCallback(lambda replies: replies[0])

    def run_script_waiting(
        self, script: Script, keys: Sequence[bytes], args: Sequence[Arg], wait: Command
    ) -> defer.Deferred:
        """``run_script``, then ``wait`` on the connection of the node that ran it: fires with both replies.

        The pair goes through redirections together, so the ``WAIT`` that
        answers is always the one that followed the write on its node.
        """
        commands, scripts = settled_calls([script.call(keys, args)], [script])
        sent = self._resolve(commands, scripts, wait=wait)
        return sent.addCallback(lambda replies: replies[0])

    def pipeline_outcomes(
        self, commands: Sequence[Command], scripts: Sequence[Script], wait: Optional[Command] = None
    ) -> defer.Deferred:
        """``RedisLink.pipeline_outcomes`` over the nodes: each command on the node owning its key.

        With ``wait``, a ``WAIT`` follows each command on its connection, and
        the last outcome is the fewest replicas any of them reached.
        """
        commands, scripts = settled_calls(commands, scripts)
        loaded = self._scripts_loaded(commands, scripts)
        resolved = loaded.addCallback(lambda _: self._resolve(commands, scripts, wait=wait, each=True))
        return resolved if wait is None else resolved.addCallback(_split_waits)

    def _scripts_loaded(self, commands: Sequence[Command], scripts: Sequence[Script]) -> defer.Deferred:
        """The ``scripts`` that ``commands`` call loaded on the nodes they go to, before they are sent.

        A node loads a script when a call of it meets NOSCRIPT, that script
        alone, and the call is sent again after the pipeline's other commands
        on that node have run: a batch's get resent after its delete of the
        same document answered 404. Loaded first, a NOSCRIPT is left to a node
        that restarted. A load that fails is the commands' own to meet.
        """
        if not self._mapped:
            return self.refresh().addCallback(lambda _: self._scripts_loaded(commands, scripts))
        sources = {script.sha: script.source for script in scripts}
        missing: Dict[Node, List[bytes]] = {}
        for command in commands:
            sha = arg_bytes(command[1]) if arg_bytes(command[0]).upper() == b"EVALSHA" else None
            key = command_key(command) if sha in sources else None
            owner = None if key is None else self._owners[key_slot(key)]
            if owner is not None and sha not in self._scripts.get(owner, ()) and sha not in missing.get(owner, []):
                missing.setdefault(owner, []).append(sha)  # type: ignore[arg-type]
        sent = [
            self._link(node)
            .send_each([(b"SCRIPT", b"LOAD", sources[sha]) for sha in shas])
            .addCallback(self._held, node, shas)
            .addErrback(lambda _: None)
            for node, shas in missing.items()
        ]
        return defer.gatherResults(sent) if sent else defer.succeed(None)

    def _held(self, outcomes: List[Tuple[bool, Any]], node: Node, shas: List[bytes]) -> None:
        self._scripts.setdefault(node, set()).update(sha for sha, (ok, _) in zip(shas, outcomes) if ok)

    def close(self) -> defer.Deferred:
        self._closed = True
        return defer.gatherResults([link.close() for link in self._links.values()], consumeErrors=True)

    def masters(self) -> List[Node]:
        """The nodes that serve slots, as the map has them now."""
        return sorted({node for node in self._owners if node is not None})

    def watch(self, on_map: Callable[[List[Node]], Any], on_redirect: Callable[[], Any]) -> None:
        """Call ``on_map(masters)`` whenever the slot map changes (now, if it is
        loaded), and ``on_redirect()`` on every MOVED or ASK."""
        self._on_map.append(on_map)
        self._on_redirect.append(on_redirect)
        if self._mapped:
            on_map(self.masters())

    def refresh(self) -> defer.Deferred:
        """Reload the slot map; callers that come while a reload runs share it."""
        waiter = defer.Deferred()
        self._waiting.append(waiter)
        if len(self._waiting) == 1:
            self._load().addBoth(self._loaded)
        return waiter

    def _run(self, commands: Sequence[Command], scripts: Sequence[Script]) -> defer.Deferred:
        """Each node its part at once; when every reply is a plain reply, that is all.

        ``_resolve``'s bookkeeping (redirections, retries) is left to the rare
        pipeline that needs it: on PyPy it was a large part of a call's CPU.
        Script calls declare their slot's settled key (``cache.redis.settled_slots``).
        """
        if scripts:
            commands, scripts = settled_calls(commands, scripts)
        groups = self._groups(commands) if self._mapped else None
        if groups is None:
            return self._resolve(commands, scripts)
        started = self._reactor.seconds()
        sent = [self._send_group(node, indices, commands) for node, indices in groups.items()]
        outcomes = sent[0] if len(sent) == 1 else defer.gatherResults(sent).addCallback(_concatenated)
        return outcomes.addCallback(self._settle, commands, scripts, started)

    def _groups(self, commands: Sequence[Command]) -> Optional[Dict[Node, List[int]]]:
        """Command indices by the node that owns their slot; None if one has no key or no owner."""
        groups: Dict[Node, List[int]] = {}
        for index, command in enumerate(commands):
            key = command_key(command)
            owner = None if key is None else self._owners[key_slot(key)]
            if owner is None:
                return None
            groups.setdefault(owner, []).append(index)
        return groups

    def _send_group(self, node: Node, indices: List[int], commands: Sequence[Command]) -> defer.Deferred:
        part = commands if len(indices) == len(commands) else [commands[index] for index in indices]
        return (
            self._link(node)
            .send_each(part)
            .addCallbacks(
                lambda results: [(index, node, *result) for index, result in zip(indices, results)],
                lambda failure: [(index, node, False, failure.value) for index in indices],
            )
        )

    def _settle(
        self, outcomes: List[Tuple[int, Node, bool, Any]], commands: Sequence[Command], scripts: Any, started: float
    ) -> Any:
        if all(ok for _, _, ok, _ in outcomes):
            replies: List[Any] = [None] * len(commands)
            for index, _, _, reply in outcomes:
                replies[index] = reply
            return replies
        first = [(_Attempt(index, commands[index]), node, ok, reply) for index, node, ok, reply in outcomes]
        return self._resolve(commands, scripts, first, started)

    @defer.inlineCallbacks
    def _resolve(
        self,
        commands: Sequence[Command],
        scripts: Sequence[Script],
        first: Optional[List] = None,
        started: Optional[float] = None,
        wait: Optional[Command] = None,
        each: bool = False,
    ) -> Any:
        """Send, follow redirections, retry, until every command has its reply or its error.

        ``first``: the outcomes of a first try already made (by ``_run``), at ``started``.
        ``wait``: sent after each command on its connection; a command's reply is then the pair.
        """
        if not self._mapped:
            yield self.refresh()
        deadline = (self._reactor.seconds() if started is None else started) + self._timeout
        sources = {script.sha: script.source for script in scripts}
        replies: List[Any] = [None] * len(commands)
        errors: Dict[int, BaseException] = {}
        todo = [_Attempt(index, command, wait=wait) for index, command in enumerate(commands)]
        hops = 0
        while todo:
            if first is None:
                outcomes = yield self._send_all(todo)
            else:
                outcomes, first = first, None
            todo = []
            for attempt, node, ok, value in outcomes:
                again = None if ok else self._again(attempt, node, value, sources)
                if ok:
                    replies[attempt.index] = value
                elif again is None:
                    errors[attempt.index] = value
                else:
                    todo.append(again)
            if not todo:
                break
            pause = RETRY_PAUSE if any(attempt.pause for attempt in todo) else 0.0
            hops += not pause
            if hops > MAX_REDIRECTIONS or self._reactor.seconds() + pause > deadline:
                raise RedisUnavailable("the cluster did not settle on where the keys are")
            if pause:
                yield task.deferLater(self._reactor, pause, lambda: None)
        if each:
            return [(False, errors[index]) if index in errors else (True, reply) for index, reply in enumerate(replies)]
        if errors:
            raise errors[min(errors)]
        return replies

    def _again(self, attempt: _Attempt, node: Node, error: BaseException, sources: Dict[bytes, bytes]) -> Any:
        """The attempt to make after ``error``, or None when the error is the answer."""
        if isinstance(error, RedisUnavailable):
            self._stale()  # the node may have left the cluster or lost its slots
        if not isinstance(error, RedisReplyError):
            return None
        message = str(error)
        kind = message.split(" ", 1)[0]
        if kind in ("MOVED", "ASK"):
            for redirected in self._on_redirect:
                redirected()
        if kind == "MOVED":
            slot, target = redirection(message, node)
            self._owners[slot] = target
            self._stale()
            return replace(attempt, node=target, asking=False, pause=False)
        if kind == "ASK":
            _, target = redirection(message, node)
            return replace(attempt, node=target, asking=True, pause=False)
        if kind in ("TRYAGAIN", "CLUSTERDOWN"):
            return replace(attempt, node=None, asking=False, pause=True)
        if kind == "NOSCRIPT":
            self._scripts.pop(node, None)  # restarted or flushed: load them all again before the next pipeline
        if kind == "NOSCRIPT" and attempt.load is None:
            source = sources.get(arg_bytes(attempt.command[1]))
            return replace(attempt, load=source, pause=False) if source else None
        return None

    def _send_all(self, todo: List[_Attempt]) -> defer.Deferred:
        by_node: Dict[Node, List[_Attempt]] = {}
        for attempt in todo:
            by_node.setdefault(attempt.node or self._owner(attempt.command), []).append(attempt)
        sent = [self._send(node, attempts) for node, attempts in by_node.items()]
        return defer.gatherResults(sent).addCallback(_concatenated)

    @defer.inlineCallbacks
    def _send(self, node: Node, attempts: List[_Attempt]) -> Any:
        """One node's part, on one connection: ``(attempt, node, ok, reply or error)`` each."""
        wire: List[Command] = []
        places: List[int] = []
        for attempt in attempts:
            if attempt.load is not None:
                wire.append((b"SCRIPT", b"LOAD", attempt.load))
            if attempt.asking:
                # ASKING lets only the very next command on this connection in.
                wire.append((b"ASKING",))
            places.append(len(wire))
            wire.append(attempt.command)
            if attempt.wait is not None:
                wire.append(attempt.wait)
        try:
            results = yield self._link(node).send_each(wire)
        except StoreError as error:
            return [(attempt, node, False, error) for attempt in attempts]
        return [(attempt, node, *_with_wait(attempt, results, place)) for attempt, place in zip(attempts, places)]

    def nodes_of(self, routing_keys: Sequence[Optional[bytes]]) -> List[Node]:
        """The masters the slot map names for ``routing_keys`` now, each once (a traced call's span names them:
        ``cache.redis.metered``); a key with no known owner, or None (any node), names none."""
        nodes: List[Node] = []
        for key in routing_keys:
            owner = None if key is None else self._owners[key_slot(key)]
            if owner is not None and owner not in nodes:
                nodes.append(owner)
        return nodes

    def _owner(self, command: Command) -> Node:
        key = command_key(command)
        if key is None:
            owner = next((node for node in self._owners if node is not None), None)
        else:
            owner = self._owners[key_slot(key)]
        if owner is None:
            self._stale()
            raise RedisUnavailable("no node of the cluster serves that slot")
        return owner

    def _link(self, node: Node) -> RedisLink:
        link = self._links.get(node)
        if link is None:
            link = RedisLink(self._address.at(*node), self._reactor, self._timeout, self._poolsize, self._spread)
            self._links[node] = link
        return link

    def _stale(self) -> None:
        """Reload the map in the background (a request that needs it waits on its own)."""
        if not self._closed:
            self.refresh().addErrback(lambda _: None)

    @defer.inlineCallbacks
    def _load(self) -> Any:
        known = list(dict.fromkeys([*self.masters(), *self._address.nodes]))
        asked = [self._link(node).execute(b"CLUSTER", b"SLOTS").addCallback(_from, node) for node in known]
        try:
            node, reply = yield first_success(asked)
        except StoreError as error:
            raise RedisUnavailable(f"no node of the cluster answered CLUSTER SLOTS ({error})") from None
        owners = slot_owners(reply, node)
        # Against the map last loaded, not self._owners, which a MOVED corrects in place.
        changed = owners != self._loaded_owners
        self._owners = owners
        self._loaded_owners = list(owners)
        self._mapped = True
        if changed:
            for changed_map in self._on_map:
                changed_map(self.masters())

    def _loaded(self, result: Any) -> None:
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(None)


def _with_wait(attempt: _Attempt, results: List[Tuple[bool, Any]], place: int) -> Tuple[bool, Any]:
    """The attempt's outcome: with a ``WAIT``, the pair of replies once both succeeded."""
    ok, reply = results[place]
    if attempt.wait is None or not ok:
        return ok, reply
    waited_ok, waited = results[place + 1]
    return (True, (reply, waited)) if waited_ok else (False, waited)


def _split_waits(outcomes: List[Tuple[bool, Any]]) -> List[Tuple[bool, Any]]:
    """Per-command (reply, replicas) pairs as the commands' outcomes and, last, the fewest replicas."""
    commands = [(ok, value[0] if ok else value) for ok, value in outcomes]
    confirmed = [value[1] for ok, value in outcomes if ok]
    return [*commands, (True, min(confirmed, default=0))]


def _concatenated(groups: List[List[Any]]) -> List[Any]:
    return [outcome for group in groups for outcome in group]


def _from(reply: Any, node: Node) -> Tuple[Node, Any]:
    return node, reply


@implementer(IStreamClientEndpoint)
class AnyNodeEndpoint:
    """Dials the seed nodes in turn, one per attempt (for a subscription).

    A cluster forwards every ``PUBLISH`` to all its nodes, so a subscriber
    may sit on any of them; when its node dies, the next attempt goes to the
    next seed.
    """

    def __init__(self, address: RedisAddress, reactor: Any, timeout: float) -> None:
        self._address = address
        self._reactor = reactor
        self._timeout = timeout
        self._attempts = 0

    def connect(self, factory: Any) -> defer.Deferred:
        host, port = self._address.nodes[self._attempts % len(self._address.nodes)]
        self._attempts += 1
        return endpoint_for(self._address.at(host, port), self._reactor, self._timeout).connect(factory)

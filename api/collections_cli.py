"""``python -m api collections set|show|list|delete``: collection settings from the command line.

Talks to Redis directly (``REDIS_URL``), through the same store as the
admin API (``cache.collection_settings``), so a change made here is
published to every worker the same way. ``set`` replaces the whole
settings (what is not given is not set).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict

from twisted.internet import defer

from api.config import Settings
from api.keys import duration
from api.oneshot import run_with_link
from cache.collection_settings import CollectionSettingsStore, SettingsError
from cache.json import codec
from cache.redis.link import Link
from cache.schemas.schema import InvalidSchema
from handlers.http.validation import COLLECTION_PATTERN


def add_parser(commands: Any) -> None:
    collections = commands.add_parser("collections", help="set, show, list and delete collection settings")
    actions = collections.add_subparsers(dest="action", required=True)
    setting = actions.add_parser("set", help="replace a collection's settings")
    setting.add_argument("collection", type=_collection)
    setting.add_argument("--schema", type=argparse.FileType("rb"), help="a JSON Schema (Draft 2020-12) file")
    setting.add_argument("--ttl", type=duration, help="default lifetime of a document: 3600, 90m, 12h, 30d")
    setting.add_argument("--max-bytes", type=int, help="largest document, in bytes")
    setting.add_argument("--cache-control", help="the Cache-Control value for the collection's reads")
    setting.add_argument("--write-replicas", type=int, help="replicas a write waits for (instead of the default)")
    setting.add_argument(
        "--indexes",
        type=argparse.FileType("rb"),
        help='a JSON file of declared indexes: {"by_email": {"fields": [{"name": "email", "pointer": "/email",'
        ' "type": "string"}]}} (docs/api.md, "Queries over declared indexes"); a new one is built by the workers',
    )
    for action, what in (("show", "print a collection's settings"), ("delete", "remove a collection's settings")):
        actions.add_parser(action, help=what).add_argument("collection", type=_collection)
    actions.add_parser("list", help="every collection with settings")


def _collection(text: str) -> str:
    if not COLLECTION_PATTERN.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a collection name (^[a-z][a-z0-9_-]{{0,63}}$)")
    return text


def run(settings: Settings, args: argparse.Namespace) -> int:
    @defer.inlineCallbacks
    def act(link: Link) -> Any:
        try:
            code = yield _act(CollectionSettingsStore(link), args)
        except (SettingsError, InvalidSchema, ValueError) as error:
            print(f"jetway: {error}", file=sys.stderr)
            return 1
        return code

    return run_with_link(settings, act)


def _values(args: argparse.Namespace) -> Dict[str, Any]:
    values: Dict[str, Any] = {}
    if args.schema is not None:
        with args.schema:
            values["schema"] = codec.loads(args.schema.read())
    if args.indexes is not None:
        with args.indexes:
            values["indexes"] = codec.loads(args.indexes.read())
    for name in ("ttl", "max_bytes", "cache_control", "write_replicas"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    return values


@defer.inlineCallbacks
def _act(store: CollectionSettingsStore, args: argparse.Namespace) -> Any:
    if args.action == "set":
        settings, created = yield store.put(args.collection, _values(args))
        print(f"{'set' if created else 'replaced'} the settings of {args.collection} (ETag {settings.etag.decode()})")
    elif args.action == "show":
        row = yield store.read(args.collection)
        if row is None:
            print(f"jetway: collection {args.collection} has no settings", file=sys.stderr)
            return 1
        print(json.dumps(json.loads(row[0]), indent=2, ensure_ascii=False))
    elif args.action == "delete":
        result = yield store.delete(args.collection)
        if result != 1:
            print(f"jetway: collection {args.collection} has no settings", file=sys.stderr)
            return 1
        print(f"removed the settings of {args.collection}")
    else:
        rows = yield store.read_all()
        print(f"{'COLLECTION':24} {'SCHEMA':7} {'TTL':>9} {'MAX_BYTES':>10} {'REPLICAS':>8} CACHE-CONTROL")
        for name, body, _etag in rows:
            values = json.loads(body)
            print(
                f"{name:24} {'yes' if 'schema' in values else '-':7} {values.get('ttl', '-'):>9}"
                f" {values.get('max_bytes', '-'):>10} {values.get('write_replicas', '-'):>8}"
                f" {values.get('cache_control', '-')}"
            )
    return 0

"""``python -m api keys create|list|revoke|rotate``: the token admin CLI.

Talks to Redis directly (``REDIS_URL``); a new token is printed once, alone
on the last line, and is never stored or shown again.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any

from twisted.internet import defer

from api.config import Settings
from api.oneshot import run_with_link
from cache.credentials.tokens import TokenError, TokenStore
from cache.redis.link import Link

_DURATION = re.compile(r"([1-9][0-9]*)([smhd]?)\Z")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def add_parser(commands: Any) -> None:
    keys = commands.add_parser("keys", help="make, list, revoke and rotate API tokens")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a token and print it once")
    create.add_argument("--name", required=True)
    create.add_argument("--scope", action="append", required=True, help="admin, read:<coll>, write:<coll>, read:*, …")
    create.add_argument("--rate", default="", help="requests per period, e.g. 1000/s, 600/m (default: none)")
    create.add_argument("--expires", type=duration, help="lifetime: 3600, 90m, 12h, 30d (default: never)")
    actions.add_parser("list", help="list tokens (never the tokens themselves)")
    for action in ("revoke", "rotate"):
        actions.add_parser(action, help=f"{action} the named token").add_argument("name")


def duration(text: str) -> int:
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 3600, 90m, 12h or 30d")
    return int(match.group(1)) * _UNITS[match.group(2)]


def run(settings: Settings, args: argparse.Namespace) -> int:
    @defer.inlineCallbacks
    def act(link: Link) -> Any:
        try:
            yield _act(TokenStore(link), args)
        except TokenError as error:
            print(f"jetway: {error}", file=sys.stderr)
            return 1
        return 0

    return run_with_link(settings, act)


@defer.inlineCallbacks
def _act(tokens: TokenStore, args: argparse.Namespace) -> Any:
    if args.action == "create":
        token = yield tokens.create(args.name, args.scope, args.rate, args.expires)
        print(f"created token {args.name!r}; it is shown only now:", file=sys.stderr)
        print(token, flush=True)
    elif args.action == "rotate":
        token = yield tokens.rotate(args.name)
        print(f"rotated token {args.name!r}; the old one no longer works; the new one:", file=sys.stderr)
        print(token, flush=True)
    elif args.action == "revoke":
        yield tokens.revoke(args.name)
        print(f"revoked token {args.name!r}")
    else:
        records = yield tokens.list()
        print(f"{'NAME':24} {'SCOPES':32} {'RATE':10} {'EXPIRES':20} CREATED")
        for record in records:
            expires = _when(record.expires) if record.expires else "never"
            scopes = " ".join(record.scopes)
            print(f"{record.name:24} {scopes:32} {record.rate or '-':10} {expires:20} {_when(record.created)}")


def _when(timestamp: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))

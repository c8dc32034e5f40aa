"""``python -m api serve``: the command line of Jetway."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from twisted.internet.error import CannotListenError

from api import config
from api.server import serve


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api", description="Jetway, a JSON REST gateway to Redis.")
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser("serve", help="serve the API")
    serving.add_argument("--host", help="address to bind (env JETWAY_HOST, default 127.0.0.1)")
    serving.add_argument("--port", type=int, help="port to bind (env JETWAY_PORT, default 8080)")
    args = parser.parse_args(argv)
    try:
        settings = config.from_environment()
    except config.ConfigError as error:
        print(f"jetway: {error}", file=sys.stderr)
        return 2
    overrides = {name: value for name, value in (("host", args.host), ("port", args.port)) if value is not None}
    settings = config.replace(settings, **overrides)
    from twisted.internet import reactor

    try:
        return serve(settings, reactor)
    except CannotListenError as error:
        print(f"jetway: cannot listen on {settings.host}:{settings.port}: {error.socketError}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

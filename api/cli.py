"""Jetway's command line, run by ``python -m api`` (see ``api/__main__.py``).

``serve`` runs the master (which binds and runs the workers); ``worker``
runs one worker on a socket another process opened (supervisor, or the
master itself); ``keys`` and ``collections`` change tokens and collection
settings in Redis; ``import`` and ``export`` load and dump a collection
through a running server (``api.transfer_cli``).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from api import check, collections_cli, config, keys, transfer_cli
from api.log_relay import Relay
from api.logs import LineStream, start_logging
from api.metrics_dir import metrics_directory
from api.sockets import BindError, bind_listeners, raise_fd_limit


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("import", "export"):
        return transfer_cli.run(args)  # a client of a running server: no settings of its own
    try:
        settings = config.from_environment()
    except config.ConfigError as error:
        return _fail(str(error))
    overrides = {name: getattr(args, name, None) for name in ("host", "port", "workers")}
    settings = config.replace(settings, **{name: value for name, value in overrides.items() if value is not None})
    if args.command == "serve":
        return _serve(settings, args.worker_python or sys.executable)
    if args.command == "keys":
        return keys.run(settings, args)
    if args.command == "collections":
        return collections_cli.run(settings, args)
    if args.command == "check":
        return check.run(settings)
    from twisted.internet import reactor

    from api.worker import run_worker

    return run_worker(
        settings, reactor, args.fd, args.ready_fd, log_pipe=args.log_pipe, handoff_fd=args.handoff_fd, slot=args.slot
    )


def _serve(settings: config.Settings, worker_python: str) -> int:
    if settings.workers < 1:
        return _fail("--workers must be at least 1")
    raise_fd_limit()
    try:
        listeners = bind_listeners(settings.host, settings.port, settings.workers)
    except BindError as error:
        return _fail(str(error))
    with metrics_directory():
        from twisted.internet import reactor
        from twisted.logger import Logger

        from api.master import Master
        from api.observe import log_lines_dropped

        # Every line the master and its workers log reaches stdout through this relay.
        sys.stdout.flush()
        relay = Relay(sys.stdout.fileno(), log_lines_dropped().inc)
        start_logging(LineStream(relay), settings.json_logs)
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        url = f"http://{host}:{listeners[0].getsockname()[1]}"
        # The master says it serves once every worker does (api.master); each worker warms up first.
        warming = "; each warms up for a few seconds before it serves" if settings.warm_up else ""
        workers = f"{settings.workers} worker{'s' if settings.workers != 1 else ''}"
        Logger().info("jetway: starting {workers} on {url}{warming}", workers=workers, url=url, warming=warming)
        return Master(listeners, reactor, settings.grace, relay, python=worker_python, url=url).run()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m api", description="Jetway, a JSON REST gateway to Redis.")
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser("serve", help="bind the address and run the workers (the master)")
    serving.add_argument("--host", help="IPv4/IPv6 address to bind, :: for both (env JETWAY_HOST, default 127.0.0.1)")
    serving.add_argument("--port", type=int, help="port to bind (env JETWAY_PORT, default 8080)")
    serving.add_argument("--workers", type=int, help="worker processes (env JETWAY_WORKERS, default: the cores)")
    serving.add_argument(
        "--worker-python",
        help="the interpreter the workers run on (default: this one; set when JETWAY_MASTER_PYTHON execs the master)",
    )
    keys.add_parser(commands)
    collections_cli.add_parser(commands)
    transfer_cli.add_parsers(commands)
    commands.add_parser("check", help="validate the configuration and reach Redis; exit 0 or 1")
    working = commands.add_parser("worker", help="serve on a listening socket opened by another process")
    working.add_argument("--fd", type=int, required=True, help="the listening socket's file descriptor")
    working.add_argument("--ready-fd", type=int, help="write 'ready' here once serving (used by the master)")
    working.add_argument("--handoff-fd", type=int, help="connections the master hands over come here (api.handoff)")
    working.add_argument("--slot", type=int, help="the master's slot this worker serves, for its log lines")
    working.add_argument(
        "--log-pipe",
        action="store_true",
        help="stdout is a pipe only this worker writes (the master's, or supervisor's per process): never block on it",
    )
    return parser


def _fail(message: str) -> int:
    print(f"jetway: {message}", file=sys.stderr)
    return 2

"""Jetway with a read path that parses and re-serializes every body (bench only).

The bench's counterfactual: what a gateway that keeps documents as data,
not as bytes, would pay. It is the real app (``api.worker.run_worker`` with
the real route table and handlers) except that the document and collection
handlers json-decode each body they send and encode it again with the same
codec before writing it. Never used outside ``make bench``.

``python -m loadtest.bench._reencode_app serve --port P --workers N`` binds
like ``python -m api serve`` and runs N workers of this module; it has no
respawning, draining or reloading: SIGTERM stops the workers and exits.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
from typing import Any, List, Optional, Tuple

from api import config, event_loop
from api.master import worker_environment
from api.sockets import bind_listeners
from cache.json import codec

_PR_SET_PDEATHSIG = 1


class Reencoding:
    """Mixin: every 200/201 body goes through ``loads`` and ``dumps`` first."""

    def send_bytes(self, status: int, body: bytes, *args: Any, **kwargs: Any) -> None:
        if status in (200, 201) and body:
            body = codec.dumps(codec.loads(body))
        super().send_bytes(status, body, *args, **kwargs)  # type: ignore[misc]


def reencoding_app(make_app: Any, reencoded: Tuple[type, ...]) -> Any:
    """``make_app`` whose handlers of the ``reencoded`` classes re-encode."""

    def make(*args: Any, **kwargs: Any) -> Any:
        app = make_app(*args, **kwargs)
        for _host, specs in app.handlers:
            for spec in specs:
                if spec.handler_class in reencoded:
                    name = "Reencoding" + spec.handler_class.__name__
                    spec.handler_class = type(name, (Reencoding, spec.handler_class), {})
        return app

    return make


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench._reencode_app")
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser("serve")
    serving.add_argument("--host", default="127.0.0.1")
    serving.add_argument("--port", type=int, required=True)
    serving.add_argument("--workers", type=int, default=1)
    working = commands.add_parser("worker")
    working.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    settings = config.from_environment()
    if args.command == "serve":
        return _serve(args.host, args.port, args.workers)
    # The same reactor as Jetway's workers, installed before the app is
    # imported: txredisapi takes the global reactor when it is imported.
    reactor = event_loop.install()
    from api import worker as api_worker
    from handlers.collections import CollectionHandler
    from handlers.documents import DocumentHandler
    from handlers.multi_get import MultiGetHandler

    _die_with_parent()
    app_factory = reencoding_app(api_worker.make_app, (DocumentHandler, CollectionHandler, MultiGetHandler))
    return api_worker.run_worker(settings, reactor, args.fd, app_factory=app_factory)


def _die_with_parent() -> None:
    """SIGTERM when the parent dies, so no worker outlives a killed bench."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:
        sys.exit(0)


def _serve(host: str, port: int, workers: int) -> int:
    listeners = bind_listeners(host, port, workers)
    children = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        for listener in listeners:
            fd = listener.fileno()
            command = [sys.executable, "-m", __spec__.name, "worker", "--fd", str(fd)]
            # The same GC settings as the master gives Jetway's workers, so
            # that only the read path differs.
            children.append(subprocess.Popen(command, pass_fds=(fd,), env=worker_environment(os.environ)))
        print(f"reencode: serving on http://{host}:{port} with {workers} workers", flush=True)
        for child in children:
            child.wait()
        return 1  # a worker died: the bench sees the server gone
    finally:
        for child in children:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGTERM)
        for child in children:
            child.wait()


if __name__ == "__main__":
    sys.exit(main())

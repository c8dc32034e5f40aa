"""The browser tests' page server: static files from a directory, on a port of its own.

``python -m tests.page_server DIRECTORY`` binds 127.0.0.1 on a port the
kernel picks, prints ``port N`` once it listens, and serves DIRECTORY until
it is stopped. Its origin (``http://127.0.0.1:N``) is not Jetway's, so a page
from it reaches Jetway only as a browser's cross-origin request. Every answer
says ``no-store``: a test may rewrite a page, and must get the new one.
"""

from __future__ import annotations

import functools
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import List


class PageHandler(SimpleHTTPRequestHandler):
    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()


def main(argv: List[str]) -> int:
    directory = argv[0]
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(PageHandler, directory=directory))
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

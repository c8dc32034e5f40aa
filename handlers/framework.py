"""Every place Jetway reaches into Cyclone's privates: what each replaces, and why.

Cyclone (``cyclone.web``, ``cyclone.httpserver``) is used through its
public hooks everywhere else (``initialize``, ``prepare``, the methods,
``set_default_headers``, ``write_error``, ``on_connection_close``, the
application's ``__call__`` and the connection's Twisted protocol methods).
What is overridden here is not a public hook: an upgrade of Cyclone is
checked against this module, one method at a time.

- ``CycloneHandler`` (the base of every handler, ``handlers.base``):
  ``__init__``, ``clear``, ``_execute``, ``_convert_header_value``,
  ``compute_etag``, ``write``, ``_generate_headers`` (and ``send_head_now``,
  which writes that head early, and ``take_head``, which hands it to a
  stream), ``_handle_request_exception``; and offers, for its subclasses
  and the application, ``execute``, ``finished``, ``set_reply_status`` and
  ``set_default_header`` over the privates below, which no other module
  touches (``tests/test_tree.py`` checks it). They rely on ``_headers``,
  ``_list_headers``, ``_write_buffer``, ``_status_code``, ``_reason``,
  ``_transforms``, ``_finished``, ``_headers_written``, ``_auto_finish``,
  ``_execute_success`` and ``_execute_failure`` keeping their meaning.
- ``CycloneConnection`` (the base of ``api.connection.JetwayConnection``):
  ``_finish_request``; it relies on ``_request``, ``_finish_callback`` and
  ``_request_finished``, and on Cyclone's ``HTTPRequest.finish`` calling it.
- ``RequestHeaders`` (the headers ``api.request_head`` fills): ``add_normal``
  sets ``_last_key`` and ``_as_list`` as ``HTTPHeaders.add`` does, without
  growing Cyclone's cache of normalized names.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import cyclone.httpserver
import cyclone.web
from cyclone.httputil import HTTPHeaders
from twisted.python.failure import Failure

from cache.trace_scope import resuming_within, run_within
from handlers.http.deferreds import is_deferred
from handlers.http.problems import problem_of
from handlers.http.reply import JSON_TYPE, SERVER, Reply, header_parts, response_head

# What Cyclone refuses in a header value (against header injection), compiled once.
_UNSAFE_HEADER_VALUE = re.compile(r"[\x00-\x1f]")
MAX_HEADER_VALUE = 4000


class CycloneHandler(cyclone.web.RequestHandler):
    """Cyclone's request handler with the overrides the module's docstring lists."""

    _cors_lines = b""  # this response's CORS header lines (handlers/http/cors.py)
    reply: Optional[Reply] = None  # a pipeline's reply being sent (handlers.base.JsonHandler.send_reply)
    trace: Any = None  # the request's span (api.tracing.RequestTrace) when tracing is on (handlers.base)

    def __init__(self, application: Any, request: Any, **kwargs: Any) -> None:
        """Replaces Cyclone's, which also builds the template helpers (ui modules and methods) for every
        request; a JSON API has none. Not ``super().__init__``, so this is Cyclone's body less those."""
        self.application = application
        self.request = request
        self._headers_written = False
        self._finished = False
        self._auto_finish = True
        self.path_args = None
        self.path_kwargs = None
        self.clear()
        self.request.connection.no_keep_alive = self.no_keep_alive
        # Each method's operation, from the table (handlers.operation.routes): what admission reads.
        self.declared = kwargs.pop("operations", None) or {}
        methods = kwargs.pop("methods", None)
        if methods is not None:
            self.SUPPORTED_METHODS = methods
        self.initialize(**kwargs)

    def clear(self) -> None:
        """Replaces Cyclone's ``clear``: the same defaults, the ``Date`` string made once per second."""
        self._headers = {"Server": SERVER, "Content-Type": JSON_TYPE, "Date": self.application.http_date()}
        self._list_headers = []
        self._write_buffer = []
        self._status_code = 200
        self._reason = "OK"
        self.reply = None
        self.set_default_headers()

    def _execute(self, transforms: Any, *args: str) -> None:
        """Cyclone's ``_execute``, without Deferreds where nothing waits.

        Cyclone wrapped ``prepare`` and the method each in a Deferred, made
        a third for ``notifyFinish`` on every request, and decoded the path
        arguments twice. Here a ``prepare`` or a method that returns a
        Deferred is waited for, one that returns at once is not, and only a
        handler that overrides ``on_connection_close`` watches for the
        client going away (the change feed's). Errors go to
        ``_handle_request_exception`` as before, with their traceback.
        A traced request's steps run with its trace active (``cache.trace_scope``).
        """
        trace = self.trace
        if trace is not None and trace.recording:
            run_within(trace, self._execute_now, transforms, args, trace)
        else:
            self._execute_now(transforms, args, None)

    def _execute_now(self, transforms: Any, args: Any, trace: Any) -> None:
        self._transforms = transforms
        try:
            if self.request.method not in self.SUPPORTED_METHODS:
                raise cyclone.web.HTTPError(405)
            self.path_args = [self.decode_argument(arg) for arg in args]
            self.path_kwargs = {}
            prepared = self.prepare()
        except Exception:
            self._handle_request_exception(Failure())
            return
        if is_deferred(prepared):
            # The method resumes with the request's trace (whoever fires ``prepared``).
            prepared.addCallbacks(resuming_within(trace, self._run_method), self._handle_request_exception)
        else:
            self._run_method(None)

    def _run_method(self, _: Any) -> None:
        """The request's method, once ``prepare`` is done; the response finished after it unless it did."""
        if self._finished:
            return
        method = getattr(self, self.request.method.lower(), self.default)
        try:
            result = method(*self.path_args)
        except Exception:
            self._handle_request_exception(Failure())
            return
        if is_deferred(result):
            result.addCallbacks(self._execute_success, self._execute_failure)
        else:
            self._execute_success(result)
        if type(self).on_connection_close is not cyclone.web.RequestHandler.on_connection_close:
            self.notifyFinish().addCallback(self.on_connection_close)

    def _convert_header_value(self, value: Any) -> str:
        """Cyclone's check of a header value, with its pattern compiled once.

        Cyclone's ``re.search`` with the pattern's text looks it up in
        ``re``'s cache on every header of every response.
        """
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, int):
            # Content-Length on every response. Cyclone asks numbers.Integral,
            # an ABC: a visible share of an in-process read's samples went to PyPy's
            # ABC cache lookup (python -m loadtest.studies._request_path --profile get).
            return str(value)
        elif not isinstance(value, str):
            return super()._convert_header_value(value)  # other numbers and dates, formatted as Cyclone does
        if len(value) > MAX_HEADER_VALUE or _UNSAFE_HEADER_VALUE.search(value):
            raise ValueError("Unsafe header value %r", value)
        return value

    def compute_etag(self) -> None:
        """Replaces Cyclone's hash of every 200's body: ETags are stored with each document."""
        return None

    def write(self, chunk: Any) -> None:
        """Cyclone's ``write``, into a list made now rather than the one made with the handler.

        The handler is usually in PyPy's old generation by the time it
        answers (a minor collection came while it waited for Redis), and a
        body appended to a list as old as the handler would be kept through
        the next minor collection, sent or not (``cache.redis.resp._reply_received``
        says more).
        """
        self._write_buffer = list(self._write_buffer)
        super().write(chunk)

    def _generate_headers(self) -> bytes:
        """Replaces Cyclone's head writer with ``handlers.http.reply.response_head``, the one every answer uses.

        A pipeline's reply (``reply``, sent by ``send_reply``) writes its own
        head, as the connection writes it, with the ``Connection`` header
        this connection needs. Otherwise the handler's headers, with no
        ``Content-Length`` nor ``Content-Type`` on a 204 (RFC 9110; Cyclone
        adds both to every response).
        """
        connection = self._connection_header()
        if self.reply is not None:
            date, version = self._headers["Date"], self.request.version
            return self.reply.head(version, date, self.request_id, connection, self._cors_lines, self.trace)
        if connection is None:
            self._headers.pop("Connection", None)
        else:
            self._headers["Connection"] = connection
        if self._status_code == 204:
            self._headers.pop("Content-Length", None)
            self._headers.pop("Content-Type", None)
        parts = header_parts(self._headers.items())
        parts += header_parts(self._list_headers)
        return response_head(self.request.version, self._status_code, self._reason, parts, self._cors_lines)

    def send_head_now(self) -> None:
        """Write the head at once, for a body written after it straight to the transport (the NDJSON export):
        Cyclone then finishes without writing a head of its own."""
        self.request.write(self._generate_headers())
        self._headers_written = True

    def take_head(self) -> bytes:
        """The response head, for a stream that writes it itself (the SSE feed); Cyclone writes none after it
        and does not finish the request when the method returns."""
        self._auto_finish = False
        head = self._generate_headers()
        self._headers_written = True
        return head

    @property
    def finished(self) -> bool:
        """Whether the response is finished (Cyclone's ``_finished``)."""
        return bool(self._finished)

    def execute(self, *args: str) -> None:
        """Run the request: ``prepare``, then the method (``_execute``, below); the application's dispatch."""
        self._execute([], *args)

    def set_reply_status(self, status: int, reason: str) -> None:
        """The status of a pipeline's reply, taken as it is (Cyclone's ``set_status`` checks it against its own
        table of reasons)."""
        self._status_code = status
        self._reason = reason

    def set_default_header(self, name: str, value: str) -> None:
        """A header every answer carries (``set_default_headers``), set without ``set_header``'s checks: the
        value is made by the server."""
        self._headers[name] = value

    def _connection_header(self) -> Optional[str]:
        """What Cyclone's connection decided in ``_finish_request``, said in the head."""
        connection = self.request.connection
        if getattr(connection, "closing", False) or not getattr(connection, "keep_alive", True):
            return "close"  # draining, or the client asked: this connection ends here
        if not self.request.supports_http_1_1():
            return "keep-alive"  # HTTP/1.0 keeps it only when told
        return None

    def _handle_request_exception(self, e: Any) -> None:
        """Replaces Cyclone's: every failure answers its problem (``handlers.http.problems``), a bug a logged 500."""
        super()._handle_request_exception(problem_of(e, self.request.method, self.request.path))


class CycloneConnection(cyclone.httpserver.HTTPConnection):
    """Cyclone's connection, told when a request is answered (``JetwayConnection`` reads the next one then)."""

    def _finish_request(self) -> None:
        """Replaces Cyclone's, which decided keep-alive by case-sensitive ``Connection`` tokens and read the
        next pipelined request at once; ``request_answered`` decides (``api.connection``)."""
        if self._finish_callback:
            self._finish_callback.callback(None)
            self._finish_callback = None
        self._request = None
        self._request_finished = False
        self.request_answered()

    def request_answered(self) -> None:
        raise NotImplementedError

    @property
    def current_request(self) -> Any:
        """The request being received or answered (Cyclone's ``_request``); None between requests."""
        return self._request

    @current_request.setter
    def current_request(self, request: Any) -> None:
        self._request = request


class RequestHeaders(HTTPHeaders):
    """Cyclone's headers, filled without growing Cyclone's cache of header names.

    ``HTTPHeaders.add`` puts every name it is given, normalized, into a
    dictionary of its class, and keeps it for good: a client that made up
    names would grow every worker's memory without end (100 names of 16
    characters per request: 100,000 entries after 1,000 requests). Names a
    client sent are normalized here, into a cache that holds at most
    ``MAX_KNOWN_NAMES`` short names; lookups by the server's own names go
    through Cyclone's as before.
    """

    def add_normal(self, key: str, value: str) -> None:
        """``add`` for a name already in Http-Header-Case (``normal_name``)."""
        self._last_key = key
        if dict.__contains__(self, key):
            dict.__setitem__(self, key, dict.__getitem__(self, key) + "," + value)
            self._as_list[key].append(value)
        else:
            dict.__setitem__(self, key, value)
            self._as_list[key] = [value]

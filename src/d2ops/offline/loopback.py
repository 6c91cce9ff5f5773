"""A local HTTP server on its own thread: what the offline gateway, the offline status API and the console share.

Each of them answers requests by calling back into its owner (``methods``: ``"GET"`` -> a function of the
request handler); this module owns the rest, once: HTTP/1.1 keep-alive, debug-level request logs, daemon
threads, port 0 meaning "any free port", a stop that does not wait for a serve loop that never ran, and errors
that go to the log, never to stderr (socketserver's default prints a traceback there, e.g. each time a client
such as ``d2ops demo --loop`` hangs up before reading the answer).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

Respond = Callable[[BaseHTTPRequestHandler], None]


class _LoggingServer(ThreadingHTTPServer):
    """socketserver's handle_error prints to stderr; a handler's real error goes to the owner's log instead."""

    logger: logging.Logger = log
    log_name = "loopback"

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.logger.error("%s: error answering %s:%s", self.log_name, *client_address[:2], exc_info=True)


class LoopbackServer:
    """A ThreadingHTTPServer bound now (``url`` is known before `start`), served from a daemon thread."""

    def __init__(self, methods: Mapping[str, Respond], *, host: str = "127.0.0.1", port: int = 0,
                 thread_name: str, log_name: str, logger: logging.Logger = log) -> None:
        def log_message(handler: BaseHTTPRequestHandler, format: str, *args: Any) -> None:
            logger.debug(f"{log_name}: " + format, *args)

        def do(respond: Respond) -> Callable[[BaseHTTPRequestHandler], None]:
            return lambda handler: respond(handler)

        def handle(handler: BaseHTTPRequestHandler) -> None:
            try:
                BaseHTTPRequestHandler.handle(handler)
            except ConnectionError as error:  # the client hung up (reset, broken pipe): its business, not an error
                logger.debug("%s: %s:%s hung up on %s %s (%s)", log_name, *handler.client_address[:2],
                            getattr(handler, "command", None) or "-", getattr(handler, "path", None) or "-",
                            type(error).__name__)

        handler = type("Handler", (BaseHTTPRequestHandler,), {
            "protocol_version": "HTTP/1.1", "log_message": log_message, "handle": handle,
            **{f"do_{method}": do(respond) for method, respond in methods.items()}})
        self.server = _LoggingServer((host, port), handler)
        self.server.logger, self.server.log_name = logger, log_name
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        # stop() waits for the serve loop to notice: poll every 0.1 s, not socketserver's 0.5 (each runtime stops it)
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        # shutdown() waits for serve_forever() to notice: on a server that never started it would wait forever.
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()

"""A local HTTP server on its own thread: what the offline gateway, the offline status API and the console share.

Each of them answers requests by calling back into its owner (``methods``: ``"GET"`` -> a function of the
request handler); this module owns the rest, once: HTTP/1.1 keep-alive, debug-level request logs, daemon
threads, port 0 meaning "any free port", and a stop that does not wait for a serve loop that never ran.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

Respond = Callable[[BaseHTTPRequestHandler], None]


class LoopbackServer:
    """A ThreadingHTTPServer bound now (``url`` is known before `start`), served from a daemon thread."""

    def __init__(self, methods: Mapping[str, Respond], *, host: str = "127.0.0.1", port: int = 0,
                 thread_name: str, log_name: str, logger: logging.Logger = log) -> None:
        def log_message(handler: BaseHTTPRequestHandler, format: str, *args: Any) -> None:
            logger.debug(f"{log_name}: " + format, *args)

        def do(respond: Respond) -> Callable[[BaseHTTPRequestHandler], None]:
            return lambda handler: respond(handler)

        handler = type("Handler", (BaseHTTPRequestHandler,), {
            "protocol_version": "HTTP/1.1", "log_message": log_message,
            **{f"do_{method}": do(respond) for method, respond in methods.items()}})
        self.server = ThreadingHTTPServer((host, port), handler)
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

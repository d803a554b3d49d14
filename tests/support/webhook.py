"""A webhook receiver for escalation tests: a local HTTP server that keeps every JSON body POSTed to it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any


@contextmanager
def webhook_server(path: str = "/hook", must_hold: str | None = None,
                   answer: tuple[int, bytes] = (204, b"")) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Yields (the URL to post to, the bodies received so far). `path` may carry a query; with `must_hold`,
    a POST whose path lacks it is answered 404 and not kept (the secret is what routes a real one). A kept
    POST is answered `answer` (Slack's webhooks answer 200 "ok", which its provider checks)."""
    got: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if must_hold is not None and must_hold not in self.path:
                self.send_response(404)
            else:
                got.append(json.loads(body))
                self.send_response(answer[0])
                if answer[1]:
                    self.send_header("Content-Length", str(len(answer[1])))
                    self.end_headers()
                    self.wfile.write(answer[1])
                    return
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}{path}", got
    finally:
        srv.shutdown()
        srv.server_close()

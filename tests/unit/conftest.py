"""Shared by the unit tests: a health route whose answers a test switches off."""

from __future__ import annotations

import http.server
import threading
import time

import pytest


class Health(http.server.BaseHTTPRequestHandler):
    answering = True

    def do_GET(self):  # noqa: N802 - the stdlib's name
        if not Health.answering:
            time.sleep(5)  # silent: the client's request times out
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    Health.answering = True
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits a poll
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()

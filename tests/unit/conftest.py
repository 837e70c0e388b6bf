"""Shared by the unit tests: a health route whose answers a test switches off, and an engine route whose heartbeat age a
test sets."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest


class Health(http.server.BaseHTTPRequestHandler):
    answering = True
    beat_age_s: float | None = None  # None: the engine route answers as a server without it would

    def do_GET(self):  # noqa: N802 - the stdlib's name
        if not Health.answering:
            time.sleep(5)  # silent: the client's request times out
            return
        self.send_response(200)
        self.end_headers()
        if self.path.endswith("/rlcli/engine") and Health.beat_age_s is not None:
            self.wfile.write(json.dumps({"state": "beating", "pid": 4242, "beat_age_s": Health.beat_age_s}).encode())
            return
        self.wfile.write(b'{"status": "ok"}')

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    Health.answering, Health.beat_age_s = True, None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits a poll
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()

"""net.py against a real HTTP server on localhost: ports, the health probe and the wait for a server to come up."""

import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from swe_megatron.net import free_port, http_health, port_or_free, wait_healthy


@pytest.fixture
def server():
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/v1/health" and self.headers.get("Authorization") == "Bearer t"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_ports():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        assert port_or_free(taken) != taken
    port = free_port()
    assert port_or_free(port) == port


def test_probe_and_wait(server):
    assert http_health(server, 2, "/v1/health", {"Authorization": "Bearer t"}) is None
    assert http_health(server, 2, "/v1/health") == "HTTP 401"
    assert wait_healthy(server, None, 5, "/v1/health", {"Authorization": "Bearer t"}) is None
    assert wait_healthy(server, None, 0.3, interval_s=0.1).startswith("not healthy after 0 s (HTTP 401)")
    dead = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    assert wait_healthy(dead, proc, 60) == "exited (3)"

"""net.py against a real HTTP server on localhost: ports, the health probe and the wait for a server to come up."""

import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from swe_megatron.net import free_port, http_health, port_or_free, server_port, wait_healthy


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


def _a_non_loopback_address() -> str | None:
    """An IPv4 address of this host outside 127/8, or None (a host with loopback only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def test_a_port_held_on_another_address_of_this_host_is_not_free():
    """The servers and torch's rendezvous store listen on every address (0.0.0.0): a port that only 127.0.0.1 has
    free (another socket holds it on the host's network address, as NCCL's and gloo's connections do) fails them
    with EADDRINUSE. The H200 run of tests/train/test_gpu.py failed so (port 55175, 'failed to listen on any
    local network address')."""
    addr = _a_non_loopback_address()
    if addr is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    with socket.socket() as held:
        held.bind((addr, 0))
        held.listen()
        taken = held.getsockname()[1]
        assert port_or_free(taken) != taken
        assert server_port(taken, 0) != taken


def test_server_port_zero_is_a_real_free_port_the_caller_can_poll():
    """engine.port=0 (issue 42 item 2): each server gets a real port, never 0 (a server told port 0 binds one the
    driver cannot know and then polls port 0); a taken first port falls back to a free one too."""
    ports = [server_port(0, i) for i in range(3)]
    assert all(p > 0 for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free
    first = free_port()
    assert server_port(first, 0) == first
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        assert server_port(taken, 0) not in (taken, 0)


def test_probe_and_wait(server):
    assert http_health(server, 2, "/v1/health", {"Authorization": "Bearer t"}) is None
    assert http_health(server, 2, "/v1/health") == "HTTP 401"
    assert wait_healthy(server, None, 5, "/v1/health", {"Authorization": "Bearer t"}) is None
    assert wait_healthy(server, None, 0.3, interval_s=0.1).startswith("not healthy after 0 s (HTTP 401)")
    dead = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    assert wait_healthy(dead, proc, 60) == "exited (3)"


def _limits_after(soft: int, hard: int, need: int) -> str:
    """What raise_open_files(need) does in a fresh process started with these RLIMIT_NOFILE limits."""
    code = (
        "import resource; from swe_megatron.net import raise_open_files\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
        "try:\n"
        f"    raise_open_files({need}, 'agent.concurrency=1024')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_the_soft_open_files_limit_is_raised_to_the_hard_one():
    """A cluster job's soft limit of 1024 descriptors cannot hold a thousand episodes in flight."""
    assert _limits_after(1024, 8192, 4352).strip() == "(8192, 8192)"
    assert _limits_after(8192, 8192, 4352).strip() == "(8192, 8192)"  # enough already: untouched


def test_a_hard_open_files_limit_below_the_need_is_one_clear_error():
    out = _limits_after(1024, 2048, 4352)
    assert out.startswith("UsageError agent.concurrency=1024 needs about 4352 open files")
    assert "at most 2048" in out and "ulimit -n 4352" in out and out.endswith("(1024, 2048)\n")


def test_a_body_in_parts_is_sent_whole_with_its_length_and_no_joined_copy():
    """A 131k-token prompt's request is ~1 MB: sent as parts (the session's prompt text in the middle), with
    their total Content-Length, never chunked, never joined into a copy held for the whole turn."""
    from swe_megatron.net import ConnectionPool

    seen = []

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            n = int(self.headers["Content-Length"])
            seen.append((self.headers.get("Transfer-Encoding"), self.rfile.read(n)))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        pool = ConnectionPool("127.0.0.1", httpd.server_address[1], 5)
        middle = bytearray(b"1,2," * 100_000)
        for _ in range(2):  # the second on the kept connection
            assert pool.exchange("POST", "/x", (b'{"prompt": [', middle, b"]}")) == (200, b"ok")
        assert seen == [(None, b'{"prompt": [' + bytes(middle) + b"]}")] * 2
    finally:
        httpd.shutdown()


def test_server_i_of_a_group_is_at_first_plus_i_when_that_port_is_free():
    p = free_port()  # the OS just picked it, so it is free
    assert server_port(p) == p  # server 0 by default
    assert server_port(p - 2, 2) == p
    assert server_port(0, 3) != 0  # first 0: any free port

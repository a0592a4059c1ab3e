"""net.py's ConnectionPool against a real HTTP/1.1 server on localhost that counts what it receives, the health
probes against one that comes up late or hangs, and raise_open_files against a stand-in for the resource module."""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from swe_megatron import net
from swe_megatron.errors import UsageError
from swe_megatron.net import (
    ConnectionPool,
    free_port,
    http_health,
    raise_open_files,
    wait_healthy,
)

pytestmark = pytest.mark.timeout(60)
SLOW_S = 1.5


class QuietServer(ThreadingHTTPServer):
    """These tests drop connections on purpose: a handler thread that outlives its test and writes to a closed
    socket must not print socketserver's traceback into a later test's captured stderr (it failed a CLI test
    sharing the worker)."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


@pytest.fixture
def counting_server():
    """(pool factory, {path: requests received}): /ok answers at once and keeps the connection; /slow answers
    after SLOW_S; /drop closes the connection without an answer; /bye answers as kept-alive, then closes."""
    seen: Counter = Counter()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen[self.path] += 1
            seen[self.client_address] += 1  # one key per connection
            if self.path == "/drop":
                self.close_connection = True
                return
            if self.path == "/slow":
                time.sleep(SLOW_S)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            self.close_connection = self.path == "/bye"

        def finish(self):
            super().finish()
            seen["closed"] += 1  # the client closed the connection (or the server did)

        def log_message(self, *a):
            pass

    httpd = QuietServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    pools: list[ConnectionPool] = []

    def pool(timeout_s: float = 30.0) -> ConnectionPool:
        pools.append(ConnectionPool("127.0.0.1", httpd.server_address[1], timeout_s))
        return pools[-1]

    yield pool, seen
    for p in pools:
        p.close()
    httpd.shutdown()


def test_a_request_dropped_on_a_new_connection_is_not_sent_again(counting_server):
    pool, seen = counting_server
    with pytest.raises(http.client.RemoteDisconnected):
        pool().exchange("POST", "/drop", b"x")
    assert seen["/drop"] == 1


def test_a_timed_out_request_on_a_kept_connection_is_not_sent_again(counting_server):
    """The server may be working on it (a generation): a timeout is raised, never retried."""
    pool, seen = counting_server
    p = pool()
    assert p.exchange("POST", "/ok", b"x") == (200, b"ok")  # the connection is kept
    with pytest.raises(TimeoutError):
        p.exchange("POST", "/slow", b"x", timeout_s=0.3)
    time.sleep(0.2)
    assert seen["/slow"] == 1


def test_a_kept_connection_takes_each_requests_own_timeout(counting_server):
    pool, _ = counting_server
    p = pool(timeout_s=30.0)
    assert p.exchange("POST", "/ok", b"x") == (200, b"ok")
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        p.exchange("POST", "/slow", b"x", timeout_s=0.3)  # on a connection kept from a 30 s request
    assert time.monotonic() - start < SLOW_S
    short = pool(timeout_s=0.3)
    assert short.exchange("POST", "/ok", b"x", timeout_s=0.3) == (200, b"ok")
    assert short.exchange("POST", "/slow", b"x", timeout_s=10) == (200, b"ok")  # kept at 0.3 s, now 10 s


def test_a_kept_connection_the_server_closed_is_retried_once_on_a_new_one(counting_server):
    pool, seen = counting_server
    p = pool()
    assert p.exchange("POST", "/bye", b"x") == (200, b"ok")  # answered as kept, then closed by the server
    time.sleep(0.1)
    assert p.exchange("POST", "/ok", b"x") == (200, b"ok")
    assert seen["/ok"] == 1


class Limits:
    """A stand-in for the resource module: RLIMIT_NOFILE as plain numbers, every setrlimit recorded."""

    RLIMIT_NOFILE, RLIM_INFINITY = 7, -1

    def __init__(self, soft: int, hard: int):
        self.limits, self.set = (soft, hard), []

    def getrlimit(self, which):
        assert which == self.RLIMIT_NOFILE
        return self.limits

    def setrlimit(self, which, limits):
        assert which == self.RLIMIT_NOFILE
        self.set.append(limits)
        self.limits = limits


@pytest.mark.parametrize(
    "soft, hard, need, raised_to",
    [
        (4352, 8192, 4352, None),  # exactly enough: untouched
        (5000, 8192, 4352, None),
        (-1, -1, 4352, None),  # unlimited
        (1024, 8192, 4352, 8192),  # up to the hard limit
        (1024, 4352, 4352, 4352),
        (1024, -1, 4352, 1 << 16),  # no hard limit: 65536
        (1024, -1, 100_000, 100_000),
    ],
)
def test_the_open_files_limit_is_raised_only_when_short(monkeypatch, soft, hard, need, raised_to):
    fake = Limits(soft, hard)
    monkeypatch.setattr(net, "resource", fake)
    assert raise_open_files(need, "x") == (soft if raised_to is None else raised_to)
    assert fake.set == ([] if raised_to is None else [(raised_to, hard)])


def test_a_hard_limit_below_the_need_is_an_error_and_changes_nothing(monkeypatch):
    fake = Limits(1024, 4351)
    monkeypatch.setattr(net, "resource", fake)
    with pytest.raises(
        UsageError, match="needs about 4352 open files, but this process may open at most 4351"
    ):
        raise_open_files(4352, "agent.concurrency=1024")
    assert fake.set == []


def test_the_retry_takes_a_new_connection_not_another_kept_one(counting_server):
    """Every kept connection may be stale after the server closed them: the one retry goes on a new one."""
    pool, seen = counting_server
    p = pool()
    kept = [p.take(), p.take()]
    for conn in kept:
        conn.request("POST", "/bye", body=b"x")
        resp = conn.getresponse()
        resp.read()
        p.give(conn, resp)  # answered as kept-alive: back in the pool, then closed by the server
    time.sleep(0.1)
    assert p.exchange("POST", "/ok", b"x") == (200, b"ok")
    assert (seen["/bye"], seen["/ok"]) == (2, 1)


@pytest.fixture
def health_server():
    """(url, becomes_healthy_at): /health answers 503 until that monotonic time (now + 0.4 s), then 200;
    /hang reads the request and never answers."""
    ready_at = [time.monotonic() + 0.4]

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/hang":
                time.sleep(5)
                return
            ok = self.path == "/health" and time.monotonic() >= ready_at[0]
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    httpd = QuietServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", ready_at
    httpd.shutdown()


def _within(seconds: float, fn, *args):
    """fn(*args), failing the test if it has not returned after `seconds` (a probe that ignores its timeout)."""
    out: list = []
    th = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    th.start()
    th.join(seconds)
    assert out, f"{fn.__name__}{args} still waiting after {seconds} s"
    return out[0]


def test_the_health_probe_reads_health_by_default_and_says_why_not(health_server):
    url, ready_at = health_server
    assert http_health(url, 2) == "HTTP 503"
    ready_at[0] = 0
    assert http_health(url, 2) is None  # the default path is /health
    assert http_health(f"http://127.0.0.1:{free_port()}", 2) == "[Errno 111] Connection refused"  # the reason
    assert _within(3, http_health, url, 0.3, "/hang") == "timed out"  # an error without a reason: its text


def test_wait_healthy_polls_once_a_second_until_healthy_and_bounds_each_probe(health_server):
    url, _ = health_server
    start = time.monotonic()
    assert wait_healthy(url, None, 10) is None  # /health by default, healthy after 0.4 s: the second probe
    assert 0.9 < time.monotonic() - start < 1.8
    assert _within(5, wait_healthy, url, None, 0.3, "/hang") == "not healthy after 0 s (timed out)"


def test_a_free_port_is_one_the_os_picked():
    assert all(1024 <= free_port() < 65536 for _ in range(3))  # root may bind port 1: never ask for it


def test_requests_in_turn_share_one_kept_connection_and_the_pool_s_timeout_is_the_default(counting_server):
    pool, seen = counting_server
    p = pool()
    for _ in range(3):
        assert p.exchange("POST", "/ok", b"x") == (200, b"ok")
    assert [n for key, n in seen.items() if isinstance(key, tuple)] == [3]  # one connection for all three
    conn = p.take()
    assert conn.reused  # take() gives the kept one unless asked for a fresh one
    p.give(conn, SimpleNamespace(will_close=False))
    assert not p.take(fresh=True).reused
    with pytest.raises(TimeoutError):
        pool(timeout_s=0.3).exchange("POST", "/slow", b"x")  # no timeout of its own: the pool's


def test_close_closes_the_kept_connections(counting_server):
    pool, seen = counting_server
    p = pool()
    p.exchange("POST", "/ok", b"x")
    time.sleep(0.2)
    assert seen["closed"] == 0  # kept open for the next request
    p.close()
    deadline = time.monotonic() + 5
    while seen["closed"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen["closed"] == 1


def _second_request_lost(how: str):
    """A raw HTTP/1.1 server on localhost whose first connection answers its first request kept-alive and then, on
    the second request it reads, closes without an answer: `fin` (the client reads EOF: RemoteDisconnected) or
    `rst` (SO_LINGER 0: the client's read is reset, ConnectionResetError). Later connections answer every request.
    (port, requests read per connection, stop)."""
    import socket
    import struct

    srv = socket.create_server(("127.0.0.1", 0))
    reads: list[int] = []

    def request(conn, buf):
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        length = next((int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])
                       if k.strip().lower() == b"content-length"), 0)  # fmt: skip
        while len(rest) < length:
            rest += conn.recv(65536)
        return rest[length:]

    def serve(conn, first: bool):
        n = len(reads)
        reads.append(0)
        buf = b""
        with conn:
            while (buf := request(conn, buf)) is not None:
                reads[n] += 1
                if first and reads[n] == 2:
                    if how == "rst":
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def accept():
        first = True
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn, first), daemon=True).start()
            first = False

    threading.Thread(target=accept, daemon=True).start()
    return srv.getsockname()[1], reads, srv.close


@pytest.mark.parametrize(
    "how, lost", [("fin", http.client.RemoteDisconnected), ("rst", ConnectionResetError)]
)
def test_a_kept_connection_lost_at_the_answer_is_retried_on_a_new_one(how, lost):
    """A kept connection the server drops as the request arrives (its idle timeout racing the request) fails with
    `lost` (checked on a raw connection), and exchange() retries it once on a new connection."""
    port, reads, stop = _second_request_lost(how)
    try:
        raw = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for i in range(2):
            raw.request("POST", "/", body=b"x")
            if i == 0:
                assert raw.getresponse().read() == b"ok"
        with pytest.raises(lost):
            raw.getresponse()
        raw.close()
        port2, reads, stop2 = _second_request_lost(how)
        try:
            p = ConnectionPool("127.0.0.1", port2, 10.0)
            assert p.exchange("POST", "/", b"x") == (200, b"ok")
            # lost on the kept connection, answered on a new one
            assert p.exchange("POST", "/", b"x") == (200, b"ok")
            assert reads == [2, 1]
            p.close()
        finally:
            stop2()
    finally:
        stop()

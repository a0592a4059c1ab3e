"""The servers a run starts, seen from the network: free ports for them, HTTP health probes while they run, and
the kept-alive connections the run's clients share."""

from __future__ import annotations

import contextlib
import http.client
import queue
import resource
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

from swe_megatron.errors import UsageError

ANY_ADDRESS = ""
"""Ports are probed on every address of the host (0.0.0.0), as the servers and torch's rendezvous store listen:
a port free on 127.0.0.1 alone may be held on the host's network address (by NCCL's or gloo's connections), and
a listener on every address then fails with EADDRINUSE."""


def free_port() -> int:
    """A TCP port free on every address of this host right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((ANY_ADDRESS, 0))
        return s.getsockname()[1]


def port_or_free(port: int) -> int:
    """port if it is free on every address of this host right now, else any free port (another run may hold the
    usual one)."""
    with socket.socket() as s:
        try:
            s.bind((ANY_ADDRESS, port))
            return port
        except OSError:
            return free_port()


def server_port(first: int, i: int = 0) -> int:
    """The port of server i of a group configured to start at port `first`: first + i when free on localhost,
    else any free port (another run may hold it); first 0: any free port, as `sandbox-server --port 0` (a
    server told port 0 binds one the caller could not poll, so the port is picked here and passed explicitly)."""
    return free_port() if first == 0 else port_or_free(first + i)


def http_health(
    url: str, timeout_s: float, path: str = "/health", headers: Mapping[str, str] | None = None
) -> str | None:
    """None if GET url+path answers 200, else why not (HTTP status or connection error)."""
    req = urllib.request.Request(f"{url}{path}", headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return None if r.status == 200 else f"HTTP {r.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return str(getattr(e, "reason", e))


def wait_healthy(
    url: str,
    proc: subprocess.Popen | None,
    timeout_s: float,
    path: str = "/health",
    headers: Mapping[str, str] | None = None,
    interval_s: float = 1.0,
) -> str | None:
    """Poll http_health until it answers: None once healthy, else why not (proc exited, or timeout_s passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            return f"exited ({proc.returncode})"
        why = http_health(url, min(5.0, timeout_s), path, headers)
        if why is None:
            return None
        if time.monotonic() > deadline:
            return f"not healthy after {timeout_s:.0f} s ({why})"
        time.sleep(interval_s)


CONNECTION_LOST = (BrokenPipeError, ConnectionResetError)
"""What a request on a connection the server has closed raises (http.client.RemoteDisconnected, an EOF where the
answer should be, is a ConnectionResetError)."""


class ConnectionPool:
    """Kept-alive HTTP/1.1 connections to one server, shared by the threads that call it: take() an idle one (or
    a new one), give() it back once its answer is read. So a client holds at most one connection per request in
    flight, not one per thread and server (1024 episode threads x 16 servers would be 16k sockets)."""

    def __init__(self, host: str, port: int, timeout_s: float):
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._idle: queue.SimpleQueue[http.client.HTTPConnection] = queue.SimpleQueue()

    def take(self, fresh: bool = False, timeout_s: float | None = None) -> http.client.HTTPConnection:
        """An idle connection (fresh: a new one), its `reused` attribute saying which, with this timeout."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        conn = None
        if not fresh:
            with contextlib.suppress(queue.Empty):
                conn = self._idle.get_nowait()
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            conn.reused = False
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def give(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        """conn's answer `resp` is read: keep conn for the next request, unless the server closes it."""
        if resp.will_close:
            conn.close()
        else:
            conn.reused = True
            self._idle.put(conn)

    def exchange(
        self,
        method: str,
        path: str,
        body: bytes | tuple[bytes | bytearray, ...] | None = None,
        headers: dict | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, bytes]:
        """One request and its whole answer: (HTTP status, body). A kept connection that the server closed
        while it was idle is retried once on a new one (nothing was answered on it); any other failure is
        raised as it came (OSError or http.client.HTTPException), its connection closed.

        body: bytes, or a tuple of parts sent one after the other with their total Content-Length (no joined
        copy: a 131k-token prompt is ~1 MB that would otherwise be held for the whole turn)."""
        if isinstance(body, tuple):
            headers = {**(headers or {}), "Content-Length": str(sum(len(part) for part in body))}
        for attempt in (0, 1):
            conn = self.take(fresh=attempt > 0, timeout_s=timeout_s)
            try:
                conn.request(method, path, body=body, headers=headers or {})
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                if isinstance(e, CONNECTION_LOST) and conn.reused and attempt == 0:
                    continue
                raise
            self.give(conn, resp)
            return resp.status, raw
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the idle connections."""
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


def raise_open_files(need: int, what: str) -> int:
    """Let this process open at least `need` files: its soft RLIMIT_NOFILE goes up to the hard limit (as vLLM's
    server does; clusters often start jobs at a soft 1024, which a thousand episodes in flight pass at once).
    UsageError naming the fix when even the hard limit is lower. The soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    if hard != resource.RLIM_INFINITY and hard < need:
        raise UsageError(
            f"{what} needs about {need} open files, but this process may open at most {hard} (hard "
            f"RLIMIT_NOFILE, `ulimit -Hn`): raise it (`ulimit -n {need}` where the job starts, or ask the "
            "cluster's admins for a higher nofile limit), or lower the concurrency"
        )
    target = hard if hard != resource.RLIM_INFINITY else max(need, 1 << 16)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target

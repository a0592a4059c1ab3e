"""Client of the sandbox server: RemoteSandbox implements the Sandbox protocol over HTTP (sync API).

    client = SandboxClient("http://10.0.0.5:8760", token)
    with client.sandbox(SandboxSpec(repo_dir=..., image=...)) as sb:
        sb.exec("pytest -q", timeout_s=600)
    client.close()

One SandboxClient is one server session: while it lives, a background thread holds the session's attach
stream open, so the server knows the client is alive and stops all of the session's sandboxes as soon as
the client process goes away (or `close()` is called). Use it from many threads at once: they share a pool of
keep-alive HTTP connections (net.ConnectionPool: one per request in flight, not one per thread). Any failure of the server or the network raises SandboxError (an
infrastructure failure); file errors come back as the same OSError subclasses the backends raise.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.client
import json
import secrets
import socket
import threading
import time
from urllib.parse import urlsplit

from swe_megatron.net import CONNECTION_LOST, ConnectionPool
from swe_megatron.sandbox.base import ExecResult, SandboxError, SandboxSpec

SESSION_HEADER = "X-Sandbox-Session"
"""Request header naming the client session (the server stops a session's sandboxes when it ends)."""

FILE_ERRORS = {
    "FileNotFoundError": FileNotFoundError,
    "IsADirectoryError": IsADirectoryError,
    "NotADirectoryError": NotADirectoryError,
    "PermissionError": PermissionError,
    "OSError": OSError,
}
RECONNECT_S = 2.0


class SandboxClient:
    """A session with one sandbox server (see the module docstring)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 120.0,
        command_timeout_s: float = 900.0,
        attach: bool = True,
    ):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"sandbox server URL {url!r} must look like http://HOST:PORT")
        self.url = url
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s = timeout_s
        """Socket timeout of requests other than exec (start copies a repository: allow for it)."""
        self.command_timeout_s = command_timeout_s
        """Timeout assumed for exec calls that give none (the server applies its own default)."""
        self.token = token
        """The server's bearer token (a second process opens its own sessions with it)."""
        self.session = secrets.token_hex(12)
        """This client's session id; the server stops the session's sandboxes when it goes away."""
        self._headers = {"Authorization": f"Bearer {token}", SESSION_HEADER: self.session}
        self._pool = ConnectionPool(self.host, self.port, timeout_s)
        self.start_slots: threading.Semaphore | None = None
        """Sandbox starts this client has in flight at most: the server's max_starting, once health() has seen
        it (None: no limit). The server starts that many at a time and queues the rest; waiting here instead,
        a start's request timeout covers its own start, not the queue (at 1024 episodes in flight on 3 servers
        of this 2-core machine, 634 starts timed out in that queue: tools/sim_scale.py)."""
        self._closed = threading.Event()
        self._attach_conn: http.client.HTTPConnection | None = None
        self._attach_thread: threading.Thread | None = None
        if attach:
            self._attach_thread = threading.Thread(
                target=self._hold_session, name="sandbox-session", daemon=True
            )
            self._attach_thread.start()

    # -- HTTP ------------------------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        """One JSON request; SandboxError (or a file error) for anything but a 2xx answer."""
        if self._closed.is_set():
            raise SandboxError("the sandbox client is closed")
        payload = json.dumps(body).encode() if body is not None else None
        headers = dict(self._headers, **({"Content-Type": "application/json"} if payload is not None else {}))
        timeout = self.timeout_s if timeout is None else timeout
        try:
            status, raw = self._pool.exchange(method, path, payload, headers, timeout)
        except CONNECTION_LOST as e:
            raise SandboxError(f"sandbox server {self.url}: connection lost ({e})") from None
        except (OSError, http.client.HTTPException) as e:
            raise SandboxError(f"sandbox server {self.url} unreachable or not answering: {e}") from None
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"error": raw[:500].decode(errors="replace")}
        if 200 <= status < 300:
            return data
        message, kind = data.get("error", f"HTTP {status}"), data.get("type", "")
        if kind in FILE_ERRORS:
            raise FILE_ERRORS[kind](message)
        raise SandboxError(f"sandbox server {self.url}: {message} (HTTP {status})")

    def _hold_session(self) -> None:
        """Keep the attach stream open until close(); reconnect if it breaks while we live."""
        path = f"/v1/sessions/{self.session}/attach"
        while not self._closed.is_set():
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            self._attach_conn = conn
            try:
                conn.request("GET", path, headers=self._headers)
                resp = conn.getresponse()
                while resp.status == 200 and not self._closed.is_set() and resp.readline():
                    pass
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()
            self._closed.wait(RECONNECT_S)

    # -- API -------------------------------------------------------------------------------------------------

    def health(self, timeout: float | None = None) -> dict:
        """The server's status: running sandboxes, capacity, starts at once, backend (timeout: seconds, default
        timeout_s); sets start_slots the first time."""
        data = self.request("GET", "/v1/health", timeout=timeout)
        n = data.get("max_starting")
        if self.start_slots is None and isinstance(n, int) and n > 0:
            self.start_slots = threading.Semaphore(n)
        return data

    def sandbox(self, spec: SandboxSpec) -> RemoteSandbox:
        """A sandbox on this server (not started yet)."""
        return RemoteSandbox(spec, self)

    def heartbeat(self) -> None:
        """Renew the leases of this session's sandboxes (needed only with attach=False)."""
        self.request("POST", f"/v1/sessions/{self.session}/heartbeat", {})

    def close(self) -> None:
        """Stop every sandbox of this session on the server and end the session (idempotent)."""
        if self._closed.is_set():
            return
        with contextlib.suppress(SandboxError):
            self.request("DELETE", f"/v1/sessions/{self.session}")
        self._closed.set()
        self._pool.close()
        conn = self._attach_conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        if self._attach_thread is not None:
            self._attach_thread.join(timeout=5)

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteSandbox:
    """A sandbox on a sandbox server; the same protocol as the local backends."""

    def __init__(self, spec: SandboxSpec, client: SandboxClient):
        self.spec = spec
        self.client = client
        self.id: str | None = None
        """The server's id for this sandbox, once started."""

    def _path(self, what: str = "") -> str:
        if self.id is None:
            raise SandboxError("the remote sandbox is not started")
        return f"/v1/sandboxes/{self.id}{what}"

    def start(self) -> None:
        """Ask the server for the sandbox; SandboxError if it is full (429) or the start fails."""
        if self.id is None:
            slots = self.client.start_slots
            with slots if slots is not None else contextlib.nullcontext():
                answer = self.client.request("POST", "/v1/sandboxes", {"spec": dataclasses.asdict(self.spec)})
            self.id = answer["id"]

    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Run a command in the sandbox's persistent shell."""
        wait = (self.client.command_timeout_s if timeout_s is None else timeout_s) + 60.0
        t0 = time.monotonic()
        data = self.client.request(
            "POST", self._path("/exec"), {"command": command, "timeout_s": timeout_s}, wait
        )
        return ExecResult(
            output=base64.b64decode(data["output_b64"]),
            exit_code=data["exit_code"],
            timed_out=data["timed_out"],
            truncated=data["truncated"],
            duration_s=data.get("duration_s", time.monotonic() - t0),
            limits_hit=tuple(data.get("limits_hit", ())),
        )

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a repository file (or its last max_bytes bytes, cut on the server)."""
        body = {"path": path} if max_bytes is None else {"path": path, "max_bytes": int(max_bytes)}
        return base64.b64decode(self.client.request("POST", self._path("/read"), body)["data_b64"])

    def write_file(self, path: str, data: bytes) -> None:
        """Write a repository file."""
        body = {"path": path, "data_b64": base64.b64encode(data).decode()}
        self.client.request("POST", self._path("/write"), body)

    def host_patch(self, max_bytes: int) -> str:
        """The workspace's diff, taken on the server's host."""
        return self.client.request("POST", self._path("/host_patch"), {"max_bytes": int(max_bytes)}, 300)[
            "patch"
        ]

    def stop(self) -> None:
        """Stop the sandbox on the server (idempotent)."""
        if self.id is not None:
            sid, self.id = self.id, None
            self.client.request("DELETE", f"/v1/sandboxes/{sid}")

    def __enter__(self) -> RemoteSandbox:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

"""The servers a run starts, seen from the network: free ports for them, and HTTP health probes while they run."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping


def free_port() -> int:
    """A TCP port free on localhost right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_or_free(port: int) -> int:
    """port if it is free on localhost right now, else any free port (another run may hold the usual one)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            return free_port()


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

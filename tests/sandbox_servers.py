"""Real `swe-megatron sandbox-server` processes for the sandbox and routing tests, and whether this machine can
run them."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOKEN = "routing-test-token-0123456789"


def missing() -> str | None:
    """Why bwrap sandbox servers cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "sandbox servers drop from root to the swe-sandbox user: run as root"
    for tool in ("bwrap", "setpriv", "prlimit"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: run tools/sandbox_setup.sh"
    try:
        pwd.getpwnam("swe-sandbox")
    except KeyError:
        return "the swe-sandbox user does not exist: run tools/sandbox_setup.sh"
    return None


def token_file(folder: Path) -> Path:
    """TOKEN in a 0600 file under folder."""
    path = folder / "sandbox.token"
    path.write_text(TOKEN)
    path.chmod(0o600)
    return path


class SandboxServer:
    """A sandbox-server subprocess in its own process group, with its own workspace root."""

    def __init__(self, tmp: Path, max_concurrent: int = 2, *overrides: str):
        self.root = Path(tempfile.mkdtemp(prefix="swe-routing-test-", dir="/var/tmp"))
        self.root.chmod(0o711)  # the sandbox user must reach its workspaces
        cmd = [sys.executable, "-m", "swe_megatron.cli", "sandbox-server", "--port", "0",
               "--token-file", str(token_file(tmp)), "--max-concurrent", str(max_concurrent),
               "--config", "embedded", f"sandbox.workspace_root={self.root}", *overrides]  # fmt: skip
        self.log = tmp / f"server-{self.root.name}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
            )
        deadline, line = time.monotonic() + 60, ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if "listening on" in line or not line:
                break
        assert "listening on" in line, f"server did not start: {line}{self.log.read_text()[-2000:]}"
        self.url = line.split()[3]

    def client(self, **kw):
        """A SandboxClient of this server."""
        from swe_megatron.sandbox.client import SandboxClient

        return SandboxClient(self.url, TOKEN, **kw)

    def workspaces(self) -> list[Path]:
        """The sandbox workspaces that exist now."""
        return sorted(self.root.glob("sbx-*"))

    def kill(self) -> None:
        """SIGKILL the server process only (a crash: its sandboxes are left to their own fate)."""
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Stop the server and whatever it left behind."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)

"""A labelled test fake of the Sandbox protocol: plain subprocesses in a private copy of a directory.

Not isolated at all; it exists so the ACI can be unit-tested before/without bwrap. cwd and exported
variables persist between calls as a persistent shell's would.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from swe_megatron.sandbox.base import ExecResult, SandboxError, SandboxSpec
from swe_megatron.sandbox.host_diff import host_diff


class DirSandbox:
    """Runs each command with bash in a copy of `repo_dir`; `workdir` is that copy's real path."""

    def __init__(self, repo_dir: str | Path, output_cap: int = 65536):
        self._src = Path(repo_dir)
        self.output_cap = output_cap
        self.root: Path | None = Path(tempfile.mkdtemp(prefix="dirsandbox-"))
        self.fail_next = False
        self.spec = SandboxSpec(repo_dir=str(repo_dir), workdir=self.workdir)

    @property
    def workdir(self) -> str:
        assert self.root is not None
        return str(self.root / "repo")

    def start(self) -> None:
        assert self.root is not None, "a stopped DirSandbox cannot start again"
        shutil.copytree(self._src, self.root / "repo", symlinks=True)
        (self.root / "cwd").write_text(self.workdir)
        (self.root / "env").write_text("")

    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        if self.fail_next:
            raise SandboxError("fake sandbox crashed")
        if self.root is None:  # as the protocol says (an episode's deadline stops it from another thread)
            raise SandboxError("the sandbox was stopped")
        cwd = (self.root / "cwd").read_text().strip()
        script = (
            f"cd '{cwd}'; source '{self.root}/env' 2>/dev/null\n{command}\n"
            f"__rc=$?; pwd > '{self.root}/cwd'; export -p > '{self.root}/env'; exit $__rc"
        )
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                ["bash", "-c", script],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout_s,
            )
            out, code, timed_out = p.stdout, p.returncode, False
        except subprocess.TimeoutExpired as e:
            out, code, timed_out = e.stdout or b"", -1, True
        truncated = len(out) > self.output_cap
        if truncated:
            out = (
                out[: self.output_cap]
                + f"\n[output truncated: {len(out)} bytes, cap {self.output_cap}]".encode()
            )
        return ExecResult(out, code, timed_out, truncated, time.perf_counter() - t0)

    def _path(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.workdir) / p

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        data = self._path(path).read_bytes()
        return data if max_bytes is None else data[len(data) - min(max_bytes, len(data)) :]

    def write_file(self, path: str, data: bytes) -> None:
        self._path(path).write_bytes(data)

    def host_patch(self, max_bytes: int) -> str:
        if self.root is None:
            raise SandboxError("the sandbox was stopped")
        return host_diff(self._src, self.workdir, max_bytes)

    def stop(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

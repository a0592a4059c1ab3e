"""The sandbox protocol: where agent commands and grading run. Backends: bwrap, apptainer, local.

Agent commands are untrusted code: in the default backends they never run as root, never outside a
sandbox, and never see the network or host files (design.md invariant 7).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol


@dataclass
class ExecResult:
    """What one command did."""

    output: bytes
    """stdout and stderr merged, cut at the output cap (a visible notice marks the cut)."""
    exit_code: int
    """The command's exit status: -1 when it timed out, 128+N when signal N ended it (152: CPU limit)."""
    timed_out: bool = False
    """The wall-clock limit ended it."""
    truncated: bool = False
    """Output went past the cap and was cut."""
    duration_s: float = 0.0
    """Wall-clock seconds."""
    limits_hit: tuple[str, ...] = ()
    """Sandbox-wide limits reached while it ran: "memory" (the OOM killer ended a process of the sandbox),
    "processes", "disk" (the workspace is full); a notice in the output says the same."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the command inside it): an infrastructure failure."""


class SandboxServerLost(SandboxError):
    """The sandbox server holding the sandbox stopped answering (a failed request, then a failed health probe):
    a failure outside the sandbox, which nothing run inside it can cause (grading/exclusion.py)."""


class NoFreeSlot(SandboxError):
    """A sandbox made ahead of need (see `ahead_of_need`) found no sandbox server slot to spare: it is not
    made, and the caller makes one when it is needed."""


_reserve: contextvars.ContextVar[int | None] = contextvars.ContextVar("sandbox_slot_reserve", default=None)


@contextlib.contextmanager
def ahead_of_need(reserve: int) -> Iterator[None]:
    """Sandboxes made inside (on this thread) are speculative: a factory whose servers have limited slots
    (rollout.routing.SandboxPool) never waits for a slot, places one only while the speculative sandboxes not
    yet in use leave `reserve` slots to the sandboxes needed now, and raises NoFreeSlot otherwise. Such a
    sandbox that has a `claim()` method is claimed when handed to its user (it then counts as needed)."""
    token = _reserve.set(max(0, reserve))
    try:
        yield
    finally:
        _reserve.reset(token)


def slot_reserve() -> int | None:
    """The `reserve` of the enclosing ahead_of_need() (None outside one: the sandbox is needed now)."""
    return _reserve.get()


class Sandbox(Protocol):
    """One isolated workspace holding a task's repository, with a persistent shell."""

    def start(self) -> None:
        """Create the sandbox and its shell; raises SandboxError on failure."""

    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Run a shell command in the persistent shell (cwd and environment persist between calls).

        timeout_s=None means sandbox.command_timeout_s. On timeout the command and every process it
        started are killed (timed_out=True, exit_code=-1); the shell keeps its cwd and exported
        variables. Raises SandboxError only when the sandbox itself fails or was stopped.
        """

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a file of the repository (path relative to it, or absolute under the sandbox's workdir);
        max_bytes: only its last max_bytes bytes (what a sandbox wrote is untrusted: never read it whole).

        Raises FileNotFoundError, IsADirectoryError, or PermissionError for a path (or a symlink on
        the way) that leaves the repository; SandboxError when the sandbox itself fails.
        """

    def write_file(self, path: str, data: bytes) -> None:
        """Write (create or replace) a file of the repository, creating missing parent folders.

        Same paths and errors as read_file; the file belongs to the sandbox user afterwards.
        """

    def host_patch(self, max_bytes: int) -> str:
        """The workspace's changes against `SandboxSpec.repo_dir` as a git diff, computed on the host without
        running anything (sandbox/host_diff.py): the patch of a sandbox whose shell cannot start again. ''
        when it is over max_bytes; SandboxError when the sandbox was stopped or cannot be reached."""

    def stop(self) -> None:
        """Kill everything in the sandbox and remove its writable state; idempotent."""


@dataclass
class SandboxSpec:
    """What a sandbox is made from. Backends copy `repo_dir` (apptainer without one: the image's own `workdir`)
    into a private writable workspace."""

    repo_dir: str
    """Host path of the task's git repository (buggy state); copied into the sandbox, never written in place.
    "" for a task whose image holds its repository at workdir (apptainer only: a SWE-bench/SWE-rebench image)."""
    workdir: str = "/testbed"
    """Where the repository appears inside the sandbox (SWE-bench/SWE-rebench convention)."""
    env_dir: str | None = None
    """bwrap/local: host path of the task's Python environment, bound read-only at /opt/venv and put on PATH."""
    image: str | None = None
    """apptainer: the task's SIF image (holds the environment; the repository is overlaid at workdir)."""
    env: dict[str, str] | None = None
    """Extra environment variables, exported in the shell when it starts (and again if it restarts)."""
    setup: tuple[str, ...] = ()
    """Shell lines the shell runs when it starts (and again if it restarts), output discarded, before it enters
    workdir: the task image's environment activation (`source /opt/miniconda3/bin/activate`, `conda activate
    testbed`, exports), so the agent's `python` is the one the task's tests run with (tasks/plan.py)."""

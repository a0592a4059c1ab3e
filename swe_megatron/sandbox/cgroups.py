"""A cgroup per sandbox: memory and processes of all of a sandbox's processes together.

cgroup v2 where this process may use the memory and pids controllers below its own cgroup (root, or a
delegated subtree: the parent's cgroup.subtree_control must already enable them); otherwise cgroup v1's
memory and pids hierarchies (root hosts that mount them). The sandbox's group is made below this process's
own cgroup, so the job's limits (Slurm, a container) still hold above it. The launcher's first process
joins the group before anything of the sandbox runs (`enter_argv`), so every process of the sandbox is in
it. Where no group can be made (not root and no delegation, e.g. inside Apptainer without cgroup
delegation) `SandboxCgroup.create` returns None and logs a warning once: memory is then limited per process
only (RLIMIT_AS) and processes per uid (RLIMIT_NPROC).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "swe-"  # + the workspace folder's name (sbx-XXXX)
_STALE_S = 60.0
_ENTER = 'for f in "$@"; do shift; [ "$f" = -- ] && break; echo $$ >"$f" || exit 125; done; exec "$@"'
_warned: set[str] = set()


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, fs type, super options) of each cgroup mount."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                out.append((fields[4], fields[3], tail[0], set(tail[2].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" its v2 path (/proc/self/cgroup)."""
    paths = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _under(mount: str, root: str, path: str) -> Path:
    rel = path[len(root) :] if root != "/" and path.startswith(root) else path
    return Path(mount) / rel.lstrip("/")


def parents() -> tuple[str, list[Path]] | None:
    """("v2", [folder]) or ("v1", [memory folder, pids folder]) where sandbox groups are made, or None."""
    own, mounts = _own_paths(), _mounts()
    for mount, root, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            folder = _under(mount, root, own[""])
            with contextlib.suppress(OSError):
                enabled = set((folder / "cgroup.subtree_control").read_text().split())
                if {"memory", "pids"} <= enabled and os.access(folder, os.W_OK):
                    return "v2", [folder]
    found = []
    for controller in ("memory", "pids"):
        for mount, root, fstype, opts in mounts:
            if fstype == "cgroup" and controller in opts and controller in own:
                folder = _under(mount, root, own[controller])
                if os.access(folder, os.W_OK):
                    found.append(folder)
                    break
    return ("v1", found) if len(found) == 2 else None


class SandboxCgroup:
    """The cgroup (one folder in v2, a memory and a pids folder in v1) of one sandbox."""

    def __init__(self, version: str, folders: list[Path]):
        self.version = version
        """"v2" or "v1"."""
        self.folders = folders
        """v2: [the group]; v1: [memory group, pids group]."""
        self._fds: dict[Path, int] = {}  # event files kept open: read after every command (see _count)

    @classmethod
    def create(cls, name: str, memory_bytes: int, max_processes: int) -> SandboxCgroup | None:
        """A new group `PREFIX + name` with these limits; None (warned once) where cgroups cannot be used."""
        where = parents()
        if where is None:
            warn_once(
                "no cgroup for sandboxes (needs root with cgroup v1 memory+pids, or a cgroup v2 subtree with "
                "memory and pids delegated to this process): sandbox.memory_mb holds per process only"
            )
            return None
        version, bases = where
        folders = [base / f"{PREFIX}{name}" for base in bases]
        group = cls(version, [])
        try:
            for folder in folders:
                folder.mkdir()
                group.folders.append(folder)
            if version == "v2":
                (folders[0] / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (folders[0] / "memory.swap.max").write_text("0")
                (folders[0] / "pids.max").write_text(str(max_processes))
            else:
                (folders[0] / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):  # only with swap accounting
                    (folders[0] / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                (folders[1] / "pids.max").write_text(str(max_processes))
        except OSError as e:
            group.remove()
            warn_once(
                f"cannot make a cgroup under {bases[0]} ({e}): sandbox.memory_mb holds per process only"
            )
            return None
        return group

    def enter_argv(self) -> list[str]:
        """argv prefix: the first process joins the group, then execs the command appended to it."""
        return ["/bin/sh", "-c", _ENTER, "swe-cgroup", *(str(f / "cgroup.procs") for f in self.folders), "--"]

    def events(self) -> dict[str, int]:
        """Times a limit was hit so far: {"memory": processes the OOM killer ended, "processes": forks refused}."""
        memory_file = "memory.events" if self.version == "v2" else "memory.oom_control"
        return {
            "memory": self._count(self.folders[0] / memory_file, "oom_kill"),
            "processes": self._count(self.folders[-1] / "pids.events", "max"),
        }

    def _count(self, path: Path, key: str) -> int:
        """The value of `key` in a cgroup event file (0 if absent), through a descriptor kept open: a pread
        from offset 0 re-reads the file's current values, where opening and decoding it each time took ~0.5 ms
        (4 reads per command: most of what the limits added to a builtin command)."""
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return 0
        with contextlib.suppress(OSError, ValueError):
            for line in os.pread(fd, 4096, 0).split(b"\n"):
                k, _, v = line.partition(b" ")
                if k == key.encode():
                    return int(v)
        return 0

    def kill(self) -> None:
        """SIGKILL every process still in the group."""
        for folder in self.folders:
            with contextlib.suppress(OSError):
                for pid in (folder / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)

    def remove(self) -> None:
        """Kill what is left and remove the group (never raises; a group that stays is logged)."""
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        for folder in self.folders:
            for attempt in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or attempt == 49:
                        log.warning("cannot remove the sandbox cgroup %s: %s", folder, e)
                        break
                    self.kill()
                    time.sleep(0.02)
        self.folders = []


def sweep_stale_groups() -> None:
    """Remove empty sandbox groups that crashed processes left (a group with processes cannot be removed)."""
    where = parents()
    for base in where[1] if where else []:
        with contextlib.suppress(OSError):
            for folder in base.iterdir():
                if folder.name.startswith(PREFIX) and time.time() - folder.stat().st_mtime > _STALE_S:
                    with contextlib.suppress(OSError):
                        folder.rmdir()


def warn_once(message: str) -> None:
    """Log a warning the first time this process meets it."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message)

"""One live driver per run folder: RUN/driver.lock, held with flock() by the process that owns the folder.

    lock = RunLock.take(run_dir)    # UsageError naming the live driver (pid, host, how to stop it) if held
    holder(run_dir)                 # who holds it now ({"pid", "host", "started", "command"}), or None

The owner is the driver, trainer rank 0 (pipeline/spmd.py): only it writes the folder and starts servers; the
other ranks never take the lock. RUN/driver.json (written atomically once the lock is held) names the owner.
The kernel drops the lock when the owner ends in any way, SIGKILL included, so a killed run's folder can be
resumed at once, and only a start that holds the lock reaps the servers a killed driver left
(topology/pids.json): never those of a live run.

Limits. flock is advisory: only swe-megatron's own commands honour it. Local filesystems: exact. NFS: Linux
emulates flock with NFS byte-range locks (NLM on v3, part of the protocol on v4), so it holds between nodes; a
node that dies while holding it keeps it until the server's lease runs out (NFSv4: about 90 s), so a requeued
job may be refused for that long. Lustre: only with the `flock` mount option (`localflock` locks per node). A
filesystem that refuses locks is refused with one line (two drivers there could not be told apart).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from swe_megatron.atomic_write import write_json_atomic
from swe_megatron.errors import UsageError

LOCK_FILE = "driver.lock"
"""RUN/driver.lock: the file the owner holds an exclusive flock on (its content is unused)."""
OWNER_FILE = "driver.json"
"""RUN/driver.json: who took the lock last (pid, host, start time, command); stale once the lock is free."""

_held: dict[Path, RunLock] = {}
"""The locks this process holds, by resolved run folder (taking one twice returns the same)."""


def _owner(root: Path) -> dict:
    try:
        owner = json.loads((root / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _busy(fd: int, kind: int) -> bool:
    """Try flock(kind | LOCK_NB) on fd: False when taken, True when another open file holds a conflicting lock."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise UsageError(
                f"run_dir={_fd_path(fd)}: this filesystem refuses file locks ({e.strerror}), so a second run in "
                "the same folder could not be refused; put run_dir on a local disk, NFS with locking, or Lustre "
                "mounted with -o flock"
            ) from None
        raise
    return False


def _fd_path(fd: int) -> str:
    """The folder of an open lock file, for messages."""
    return str(Path(os.readlink(f"/proc/self/fd/{fd}")).parent)


def holder(root: str | Path) -> dict | None:
    """The live owner of run folder root ({"pid", "host", "started", "command"}: what it wrote, maybe {}), or None
    when no process holds its lock. Writes nothing (a folder without a lock file has no owner)."""
    path = Path(root) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        if not _busy(fd, fcntl.LOCK_SH):
            return None
    finally:
        os.close(fd)  # drops the probe's shared lock too
    return _owner(Path(root))


def describe(owner: dict) -> str:
    """A live owner in words: `pid 123 on host h since 2026-01-01 10:00:00`."""
    if not owner:
        return "another process (it wrote no driver.json yet)"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("started", 0)))
    return f"pid {owner.get('pid')} on host {owner.get('host')} since {started}"


class RunLock:
    """The exclusive lock on one run folder, held until release() or the end of this process."""

    def __init__(self, root: Path, fd: int):
        self.root, self._fd = root, fd

    @classmethod
    def take(cls, root: str | Path, wait_s: float = 2.0) -> RunLock:
        """Lock run folder root (created if missing) for this process, or UsageError naming the live owner.

        wait_s: how long a held lock is retried first: `holder()` (swe-megatron status) holds a shared lock for
        an instant, which must not refuse a start."""
        root = Path(root)
        key = root.resolve()
        if key in _held:
            return _held[key]
        root.mkdir(parents=True, exist_ok=True)
        # O_CLOEXEC: a server started with exec does not inherit the lock and keep it after the driver dies.
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + wait_s
        try:
            while _busy(fd, fcntl.LOCK_EX):
                if time.monotonic() >= deadline:
                    owner = _owner(root)
                    pid = owner.get("pid", "PID")
                    raise UsageError(
                        f"run_dir={root} is in use by a live run ({describe(owner)}); a folder holds one run at a "
                        f"time: wait for it to end, stop it with Ctrl-C in its terminal or `kill -INT {pid}` on "
                        f"{owner.get('host', 'its host')} (rerunning then resumes it), or use another run_dir=..."
                    )
                time.sleep(0.1)
        except BaseException:
            os.close(fd)
            raise
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "command": shlex.join(sys.argv)}  # fmt: skip
        write_json_atomic(root / OWNER_FILE, me, indent=1)
        lock = _held[key] = cls(root, fd)
        return lock

    def release(self) -> None:
        """Give the folder up (closing the file drops the flock); idempotent."""
        if self._fd >= 0:
            _held.pop(self.root.resolve(), None)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def release(root: str | Path) -> None:
    """Release this process's lock on run folder root, if it holds one."""
    lock = _held.get(Path(root).resolve())
    if lock is not None:
        lock.release()

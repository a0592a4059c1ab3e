"""Which host uid a sandbox runs as.

Run as root, each live sandbox gets its own uid from the subordinate-uid range reserved for the sandbox
user in /etc/subuid (tools/sandbox_setup.sh reserves it). RLIMIT_NPROC is counted per uid, so a fork
bomb in one sandbox exhausts only its own process budget, and sandboxes cannot signal each other's
processes. A uid is held through an flock on a file under the workspace root, so two processes (two
servers, a test run beside a server) never hand out the same uid, and a crashed owner frees it.
Without a subuid range every sandbox shares the sandbox user's own uid (and its process budget).
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from swe_megatron.sandbox.base import SandboxError

SETUP_HINT = "run tools/sandbox_setup.sh as root"


@dataclass
class SandboxUser:
    """A uid/gid leased to one sandbox; `release()` gives it back."""

    name: str
    """The sandbox user's name (also the name inside the sandbox)."""
    uid: int
    """Host uid the sandbox's processes run as."""
    gid: int
    """Host gid (the sandbox user's primary group)."""
    lock_fd: int | None = None
    """The flock holding this uid, or None when not leased (shared uid, or not root)."""

    def release(self) -> None:
        """Free the uid for other sandboxes (idempotent)."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def current_user() -> SandboxUser:
    """This process's own identity (non-root runs, the local backend)."""
    uid, gid = os.getuid(), os.getgid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid{uid}"
    return SandboxUser(name, uid, gid)


def subuid_range(name: str, uid: int, path: str = "/etc/subuid") -> tuple[int, int] | None:
    """(first uid, count) reserved for a user in /etc/subuid, or None."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.strip().split(":")
        if len(fields) == 3 and fields[0] in (name, str(uid)) and fields[1].isdigit() and fields[2].isdigit():
            return int(fields[1]), int(fields[2])
    return None


def lookup_user(name: str) -> SandboxUser:
    """The sandbox user's own uid/gid; SandboxError naming the fix when it does not exist."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise SandboxError(f"the sandbox user {name!r} does not exist: {SETUP_HINT}") from None
    if pw.pw_uid == 0 or pw.pw_gid == 0:
        raise SandboxError(f"the sandbox user {name!r} has uid/gid 0; it must be an unprivileged user")
    return SandboxUser(name, pw.pw_uid, pw.pw_gid)


def _busy_uids() -> set[int]:
    """Uids that own a live process (e.g. one left by a crashed owner): one pass over /proc."""
    uids = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                uids.add(entry.stat().st_uid)
            except OSError:
                continue
    return uids


def lease_user(name: str, lock_dir: str | Path, *, per_sandbox: bool = True) -> SandboxUser:
    """Lease a uid for one sandbox (root only): a free one from the user's subuid range, else the user's own."""
    base = lookup_user(name)
    try:
        grp.getgrgid(base.gid)
    except KeyError:
        raise SandboxError(f"the primary group {base.gid} of {name!r} does not exist: {SETUP_HINT}") from None
    span = subuid_range(name, base.uid) if per_sandbox else None
    if span is None:
        return base
    lock_dir = Path(lock_dir)
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    start, count = span
    busy: set[int] | None = None  # one /proc scan skips every busy uid; the one we keep is checked afresh
    for uid in range(start, start + count):
        fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        fresh = busy is None
        if fresh:
            busy = _busy_uids()
        if uid in busy or (not fresh and uid in _busy_uids()):
            os.close(fd)
            continue
        return SandboxUser(name, uid, base.gid, fd)
    raise SandboxError(f"all {count} sandbox uids of {name!r} in /etc/subuid are in use; stop some sandboxes")

"""A sandbox's private, writable copy of its repository on the host, and safe host-side file access.

Layout: ROOT/sbx-XXXX/ (mode 0711) holds `.lock` (flocked by the owning process while the sandbox
lives), `repo/` (the copy, owned by the sandbox's uid, mode 0700, bound at the sandbox's workdir; run as
root, a tmpfs of sandbox.workspace_mb, the sandbox's disk cap) and whatever else the backend needs (bwrap's
generated /etc files). A folder whose lock nobody holds was
left by a crashed process and is removed by `sweep_stale`.

The agent controls everything under `repo/`, symlinks included, and the host side (often root) reads
and writes there for read_file/write_file. So paths are never handed to the kernel's resolver: `_walk`
opens one component at a time with O_NOFOLLOW relative to the previous folder's fd and resolves
symlinks itself, the way the sandbox would see them (absolute targets under the workdir map into the
repository), refusing any path that leaves the repository. Files not owned by the sandbox user, or
with other hard links, are refused too.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import shutil
import stat
import struct
import tempfile
import time
from pathlib import Path

from swe_megatron.sandbox.base import SandboxError
from swe_megatron.sandbox.cgroups import warn_once
from swe_megatron.sandbox.git_history import cut_to_head

LOCK_NAME = ".lock"
MAX_SYMLINK_HOPS = 40
STALE_GRACE_S = 60.0  # a younger folder may still be being created
_MAX_DEPTH = 32  # remove_tree: folders open at once (deeper ones are moved up first)
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS = 0x80086601, 0x40086602  # linux/fs.h (the flags are an int)
_FROZEN = 0x00000010 | 0x00000020  # FS_IMMUTABLE_FL | FS_APPEND_FL

_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2  # sys/mount.h
_libc = ctypes.CDLL(None, use_errno=True)

log = logging.getLogger(__name__)


def _copy_tree(src: Path, dst: Path, uid: int, gid: int) -> None:
    """Copy a repository: folders, regular files and symlinks (never followed); other file types skipped.

    Owner becomes uid:gid, setuid/setgid bits are dropped, modification times are kept (git's index).
    Plain string paths: this runs for every file of every sandbox start.
    """
    dirs: list[tuple[str, os.stat_result]] = []
    src_s, dst_s = os.fspath(src), os.fspath(dst)
    for dirpath, dirnames, filenames in os.walk(src_s, followlinks=False):
        rel = os.path.relpath(dirpath, src_s)
        out = dst_s if rel == "." else os.path.join(dst_s, rel)
        for name in dirnames + filenames:
            s, d = os.path.join(dirpath, name), os.path.join(out, name)
            st = os.lstat(s)
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(d, 0o700)
                dirs.append((d, st))
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(s), d)
            elif stat.S_ISREG(st.st_mode):
                shutil.copyfile(s, d, follow_symlinks=False)
                os.chmod(d, stat.S_IMODE(st.st_mode) & 0o777)
            else:
                continue  # fifos, sockets, device nodes have no business in a repository copy
            os.lchown(d, uid, gid)
            if not stat.S_ISDIR(st.st_mode):
                os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    for d, st in reversed(dirs):  # children first, so their creation does not touch the times again
        os.chmod(d, (stat.S_IMODE(st.st_mode) & 0o777) | 0o700)
        os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))


def _open_dir(name: str, dir_fd: int) -> int:
    """Open a folder entry without following symlinks; as its non-root owner, a chmod 000 one too."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        if os.geteuid() == 0:
            raise
        os.chmod(name, 0o700, dir_fd=dir_fd)  # lstat said folder; nothing in the sandbox runs any more
        return os.open(name, flags, dir_fd=dir_fd)


def _thaw(fd: int) -> None:
    """Clear the immutable and append-only flags of an open file or folder (root), so it can go."""
    with contextlib.suppress(OSError):
        flags = struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 4))[0]
        if flags & _FROZEN:
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags & ~_FROZEN))


def _unlink(name: str, dir_fd: int, folder: bool) -> None:
    """Remove one entry (an empty folder, or anything else); when refused, make it removable and retry:
    root clears immutable/append-only flags of it and its folder, an owner gives itself write access."""
    remove = os.rmdir if folder else os.unlink
    try:
        return remove(name, dir_fd=dir_fd)
    except PermissionError:
        pass
    if os.geteuid() == 0:
        _thaw(dir_fd)
        with contextlib.suppress(OSError):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                _thaw(fd)
            finally:
                os.close(fd)
    else:
        with contextlib.suppress(OSError):
            os.fchmod(dir_fd, 0o700)
    remove(name, dir_fd=dir_fd)


def _remove_folder(parent_fd: int, name: str) -> None:
    """Remove folder `name` of parent_fd with everything in it; raises OSError where something stays.

    No recursion and a bounded number of open fds, whatever the depth: a folder found _MAX_DEPTH levels
    down is first moved up into the top folder under a fresh name and emptied later from there.
    """
    chain: list[tuple[int, str, list[str]]] = []  # open folders: (fd, name in its parent, entries left)
    moved = 0
    try:
        fd = _open_dir(name, parent_fd)
        chain.append((fd, name, os.listdir(fd)))
        while chain:
            fd, _, todo = chain[-1]
            descend = None
            while todo and descend is None:
                entry = todo.pop()
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    _unlink(entry, fd, folder=False)
                elif len(chain) < _MAX_DEPTH:
                    descend = entry
                else:
                    moved += 1
                    fresh = f".rm-{moved}"
                    os.rename(entry, fresh, src_dir_fd=fd, dst_dir_fd=chain[0][0])
                    chain[0][2].append(fresh)
            if descend is not None:
                sub = _open_dir(descend, fd)
                chain.append((sub, descend, os.listdir(sub)))
                continue
            fd, done, _ = chain.pop()
            os.close(fd)
            _unlink(done, chain[-1][0] if chain else parent_fd, folder=True)
    finally:
        for fd, _, _ in chain:
            os.close(fd)


def remove_tree(path: str | Path) -> bool:
    """Remove a file or folder tree; True when it is gone. Never raises and never follows symlinks, whatever
    the agent left there: any depth, chmod 000 folders, read-only, immutable or append-only files, sockets,
    fifos. What cannot be removed is logged (a later sweep_stale tries again)."""
    path = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(path)
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError as e:
        log.warning("cannot remove %s: %s", path, e)
        return False
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            _remove_folder(parent_fd, name)
        else:
            _unlink(name, parent_fd, folder=False)
        return True
    except FileNotFoundError:
        return not os.path.lexists(path)
    except (OSError, ValueError) as e:
        log.warning("cannot remove %s (left for a later sweep): %s", path, e)
        return False
    finally:
        os.close(parent_fd)


def _mount_tmpfs(path: Path, size_mb: int, uid: int, gid: int) -> bool:
    """Mount a tmpfs of size_mb at path, owned by uid:gid (root): True; elsewhere warn once, return False."""
    if os.geteuid() != 0:
        warn_once("not root: sandbox.workspace_mb is not enforced (no tmpfs), only sandbox.max_file_mb")
        return False
    opts = f"size={size_mb}m,mode=0700,uid={uid},gid={gid},nr_inodes={max(size_mb, 1) * 256}"
    if _libc.mount(b"swe-sandbox", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot mount a tmpfs for the workspace: {os.strerror(err)}", str(path))
    return True


def unmount(path: Path) -> bool:
    """Detach a mount at path if there is one (what was in it is freed); True if one was there."""
    if not os.path.ismount(path):
        return False
    if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
        log.warning("cannot unmount %s: %s", path, os.strerror(ctypes.get_errno()))
        return False
    return True


def sweep_stale(root: str | Path) -> list[Path]:
    """Remove workspaces under root whose owning process is gone; returns what was removed. Never raises:
    a workspace that cannot be removed (or read) is logged and left for the next sweep."""
    removed: list[Path] = []
    root = Path(root)
    try:
        entries = list(root.iterdir()) if root.is_dir() else []
    except OSError as e:
        log.warning("cannot sweep %s: %s", root, e)
        return removed
    for entry in entries:
        try:
            if _is_stale(entry):
                unmount(entry / "repo")  # a workspace tmpfs (workspace_mb)
                if remove_tree(entry):
                    removed.append(entry)
        except Exception as e:  # noqa: BLE001 - one bad folder must not stop a sandbox from starting
            log.warning("cannot sweep %s: %s", entry, e)
    return removed


def _is_stale(entry: Path) -> bool:
    """A workspace folder old enough to be complete whose lock nobody holds (or that has no lock)."""
    if not entry.name.startswith("sbx-"):
        return False
    st = entry.lstat()
    if not stat.S_ISDIR(st.st_mode) or time.time() - st.st_mtime < STALE_GRACE_S:
        return False  # young: perhaps being created right now, before its lock is taken
    try:
        fd = os.open(entry / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # alive
    finally:
        os.close(fd)
    return True


class Workspace:
    """One sandbox's folder on the host; `repo` is what the sandbox sees at `mount_point`."""

    def __init__(self, folder: Path, uid: int, gid: int, mount_point: str, lock_fd: int):
        self.folder = folder
        """ROOT/sbx-XXXX: the workspace's own folder."""
        self.repo = folder / "repo"
        """The repository copy (bound at mount_point inside the sandbox)."""
        self.uid, self.gid = uid, gid
        self.mount_point = mount_point.rstrip("/") or "/"
        self.disk_capped = False
        """`repo` is a tmpfs of its own (sandbox.workspace_mb)."""
        self._lock_fd: int | None = lock_fd

    @classmethod
    def create(
        cls, repo_dir: str, root: str, uid: int, gid: int, mount_point: str, disk_mb: int = 0
    ) -> Workspace:
        """Copy repo_dir into a new workspace under root owned by uid:gid; SandboxError on failure.

        disk_mb > 0: `repo` is a tmpfs of that size (root only; elsewhere a warning, and only the per-file
        limit holds), so the copy and everything the sandbox writes there share one cap."""
        if not repo_dir:  # Path("") is the current folder: never copy that in its place
            raise SandboxError(
                "SandboxSpec.repo_dir is empty: the task's repository is in its image (SWE-bench/SWE-rebench "
                "rows), which only sandbox.backend=apptainer opens; bwrap and local run tasks with a host repository"
            )
        src = Path(repo_dir)
        if not src.is_dir():
            raise SandboxError(f"repository {repo_dir!r} is not a folder (SandboxSpec.repo_dir)")
        root_path = Path(root)
        try:
            root_path.mkdir(mode=0o711, parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix="sbx-", dir=root_path))
            lock_fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            os.chmod(folder, 0o711)  # the sandbox uid must traverse it to reach repo/
        except OSError as e:
            raise SandboxError(
                f"cannot create a workspace under {root} (sandbox.workspace_root): {e}"
            ) from None
        ws = cls(folder, uid, gid, mount_point, lock_fd)
        try:
            os.mkdir(ws.repo, 0o700)
            if disk_mb > 0:
                ws.disk_capped = _mount_tmpfs(ws.repo, disk_mb, uid, gid)
            _copy_tree(src, ws.repo, uid, gid)
            os.chown(ws.repo, uid, gid)
            cut_to_head(ws.repo, uid, gid)  # nothing after the base commit (git_history.py)
        except SandboxError:
            ws.remove()
            raise
        except OSError as e:
            ws.remove()
            hint = f" (more than sandbox.workspace_mb={disk_mb})" if e.errno == errno.ENOSPC else ""
            raise SandboxError(f"cannot copy repository {repo_dir} into the workspace{hint}: {e}") from None
        return ws

    def remove(self) -> bool:
        """Delete the workspace and free its lock (idempotent, never raises); False when something stayed
        (logged; sweep_stale removes it later, since the lock is free)."""
        try:
            unmount(self.repo)
            return remove_tree(self.folder)
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # -- safe access ---------------------------------------------------------------------------------------

    def _parts(self, path: str) -> tuple[bool, list[str]]:
        """(absolute?, components relative to the repository) of a path as the sandbox names it."""
        if path.startswith("/"):
            mp = self.mount_point
            if path != mp and not path.startswith(mp + "/"):
                raise PermissionError(errno.EACCES, f"outside the repository ({self.mount_point})", path)
            path = path[len(mp) :]
            return True, [p for p in path.split("/") if p]
        return False, [p for p in path.split("/") if p]

    def _walk(self, path: str, *, create_dirs: bool) -> tuple[int, str]:
        """Resolve path to (fd of its parent folder, last name), symlinks resolved inside the repository."""
        _, todo = self._parts(path)
        if not todo:
            raise IsADirectoryError(errno.EISDIR, "is the repository folder", path)
        stack = [os.open(self.repo, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)]
        hops = 0
        try:
            while todo:
                name = todo.pop(0)
                if name == ".":
                    continue
                if name == "..":
                    if len(stack) == 1:
                        raise PermissionError(errno.EACCES, "leaves the repository", path)
                    os.close(stack.pop())
                    continue
                try:
                    st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
                except FileNotFoundError:
                    if not todo:
                        return stack.pop(), name
                    if not create_dirs:
                        raise FileNotFoundError(errno.ENOENT, "no such file or folder", path) from None
                    os.mkdir(name, 0o755, dir_fd=stack[-1])
                    os.chown(name, self.uid, self.gid, dir_fd=stack[-1], follow_symlinks=False)
                    st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    hops += 1
                    if hops > MAX_SYMLINK_HOPS:
                        raise OSError(errno.ELOOP, "too many symlinks", path)
                    target = os.readlink(name, dir_fd=stack[-1])
                    try:
                        absolute, tparts = self._parts(target)
                    except PermissionError:
                        raise PermissionError(
                            errno.EACCES, f"symlink to {target} leaves the repository", path
                        ) from None
                    if absolute:
                        while len(stack) > 1:
                            os.close(stack.pop())
                    todo = tparts + todo
                    continue
                if not todo:
                    return stack.pop(), name
                if not stat.S_ISDIR(st.st_mode):
                    raise NotADirectoryError(errno.ENOTDIR, "not a folder on the way", path)
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                stack.append(os.open(name, flags, dir_fd=stack[-1]))
            raise IsADirectoryError(errno.EISDIR, "is the repository folder", path)
        finally:
            for fd in stack:
                os.close(fd)

    def _check_owned(self, st: os.stat_result, path: str) -> None:
        if not stat.S_ISREG(st.st_mode):
            kind = IsADirectoryError if stat.S_ISDIR(st.st_mode) else PermissionError
            raise kind(
                errno.EISDIR if kind is IsADirectoryError else errno.EACCES, "not a regular file", path
            )
        if st.st_uid != self.uid or st.st_nlink != 1:
            raise PermissionError(errno.EACCES, "not a file of the sandbox user (owner or hard links)", path)

    def repair(self) -> None:
        """Give the sandbox user back access to the repository's top folder (an agent's `chmod 000 /testbed`),
        from the host (root, or its owner), so a sandbox restart can enter it."""
        with contextlib.suppress(OSError):
            os.chmod(self.repo, stat.S_IMODE(os.lstat(self.repo).st_mode) | 0o700)

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a file of the repository, or only its last max_bytes bytes (see the module docstring for what
        is refused; with max_bytes, anything but a regular file is refused too, so a fifo cannot block)."""
        dirfd, name = self._walk(path, create_dirs=False)
        try:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(name, flags, dir_fd=dirfd)
            except FileNotFoundError:
                raise FileNotFoundError(errno.ENOENT, "no such file", path) from None
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise PermissionError(errno.EACCES, "symlink swapped in while reading", path) from None
                raise
        finally:
            os.close(dirfd)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            self._check_owned(st, path)
            if max_bytes is None:
                return f.read()
            if not stat.S_ISREG(st.st_mode):
                raise PermissionError(errno.EACCES, "not a regular file", path)
            if st.st_size > max_bytes:
                f.seek(st.st_size - max_bytes)
            return f.read(max_bytes)

    def write_file(self, path: str, data: bytes) -> None:
        """Create or replace a file of the repository, owned by the sandbox user."""
        dirfd, name = self._walk(path, create_dirs=True)
        created = False
        try:
            flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dirfd)
                created = True
            except FileExistsError:
                fd = os.open(name, flags, dir_fd=dirfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise PermissionError(
                    errno.EACCES, "is a symlink (swapped in while writing?)", path
                ) from None
            raise
        finally:
            os.close(dirfd)
        with os.fdopen(fd, "wb") as f:
            if created:
                os.fchown(fd, self.uid, self.gid)
            self._check_owned(os.fstat(fd), path)
            os.ftruncate(fd, 0)
            f.write(data)

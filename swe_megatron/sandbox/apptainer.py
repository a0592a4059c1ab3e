"""apptainer backend (clusters): the persistent shell in `apptainer exec` of the task's read-only SIF.

    [sh -c 'join the sandbox cgroup']  [setpriv ... --]  prlimit --cpu --fsize --nofile --core=0 --
    apptainer exec --contain --cleanenv --pid --ipc --no-home --no-mount hostfs,bind-paths,cwd
                   --net --network none --writable-tmpfs --bind WORKSPACE:/testbed --pwd /testbed
                   [--memory BYTES --pids-limit N]  IMAGE  <shell supervisor>

The repository: spec.repo_dir when the task has one on the host (this project's tasks); otherwise (SWE-bench and
SWE-rebench images, repo_dir "") the image's own /testbed, read out of the image once with `apptainer exec IMAGE
tar` into IMAGE_CACHE under sandbox.workspace_root (one folder per image file, made atomically) and copied from
there into each sandbox's workspace like any repository: the agent writes to its own copy, the host reads and
writes it (read_file/write_file) and diffs it against the cached one (host_patch), as for a host repository. The
image is immutable once built (a SIF is): a rebuilt image file is a new cache entry. The shell then runs the
task's environment activation (SandboxSpec.setup, from the grading plan) before entering /testbed. The cache is
bounded (sandbox.image_repo_cache_mb): each live sandbox holds a shared flock on its entry's lock file (.ENTRY.lock),
each use touches the entry, and after reading a new image the least recently used entries that no process holds
are removed until the rest fit (evict_image_repos); so are leftovers of reads that were cut short.

One `apptainer exec` per sandbox runs the shell's supervisor (shell.py); a shell that dies is restarted
inside the same container. The image stays read-only; writes outside /testbed land in a tmpfs overlay
(--writable-tmpfs) and are lost if the whole sandbox restarts. --contain gives a private /tmp and /dev,
--no-home and --no-mount keep the user's home, the cwd and the admin's `bind path` entries out, and
`--net --network none` leaves only loopback. The apptainer CLI is the whole interface. spython (0.3.14, the
maintained Apptainer client on PyPI) does not fit: its exec runs a fixed `singularity` binary to completion
(communicate) or streams stdout lines as text, with no stdin pipe, no binary output and no prefix command
(setpriv/prlimit/cgroup join), and the sandbox's shell supervisor needs all four.

Limits: CPU seconds, file size and open files with prlimit. Memory and processes of the whole sandbox:
in the sandbox's own cgroup (shell.py, cgroups.py) where this process can make one (root, or a delegated
cgroup v2 subtree); otherwise, with sandbox.cgroup_limits on, through apptainer's --memory/--pids-limit
(apptainer asks systemd for the cgroup; rootless runs need systemd delegation, and apptainer fails clearly
without it: set sandbox.cgroup_limits=false there); otherwise only the Slurm job's own limits apply. Address-space and process rlimits are not used here: apptainer's
runtime itself needs more address space, and RLIMIT_NPROC would count the job user's every process.

Run as root (CI), the backend first drops to the sandbox user (whose passwd entry apptainer needs);
on a cluster it runs as the job's user.

Tests run this backend against tests/fake_apptainer/apptainer, a stand-in over bwrap that implements
exactly the options above and refuses anything else.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from swe_megatron.sandbox.base import SandboxError
from swe_megatron.sandbox.shell import ShellSandbox
from swe_megatron.sandbox.users import SandboxUser, current_user, lookup_user
from swe_megatron.sandbox.workspace import remove_tree

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE_CACHE = ".image-repos"
"""Folder under sandbox.workspace_root holding the repositories read out of task images."""
EXTRACT_TIMEOUT_S = 1800
"""How long reading one image's repository may take (a SIF of django's is a few hundred MB)."""


def _repo_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's `tar` filter (nothing outside dest, no setuid bits), and only what a repository holds: folders,
    files, links (a device node or fifo in an image's /testbed is left out), owned by this process."""
    member = tarfile.tar_filter(member, dest)
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return None
    # Owned by this process, not by whoever the image names (the stand-in's user namespace says `nobody`): no
    # other user may change the pristine copy later sandboxes start from.
    return member.replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="", deep=False)


def _side(entry: Path, kind: str) -> Path:
    """An entry's lock or size file beside it (.ENTRY.lock, .ENTRY.size)."""
    return entry.with_name(f".{entry.name}.{kind}")


def _entry_bytes(entry: Path) -> int:
    """Disk a cached repository takes (its .ENTRY.size record, written when it was read out; else counted)."""
    with contextlib.suppress(OSError, ValueError):
        return int(_side(entry, "size").read_text())
    total = 0
    for folder, _, files in os.walk(entry):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def evict_image_repos(root: Path, limit_bytes: int, keep: Path | None = None) -> list[str]:
    """Remove the least recently used repositories under root (an IMAGE_CACHE folder) until the rest take at most
    limit_bytes; an entry a live sandbox holds (a shared flock on .ENTRY.lock) and `keep` stay. Leftover `.part-`
    folders older than EXTRACT_TIMEOUT_S (a read cut short) go too. Returns the names removed."""
    removed, now = [], time.time()
    entries = []
    for path in root.iterdir() if root.is_dir() else ():
        if path.name.startswith(".part-"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > EXTRACT_TIMEOUT_S:
                    remove_tree(path)
                    removed.append(path.name)
        elif path.is_dir() and not path.is_symlink():
            entries.append((path.stat().st_mtime, path, _entry_bytes(path)))
    total = sum(size for _, _, size in entries)
    for _, path, size in sorted(entries, key=lambda e: e[0]):
        if total <= limit_bytes:
            break
        if keep is not None and path == keep:
            continue
        try:
            fd = os.open(_side(path, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live sandbox holds it
            os.close(fd)
            continue
        try:  # out of the way first, so that no sandbox starts on a half-removed copy; a waiting one reads it anew
            gone = Path(tempfile.mkdtemp(prefix=".part-evict-", dir=root))
            os.rename(path, gone / "repo")
            remove_tree(gone)
            for kind in ("size", "lock"):
                with contextlib.suppress(OSError):
                    os.unlink(_side(path, kind))
            total -= size
            removed.append(path.name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def find_apptainer() -> str:
    """The apptainer binary on the user's PATH (tests put a stand-in first); SandboxError naming the fix."""
    found = shutil.which("apptainer", path=os.environ.get("PATH", SAFE_PATH))
    if found is None:
        raise SandboxError(
            "apptainer is not installed (no `apptainer` on PATH); on a laptop use sandbox.backend=bwrap"
        )
    return found


class ApptainerSandbox(ShellSandbox):
    """A sandbox in an Apptainer container made from spec.image (a SIF, or a name in sandbox.sif_dir)."""

    backend = "apptainer"

    def _identity(self) -> SandboxUser:
        return lookup_user(self.cfg.user) if os.geteuid() == 0 else current_user()

    def _image(self) -> str:
        image = self.spec.image
        if not image:
            raise SandboxError("the apptainer backend needs SandboxSpec.image (a SIF file)")
        path = Path(image)
        if not path.is_absolute() and self.cfg.sif_dir:
            path = Path(self.cfg.sif_dir) / path
        if not path.exists():
            raise SandboxError(
                f"image {path} not found (SandboxSpec.image, sandbox.sif_dir={self.cfg.sif_dir!r})"
            )
        return str(path.resolve())

    def _process_limit(self) -> int | None:
        return self.cfg.max_processes if self.cfg.cgroup_limits or self._cgroup is not None else None

    def _prepare(self) -> None:
        if getattr(self, "_image_path", None):
            return
        self._apptainer = find_apptainer()
        self._tools = {name: shutil.which(name, path=SAFE_PATH) for name in ("setpriv", "prlimit")}
        if self._tools["prlimit"] is None or (os.geteuid() == 0 and self._tools["setpriv"] is None):
            raise SandboxError(
                "setpriv/prlimit (util-linux) not installed: run tools/sandbox_setup.sh as root"
            )
        self._image_path = self._image()

    def _repo_source(self) -> str:
        """spec.repo_dir, or (none given) the image's own repository at spec.workdir, read out once per image and
        held (a shared flock on its lock file) until this sandbox is cleaned up, so that no eviction removes it."""
        if self.spec.repo_dir:
            return self.spec.repo_dir
        self._prepare()
        for _ in range(3):  # an eviction that won the race for the lock removed it: read it out again
            done = self._image_repository()
            fd = os.open(_side(done, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
            if done.is_dir():
                self._held = fd
                with contextlib.suppress(OSError):
                    os.utime(done)  # most recently used
                return str(done)
            os.close(fd)
        raise SandboxError(
            f"the repository of image {self._image_path} was removed from the cache as it was read"
        )

    def _cleanup(self) -> None:
        try:
            super()._cleanup()
        finally:
            fd, self._held = getattr(self, "_held", None), None
            if fd is not None:
                os.close(fd)

    def _as_user(self) -> list[str]:
        """argv prefix that drops from root to the sandbox user (nothing when not root)."""
        if os.geteuid() != 0:
            return []
        user = self.user
        return [self._tools["setpriv"], f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--"]

    def _image_repository(self) -> Path:
        """The cached copy of the image's spec.workdir (made on first use: `tar` run inside the image as the
        sandbox user, without network or host files, its stream unpacked on the host with tarfile's `tar` filter,
        which keeps every member inside the folder, and only files, folders and links)."""
        image = Path(self._image_path)
        st = image.stat()
        key = hashlib.sha256(
            f"{image}\0{st.st_ino}\0{st.st_mtime_ns}\0{self.spec.workdir}".encode()
        ).hexdigest()
        root = Path(self.cfg.workspace_root) / IMAGE_CACHE
        done = root / f"{image.name[:80]}-{key[:16]}"
        if done.is_dir():
            return done
        try:
            root.mkdir(mode=0o711, parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".part-", dir=root))
        except OSError as e:
            raise SandboxError(f"cannot make {root} (sandbox.workspace_root): {e}") from None
        argv = [*self._as_user(), self._apptainer, "exec", "--contain", "--cleanenv", "--no-home"]
        argv += ["--no-mount", "hostfs,bind-paths,cwd", "--net", "--network", "none", str(image)]
        argv += ["tar", "-C", self.spec.workdir, "-cf", "-", "."]
        env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": "/nonexistent"}
        try:
            with tempfile.TemporaryFile() as err:
                proc = subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env
                )
                timer = threading.Timer(EXTRACT_TIMEOUT_S, proc.kill)
                timer.start()
                problem = ""
                try:
                    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                        tar.extractall(tmp / "repo", filter=_repo_member)
                except (tarfile.TarError, OSError) as e:
                    problem = f"{type(e).__name__}: {e}"
                finally:
                    proc.stdout.close()
                    rc = proc.wait()
                    timer.cancel()
                err.seek(0)
                problem = problem or err.read()[-2000:].decode(errors="replace").strip()
            if rc != 0 or not (tmp / "repo").is_dir():
                raise SandboxError(
                    f"cannot read {self.spec.workdir} out of image {image} (status {rc}): {problem}"
                )
            size = _entry_bytes(tmp / "repo")
            with contextlib.suppress(OSError):  # another sandbox may have made it first: then theirs is used
                os.rename(tmp / "repo", done)
                _side(done, "size").write_text(str(size))
            if not done.is_dir():
                raise SandboxError(f"cannot keep the repository of image {image} in {done}")
        finally:
            remove_tree(tmp)
        evict_image_repos(root, self.cfg.image_repo_cache_mb << 20, keep=done)
        return done

    def _launch(self) -> tuple[list[str], dict[str, str]]:
        cfg, spec, user = self.cfg, self.spec, self.user
        argv: list[str] = list(self._as_user())
        argv += [
            self._tools["prlimit"],
            f"--cpu={cfg.cpu_seconds}:{cfg.cpu_seconds + 2}",  # SIGXCPU at the limit, SIGKILL 2 s later
            f"--fsize={cfg.max_file_mb << 20}",
            f"--nofile={cfg.max_open_files}",
            "--core=0",
        ]
        argv += ["--", self._apptainer, "exec", "--contain", "--cleanenv", "--pid", "--ipc", "--no-home"]
        argv += ["--no-mount", "hostfs,bind-paths,cwd", "--net", "--network", "none", "--writable-tmpfs"]
        argv += ["--bind", f"{self.workspace.repo}:{spec.workdir}", "--pwd", spec.workdir]
        if cfg.cgroup_limits and self._cgroup is None:  # no group of our own: apptainer's (systemd's)
            argv += ["--memory", str(cfg.memory_mb << 20), "--pids-limit", str(cfg.max_processes)]
        argv.append(self._image_path)
        home = "/nonexistent"
        if os.geteuid() != 0:
            home = os.environ.get("HOME", home)
        env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": home, "USER": user.name, "LOGNAME": user.name}
        return argv, env

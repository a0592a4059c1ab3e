"""bubblewrap backend (default on Linux, used by CI): agent commands in a namespace sandbox.

    setpriv --reuid U --regid G --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all --
    prlimit --cpu --as [--nproc] --fsize --nofile --core=0 --
    bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session ... -- <shell supervisor>

Run as root (CI, the sandbox server), it first drops to a per-sandbox uid of the sandbox user (see
users.py); bwrap run as root would keep root's powers. Run as an ordinary user it runs as that user and
sets no RLIMIT_NPROC (that limit counts all of the user's processes); run as root it sets RLIMIT_NPROC only
where no cgroup holds the sandbox (the cgroup's pids.max is the limit, and the one limits_hit reports). Inside:

- read-only: a minimal system tree (`system_tree()`: /usr/bin, /usr/sbin, the shared libraries, git's
  helpers, the locales, time zones and each Python's standard library, with the /bin, /lib* links), a
  few /etc files, generated passwd/group/hosts. Not the rest of /usr: no Debian or /usr/local Python
  packages, no vendored copies (a cloud SDK's copy of a task library was there), no /root, /home, /var,
  /opt, /work or any project folder; /etc/shadow is absent;
- writable: the workspace copy at spec.workdir (/testbed), tmpfs /tmp, /dev/shm and $HOME (sandbox.tmpfs_mb
  each); the rest of the root is read-only;
- spec.env_dir read-only at /opt/venv, first on PATH (and at its own host path too, because a venv's
  console scripts have that path in their #! line); it must be a venv of a system Python (/usr/bin);
- network: a fresh namespace with only loopback (bwrap brings `lo` up), so 127.0.0.1 servers inside
  work and nothing outside (internet, the host's 127.0.0.1) is reachable;
- uid 1000 (`sandbox.user` in the sandbox's passwd), no capabilities, no new user namespaces;
- a seccomp filter (seccomp.py) that refuses ptrace and the other calls that reach into another process.

Limits (shell.py, cgroups.py): memory and processes of the whole sandbox in a cgroup of its own where the
host allows one; the workspace on a tmpfs of sandbox.workspace_mb (run as root); per process CPU seconds,
address space, file size and open files (prlimit).

If the process that owns a sandbox dies, bwrap's --die-with-parent takes the sandbox with it (shell.py
starts every sandbox from one long-lived thread, since that signal follows the forking thread).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from swe_megatron.sandbox import seccomp
from swe_megatron.sandbox.base import SandboxError
from swe_megatron.sandbox.shell import ShellSandbox
from swe_megatron.sandbox.users import SETUP_HINT

INNER_UID = 1000
VENV_MOUNT = "/opt/venv"
SECCOMP_FILE = "seccomp.bpf"  # in the host-side workspace folder, outside the sandbox's view
SECCOMP_FD = 3
STATE_DIR = "/run/swe-sandbox"  # the shell's snapshot (shell.py), on its own small tmpfs
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Where a task venv's Python must live (pyvenv.cfg `home`); the top-level ones are links into /usr on a
merged-/usr system, and bound whole otherwise."""
# What the sandbox needs of /usr: the tools (bash, coreutils, git, grep, sed, find, python), their shared
# libraries and the dynamic linker, git's helpers and templates, locales, time zones. Patterns: glob.
USR_TREE = (
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib/*-linux-gnu*",
    "/usr/lib64",
    "/usr/lib32",
    "/usr/libx32",
    "/usr/lib/git-core",
    "/usr/share/git-core",
    "/usr/libexec/coreutils",
    "/usr/lib/locale",
    "/usr/share/zoneinfo",
    "/usr/lib/python3.[0-9]*",  # each Python's standard library (not /usr/lib/python3: Debian's packages)
)
# Read-only from the host when present: the dynamic linker's cache, `alternatives` links that
# /usr/bin entries point into, time zone, service names, Debian's Python site config.
ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "timezone",
    "protocols",
    "services",
    "mime.types",
    "os-release",
    "debian_version",
    "python3",
    "python3.11",
    "python3.12",
    "gitconfig",
    "ssl/openssl.cnf",
    "ssl/certs",
)
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def system_tree() -> list[str]:
    """Host paths the sandbox sees read-only at the same place, besides /etc files and the task venv."""
    paths = [p for pattern in USR_TREE for p in sorted(glob.glob(pattern)) if os.path.isdir(p)]
    usr_merged = all(os.path.islink(d) or not os.path.exists(d) for d in SYSTEM_DIRS[1:])
    top = [d for d in SYSTEM_DIRS[1:] if os.path.isdir(d) and not os.path.islink(d)]
    return paths + ([] if usr_merged else top)


def system_copies(modules: Iterable[str], roots: Iterable[str] | None = None) -> dict[str, str]:
    """Importable copies of these top-level modules under the sandbox's system tree (or `roots`):
    {module: a host path of a copy}. A task library with one is refused (tasks/factory): a patch could run
    the unmutated copy instead of fixing the bug.

    A copy is a module or package that imports under that top-level name from some folder a patch could put
    on sys.path: `NAME.py`, `NAME.pyc`, `NAME[.TAG].so` or a `NAME/` folder holding Python files, in a folder that is not
    itself a package (no __init__.py). A submodule of a package (the stdlib's urllib/parse.py) imports only
    as `urllib.parse` and is another module that happens to share the name, not a copy of the library `parse`.
    """
    wanted, found = set(modules), {}
    for root in system_tree() if roots is None else roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]  # cached bytecode imports only with its source
            if "__init__.py" in files:
                continue  # inside a package: its modules import only under the package's name
            for name in wanted.intersection(dirs):
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    if any(f.endswith((".py", ".pyc", ".so")) for f in os.listdir(path)):
                        found.setdefault(name, path)
            for name in files:
                stem, dot, ext = name.partition(".")
                if stem in wanted and (ext in ("py", "pyc", "so") or (dot and ext.endswith(".so"))):
                    found.setdefault(stem, os.path.join(folder, name))
    return found


def require_tools() -> dict[str, str]:
    """Paths of bwrap, setpriv and prlimit; SandboxError naming the fix when one is missing."""
    tools = {name: shutil.which(name, path=SAFE_PATH) for name in ("bwrap", "setpriv", "prlimit")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        raise SandboxError(f"{', '.join(missing)} not installed (bubblewrap, util-linux): {SETUP_HINT}")
    return tools  # type: ignore[return-value]


def check_env_dir(env_dir: str, uid: int, gid: int) -> Path:
    """The task venv, checked: exists, reachable by the sandbox uid, made from a Python the sandbox sees."""
    path = Path(env_dir).resolve()
    if not (path / "bin").is_dir():
        raise SandboxError(f"env_dir {env_dir} is not a Python environment (no bin/ folder)")
    for folder in [path, *path.parents]:
        st = folder.stat()
        if st.st_uid == uid:
            ok = st.st_mode & 0o100
        elif st.st_gid == gid:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            raise SandboxError(
                f"env_dir {env_dir} is not reachable by the sandbox user (uid {uid}): {folder} is mode "
                f"{oct(st.st_mode & 0o777)}; keep task environments outside /root in world-readable folders"
            )
    cfg = path / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                home = value.strip()
                if not any(home == d or home.startswith(d + "/") for d in SYSTEM_DIRS):
                    raise SandboxError(
                        f"env_dir {env_dir} is a venv of the Python in {home}, which the sandbox cannot see; "
                        f"make task environments with /usr/bin/python3 -m venv"
                    )
    return path


class BwrapSandbox(ShellSandbox):
    """A sandbox made with bubblewrap; see the module docstring for what it can and cannot reach."""

    backend = "bwrap"

    def _prepare(self) -> None:
        self._tools = require_tools()
        self._env_dir = None
        if self.spec.env_dir:
            self._env_dir = check_env_dir(self.spec.env_dir, self.user.uid, self.user.gid)
        etc = self.workspace.folder / "etc"
        etc.mkdir(mode=0o755)
        # bwrap reads the filter from a descriptor; the sandbox user opens this copy for it (_launch).
        (self.workspace.folder / SECCOMP_FILE).write_bytes(seccomp.filter_program())
        os.chmod(self.workspace.folder / SECCOMP_FILE, 0o644)
        name, home = self.user.name, self._home()
        files = {
            "passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\n{name}:x:{INNER_UID}:{INNER_UID}::{home}:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            "group": f"root:x:0:\n{name}:x:{INNER_UID}:\nnogroup:x:65534:\n",
            "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
            "hostname": "sandbox\n",
            "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\n",
        }
        for fname, text in files.items():
            (etc / fname).write_text(text)
            os.chmod(etc / fname, 0o644)

    def _state_file(self) -> str:
        return f"{STATE_DIR}/state"

    def _home(self) -> str:
        return f"/home/{self.user.name}"

    def _launch(self) -> tuple[list[str], dict[str, str]]:
        cfg, spec, user = self.cfg, self.spec, self.user
        argv: list[str] = []
        as_root = os.geteuid() == 0
        if as_root:
            argv += [self._tools["setpriv"], f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups"]
            argv += ["--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        # CPU: SIGXCPU ("CPU time limit exceeded") at the limit, SIGKILL 2 s later if it is ignored.
        cpu = f"--cpu={cfg.cpu_seconds}:{cfg.cpu_seconds + 2}"
        argv += [self._tools["prlimit"], cpu, f"--as={cfg.memory_mb << 20}"]
        if as_root and self._cgroup is None:
            # With a cgroup its pids.max is the sandbox's process limit: an equal RLIMIT_NPROC would refuse the
            # same fork first (the kernel checks it before the cgroup), and pids.events would never count it.
            argv.append(f"--nproc={cfg.max_processes}")
        argv += [f"--fsize={cfg.max_file_mb << 20}", f"--nofile={cfg.max_open_files}", "--core=0", "--"]

        # sh opens the filter on SECCOMP_FD and execs bwrap, which loads it and closes the descriptor.
        b = ["/bin/sh", "-c", f'exec "$@" {SECCOMP_FD}<"$0"', str(self.workspace.folder / SECCOMP_FILE)]
        b += [self._tools["bwrap"], "--seccomp", str(SECCOMP_FD)]
        b += ["--unshare-all", "--unshare-user", "--disable-userns"]
        b += ["--die-with-parent", "--new-session", "--uid", str(INNER_UID), "--gid", str(INNER_UID)]
        b += ["--hostname", "sandbox"]
        for d in SYSTEM_DIRS[1:]:
            if os.path.islink(d):
                b += ["--symlink", os.readlink(d), d]
        for d in system_tree():
            b += ["--ro-bind", d, d]
        tmp_bytes = str(cfg.tmpfs_mb << 20)
        b += ["--proc", "/proc", "--dev", "/dev", "--size", tmp_bytes, "--tmpfs", "/dev/shm"]
        b += ["--size", tmp_bytes, "--tmpfs", "/tmp", "--size", tmp_bytes, "--tmpfs", self._home()]
        b += ["--size", str(1 << 20), "--tmpfs", STATE_DIR]
        for rel in ETC_FILES:
            b += ["--ro-bind-try", f"/etc/{rel}", f"/etc/{rel}"]
        for generated in sorted((self.workspace.folder / "etc").iterdir()):
            b += ["--ro-bind", str(generated), f"/etc/{generated.name}"]
        b += ["--bind", str(self.workspace.repo), spec.workdir]
        path = SAFE_PATH
        env = {
            "HOME": self._home(),
            "USER": user.name,
            "LOGNAME": user.name,
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": "/tmp",
            "PAGER": "cat",
            "GIT_PAGER": "cat",
        }
        if self._env_dir is not None:
            b += ["--ro-bind", str(self._env_dir), VENV_MOUNT]
            if str(self._env_dir) != VENV_MOUNT:
                b += ["--ro-bind", str(self._env_dir), str(self._env_dir)]
            path = f"{VENV_MOUNT}/bin:{path}"
            env["VIRTUAL_ENV"] = VENV_MOUNT
        env["PATH"] = path
        # The root and /dev are tmpfs that bwrap made: read-only, or they would be unbounded scratch space
        # (not recursive: /tmp, HOME, /dev/shm and the workspace stay writable).
        b += ["--remount-ro", "/dev", "--remount-ro", "/"]
        b += ["--chdir", spec.workdir, "--clearenv"]
        for key, value in env.items():
            b += ["--setenv", key, value]
        b.append("--")  # the shell's supervisor follows (shell.py)
        return argv + b, {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}

"""The persistent shell every backend runs its commands through, and the lifecycle the backends share.

Processes. A backend's isolation (bwrap, apptainer, nothing) wraps a small supervisor loop, `bash -c
'while :; do (. STATE; exec bash); report the exit status; done'`, whose child bash is the agent's shell.
It reads commands on stdin; stdout and stderr are one pipe. Each command is sent as one line:

    SWE_SANDBOX_CMD=ID eval $'<command, ANSI-C quoted>' </dev/null; rc=$?; { export -p; echo cd -- "$PWD"; } >STATE; printf M rc

`eval` runs it in the shell itself, so `cd` and `export` persist; stdin is /dev/null so a command cannot
eat the protocol stream. M is a fresh random marker per command, printed in two halves so that not even
`set -x`/`set -v` traces show it whole. Output is everything before M (bytes, never decoded), kept up to
the cap as head + tail around a visible notice. STATE (a small file on a tmpfs inside the sandbox) is a
snapshot of the shell's exported variables and cwd, which the supervisor loads into every new shell.

Limits. On timeout the supervisor is paused and the shell, with every process the command started (they
carry SWE_SANDBOX_CMD=ID in their environment; found through /proc by pid namespace or session, so
background and setsid'd ones too), is killed; processes from earlier commands keep running unless they keep
spawning new ones (a fork bomb), in which case everything but the supervisor is killed. The supervisor then starts a new shell from STATE: the agent
keeps its cwd and exported variables (not unexported variables, functions, aliases or `set` options). The
same happens when the shell exits (`exit`, `exec`). Only if the supervisor itself is gone is the whole
sandbox restarted (fresh /tmp, cwd and environment).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import re
import secrets
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from swe_megatron.procfs import proc_stat
from swe_megatron.sandbox.base import ExecResult, SandboxError, SandboxSpec
from swe_megatron.sandbox.cgroups import SandboxCgroup, sweep_stale_groups, warn_once
from swe_megatron.sandbox.host_diff import host_diff
from swe_megatron.sandbox.users import SandboxUser, current_user, lease_user
from swe_megatron.sandbox.workspace import Workspace, sweep_stale

START_TIMEOUT_S = 30.0
DISK_FULL_BYTES = 1 << 20  # a workspace with less free space than this is reported full
KILL_GRACE_S = 3.0  # after a timeout, how long the supervisor gets to start a new shell
CMD_ENV = "SWE_SANDBOX_CMD"  # in the environment of each command's processes: which command started them
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# $1: token of the exit report; $2: the STATE file. The loop's own stderr (job notices such as "Killed")
# goes to /dev/null, the shell's to the pipe (fd 3). Five shell deaths within a second each (stdin was
# closed: the host is gone) end the loop.
_SUPERVISOR = """exec 3>&2 2>/dev/null; n=0
while :; do
  t=$SECONDS
  ( . "$2"; exec /bin/bash --noprofile --norc 2>&3 3>&- )
  s=$?
  printf '%s%s %d\\n' __swe_shell_ "exited_$1" "$s"
  if (( SECONDS - t < 1 )); then (( ++n >= 5 )) && exit 1; else n=0; fi
done"""


def shell_quote(text: str) -> str:
    """Bash ANSI-C quoting ($'...') of any text: every byte outside printable ASCII as \\xHH."""
    out = ["$'"]
    for b in text.encode("utf-8", "surrogateescape"):
        c = chr(b)
        out.append(c if 0x20 <= b < 0x7F and c not in "'\\" else f"\\x{b:02x}")
    out.append("'")
    return "".join(out)


# -- /proc -------------------------------------------------------------------------------------------------


def _all_pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]


def _nspids(pid: int) -> list[int]:
    """The process's pid in each nested pid namespace, outermost first (the NSpid line)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []


def _children(pid: int) -> list[int]:
    """Child pids of a process (/proc/PID/task/*/children; a full /proc scan where the kernel lacks it)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        out = []
        for tid in tasks:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        return out
    except FileNotFoundError:
        if not os.path.exists(f"/proc/{pid}"):
            return []
    except OSError:
        return []
    return [p for p in _all_pids() if (st := proc_stat(p)) is not None and st.ppid == pid]


def _pidns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _has_env(pid: int, entry: bytes) -> bool:
    """The process's initial environment holds `entry` (b"NAME=value")."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return env.startswith(entry + b"\0") or b"\0" + entry + b"\0" in env


def _signal(pid: int | None, sig: int) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _ready(fd: int, event: int, timeout_s: float) -> bool:
    """Whether fd is ready for event (or hung up / in error: the read or write then says what) within timeout_s.
    poll, not select: a sandbox server with hundreds of sandboxes holds descriptors past FD_SETSIZE (1024)."""
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))


def _int(raw: bytes | bytearray) -> int:
    text = bytes(raw).strip()
    return int(text) if text.lstrip(b"-").isdigit() else -1


class _Spawner:
    """Starts every sandbox process from one long-lived thread.

    bwrap's --die-with-parent (PR_SET_PDEATHSIG) fires when the *thread* that forked bwrap exits, not the
    process; a sandbox started from a short-lived worker thread would die with that thread.
    """

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="sandbox-spawner", daemon=True)
                self._thread.start()
        future: Future = Future()
        self._queue.put((args, kwargs, future))
        return future.result()

    def _serve(self) -> None:
        while True:
            args, kwargs, future = self._queue.get()
            try:
                future.set_result(subprocess.Popen(*args, **kwargs))
            except BaseException as e:  # handed to the caller
                future.set_exception(e)


_spawner = _Spawner()


# -- output ------------------------------------------------------------------------------------------------


class _CappedOutput:
    """Keeps the first and last cap/2 bytes of a stream and counts the rest."""

    def __init__(self, cap: int):
        self.cap = max(cap, 2)
        self.head_cap = self.cap - self.cap // 2
        self.tail_cap = self.cap // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes | bytearray | memoryview) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    def value(self) -> tuple[bytes, bool]:
        """(output, truncated)."""
        if self.total <= self.cap:
            return bytes(self.head + self.tail), False
        notice = (
            f"\n[sandbox: output truncated: {self.total - self.cap} of {self.total} bytes omitted here; "
            f"showing the first {len(self.head)} and the last {len(self.tail)}]\n"
        ).encode()
        return bytes(self.head) + notice + bytes(self.tail), True


@dataclass
class _Outcome:
    """How one roundtrip ended: `done` (rc is the command's), `exited` (the shell died with rc), `gone`
    (the whole sandbox ended with rc) or `stuck` (no answer by the deadline)."""

    kind: str
    rc: int


class PersistentShell:
    """The supervisor + shell pair behind a backend's isolation, driven by the protocol above."""

    def __init__(
        self,
        launcher: list[str],
        *,
        popen_env: dict[str, str],
        output_cap: int,
        workdir: str,
        state_file: str,
        exports: dict[str, str] | None = None,
        setup: tuple[str, ...] = (),
        cwd: str | None = None,
        process_limit: int | None = None,
        repair: Callable[[], None] | None = None,
    ):
        self.launcher = launcher
        """argv that runs the command appended to it inside the backend's isolation."""
        self.popen_env = popen_env
        self.output_cap = output_cap
        self.workdir = workdir
        self.state_file = state_file
        """Path, as the shell sees it, of the snapshot file (on a tmpfs that lives as long as the sandbox)."""
        self.cwd = cwd
        self.process_limit = process_limit
        """The sandbox's process limit, if any (a timeout with half of it in use kills everything)."""
        self.repair = repair
        """Run on the host before a sandbox restart: undoes what the agent did that would stop it (modes)."""
        exports = dict(exports or {})
        for key in exports:
            if not _ENV_NAME.match(key):
                raise ValueError(f"environment variable name {key!r} is not a shell identifier")
        init = [f"export {k}={shell_quote(v)}" for k, v in exports.items()]
        if setup:  # the task environment's activation (SandboxSpec.setup); its own output is noise
            init.append("{\n" + "\n".join(setup) + "\n} >/dev/null 2>&1 </dev/null")
        init.append(f"cd -- {shell_quote(workdir)}")
        self._init_script = "\n".join(init)
        self._proc: subprocess.Popen | None = None
        self._token = ""
        self._marker = b""
        self._cmd_id = ""
        self._residual = bytearray()
        self._shell_pid: int | None = None
        self._supervisor_pid: int | None = None
        self._ns: str | None = None  # the sandbox's pid namespace, when it has its own
        self.closing = False
        self.restarts = 0
        """Shells started after the first one (timeouts, exits, sandbox restarts)."""

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the sandbox's processes and its shell; SandboxError with their output if that fails."""
        self._token = secrets.token_hex(8)
        self._residual = bytearray()
        supervisor = ["/bin/bash", "--noprofile", "--norc", "-c", _SUPERVISOR, "swe-supervisor"]
        try:
            self._proc = _spawner.popen(
                [*self.launcher, *supervisor, self._token, self.state_file],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=self.popen_env,
                cwd=self.cwd,
                start_new_session=True,
                close_fds=True,
                bufsize=0,
            )
        except OSError as e:
            raise SandboxError(f"cannot start the sandbox ({self.launcher[0]}): {e}") from None
        os.set_blocking(self._proc.stdout.fileno(), False)
        os.set_blocking(self._proc.stdin.fileno(), False)
        try:
            self._attach_shell(first=True)
            out = _CappedOutput(self.output_cap)
            res = self._roundtrip(self._init_script, START_TIMEOUT_S, out)
            if res.kind != "done" or res.rc != 0:
                text = out.value()[0].decode(errors="replace")
                raise SandboxError(f"the sandbox shell could not enter {self.workdir}: {text}")
        except SandboxError:
            self.close()
            raise

    def _attach_shell(self, first: bool = False) -> None:
        """Ask the (new) shell for $$; find its host pid, its supervisor and (first) its pid namespace."""
        out = _CappedOutput(4096)
        hello = self._roundtrip('printf "%s\\n" "$$"', START_TIMEOUT_S, out)
        text = out.value()[0]
        lines = text.strip().splitlines()
        if hello.kind != "done" or not lines or not lines[-1].isdigit():
            shown = text.decode(errors="replace").strip()[-2000:]
            raise SandboxError(f"the sandbox shell did not start ({hello.kind}, status {hello.rc}): {shown}")
        nspid = int(lines[-1])
        todo, found = [self._proc.pid], None
        while todo and found is None:
            pid = todo.pop()
            ns = _nspids(pid)
            if ns and ns[-1] == nspid and pid != self._proc.pid:
                found = pid
            todo += _children(pid)
        if found is None:
            raise SandboxError("the sandbox shell started but its process was not found under /proc")
        self._shell_pid = found
        st = proc_stat(found)
        self._supervisor_pid = st.ppid if st else None
        if first:
            ns = _pidns(found)
            self._ns = ns if ns and ns != _pidns("self") else None

    def _members(self) -> list[int]:
        """Host pids of every process in the sandbox (its pid namespace; else its session)."""
        if self._ns is not None:
            return [p for p in _all_pids() if _pidns(p) == self._ns]
        if self._proc is None:
            return []
        return [p for p in _all_pids() if (st := proc_stat(p)) is not None and st.session == self._proc.pid]

    def _kill_command(self, rounds: int = 40) -> None:
        """Kill the shell and every process the current command started, with the supervisor paused.

        The command's processes carry SWE_SANDBOX_CMD=<its id> in their environment (set by the protocol
        line, inherited by everything they start), so background and setsid'd ones are found too. If
        processes keep appearing, or at least half the process limit is still in use afterwards (a fork
        bomb an earlier command left running), everything but the supervisor is killed: a timeout always
        leaves a usable sandbox.
        """
        mark = f"{CMD_ENV}={self._cmd_id}".encode()
        _signal(self._supervisor_pid, signal.SIGSTOP)  # no new shell while we are killing
        try:
            for everything in (False, True):
                for _ in range(rounds):
                    victims, others = [], 0
                    for pid in self._members():
                        st = proc_stat(pid)
                        if pid == self._supervisor_pid or st is None or st.state in "ZX":
                            continue
                        if self._ns is not None and _nspids(pid)[-1:] == [1]:
                            continue  # the namespace's init: killing it ends the sandbox
                        if everything or pid == self._shell_pid or _has_env(pid, mark):
                            victims.append(pid)
                        else:
                            others += 1
                    if not victims:
                        if self.process_limit and others >= self.process_limit // 2 and not everything:
                            break  # crowded by older processes: go on with everything
                        return
                    for pid in victims:
                        _signal(pid, signal.SIGKILL)
                    time.sleep(0.005)
        finally:
            _signal(self._supervisor_pid, signal.SIGCONT)

    def kill(self) -> None:
        """Kill every process of the sandbox; safe to call from another thread (the pipes stay open)."""
        proc = self._proc
        if proc is None:
            return
        for _ in range(3):
            for pid in self._members():
                _signal(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=2)
                return
            except subprocess.TimeoutExpired:
                continue

    def abort(self) -> None:
        """From another thread: kill everything; a command running now ends with SandboxError."""
        self.closing = True
        self.kill()

    def close(self) -> None:
        """Kill everything and release the pipes (from the thread that runs commands)."""
        self.closing = True
        self.kill()
        if self._proc is not None:
            for stream in (self._proc.stdin, self._proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()

    def _restart_sandbox(self) -> None:
        if self.closing:
            raise SandboxError("the sandbox was stopped")
        self.kill()
        for stream in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self.restarts += 1
        if self.repair is not None:  # a restart must not depend on state the agent controls
            self.repair()
        self.start()

    # -- commands -------------------------------------------------------------------------------------------

    def run(self, command: str, timeout_s: float) -> ExecResult:
        """Run one command; see the module docstring for timeouts and shells that die."""
        if self.closing or self._proc is None:
            raise SandboxError("the sandbox is not running (not started, or stopped)")
        if "\x00" in command:
            return ExecResult(b"[sandbox: the command contains a NUL byte; not run]\n", 2)
        t0 = time.monotonic()
        out = _CappedOutput(self.output_cap)
        res = self._roundtrip(command, timeout_s, out)
        notes: list[str] = []
        timed_out = res.kind == "stuck"
        if timed_out:  # kill the command; the supervisor then starts a new shell and reports the old one
            self._kill_command()
            res = self._roundtrip(None, KILL_GRACE_S, out)
            if res.kind == "done":  # it ended just as time ran out, but its shell was killed all the same
                res = self._roundtrip(None, KILL_GRACE_S, _CappedOutput(1024))
            notes.append(
                f"the command timed out after {timeout_s:g} s; it and every process it started were killed"
            )
        rc = -1 if timed_out else res.rc
        if res.kind == "exited":
            if not timed_out:
                notes.append(f"the shell exited (status {res.rc})")
            if self.closing:
                raise SandboxError("the sandbox was stopped")
            self.restarts += 1
            try:
                self._attach_shell()
                notes.append("a new shell started with the same working directory and exported variables")
            except SandboxError:
                res = _Outcome("gone", rc)
        if res.kind in ("gone", "stuck"):  # the supervisor is gone too, or does not answer
            if not timed_out:
                notes.append(f"the sandbox's processes ended (status {res.rc})")
            self._restart_sandbox()
            notes.append("the sandbox was restarted: /tmp, working directory and environment were reset")
        output, truncated = out.value()
        if notes:
            output += ("\n[sandbox: " + "; ".join(notes) + "]\n").encode()
        return ExecResult(output, rc, timed_out, truncated, time.monotonic() - t0)

    def _write(self, data: bytes, deadline: float) -> bool:
        """Write all of data to the shell's stdin; False if it is gone or does not read before deadline."""
        fd = self._proc.stdin.fileno()
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if not _ready(fd, select.POLLOUT, min(remaining, 0.5)):
                if self._proc.poll() is not None:
                    return False
                continue
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except OSError:
                return False
        return True

    def _roundtrip(self, command: str | None, timeout_s: float, out: _CappedOutput) -> _Outcome:
        """Send a command (None: nothing new, keep reading) and read its output into `out` until it ends."""
        deadline = time.monotonic() + timeout_s
        if command is not None:
            token = secrets.token_hex(16)
            half_a, half_b = f"__swe_{token[:16]}", f"{token[16:]}_end__"
            self._marker = (half_a + half_b).encode()
            self._cmd_id = token[:12]
            line = (
                f"{CMD_ENV}={self._cmd_id} eval {shell_quote(command)} </dev/null; __swe_rc=$?; "
                f"{{ export -p; printf 'cd -- %s\\n' \"${{PWD@Q}}\"; }} >{shell_quote(self.state_file)} 2>/dev/null; "
                f"printf '%s%s %d\\n' {half_a} {half_b} \"$__swe_rc\"\n"
            )
            if not self._write(line.encode(), deadline):
                return self._gone(out, self._residual)
        marker, exited = self._marker, f"__swe_shell_exited_{self._token} ".encode()
        keep = max(len(marker), len(exited)) - 1
        window = self._residual
        self._residual = bytearray()
        fd = self._proc.stdout.fileno()
        while True:
            i_end, i_exit = window.find(marker), window.find(exited)
            for i, pattern in sorted((i, p) for i, p in ((i_end, marker), (i_exit, exited)) if i >= 0):
                nl = window.find(b"\n", i)
                if nl < 0:
                    break  # wait for the rest of the line
                rc = _int(window[i + len(pattern) : nl])
                if pattern is exited and self._shell_pid and os.path.exists(f"/proc/{self._shell_pid}"):
                    continue  # an imitation printed by the command: the shell is alive
                out.add(memoryview(window)[:i])
                self._residual = window[nl + 1 :]
                return _Outcome("done" if pattern is marker else "exited", rc)
            else:  # no complete end line yet: pass on all but what could be the start of a marker
                if len(window) > keep:
                    out.add(memoryview(window)[:-keep])
                    del window[:-keep]
            now = time.monotonic()
            if now >= deadline:
                self._residual = window
                return _Outcome("stuck", -1)
            if not _ready(fd, select.POLLIN, min(deadline - now, 0.5)):
                if self._proc.poll() is not None:
                    return self._gone(out, window)
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                return self._gone(out, window)
            window += chunk

    def _gone(self, out: _CappedOutput, rest: bytearray) -> _Outcome:
        """The launcher exited (EOF): the whole sandbox ended."""
        out.add(rest)
        try:
            status = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            status = -1
        return _Outcome("gone", status)


class ShellSandbox:
    """What every backend shares: a private workspace copy, one persistent shell, a lock, idempotent stop.

    Subclasses implement `_launch()` (the argv and host environment that start an isolated bash) and may
    override `_identity()` (which uid owns the workspace and runs the shell) and `_prepare()`.
    """

    backend = "?"

    def __init__(self, spec: SandboxSpec, cfg):
        self.spec = spec
        """What the sandbox is made from."""
        self.cfg = cfg
        """The SandboxConfig (limits, user, workspace root)."""
        self.workspace: Workspace | None = None
        """The host-side workspace, once started."""
        self.user: SandboxUser | None = None
        """Who the sandbox runs as, once started."""
        self._shell: PersistentShell | None = None
        self._cgroup: SandboxCgroup | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._pristine = spec.repo_dir

    def _identity(self) -> SandboxUser:
        if os.geteuid() == 0:
            return lease_user(self.cfg.user, Path(self.cfg.workspace_root) / ".uids")
        return current_user()

    def _repo_source(self) -> str:
        """Host folder the workspace copies (and host_patch diffs against): spec.repo_dir, for these backends."""
        return self.spec.repo_dir

    def _prepare(self) -> None:
        """Backend checks and extra files, after the workspace exists and before the shell starts."""

    def _launch(self) -> tuple[list[str], dict[str, str]]:
        """(argv prefix that runs the command appended to it in isolation, host environment for it)."""
        raise NotImplementedError

    def _shell_workdir(self) -> str:
        return self.spec.workdir

    def _process_limit(self) -> int | None:
        return self.cfg.max_processes

    def _state_file(self) -> str:
        """Where the shell keeps its snapshot (a tmpfs inside the sandbox that outlives the shell)."""
        return "/tmp/.swe-sandbox-state"

    def start(self) -> None:
        """Copy the repository, start the shell; SandboxError (everything cleaned up) on failure."""
        if self._stopped:
            raise SandboxError("a stopped sandbox cannot be started again; make a new one")
        if self._shell is not None:
            return
        try:
            _sweep_once(self.cfg.workspace_root)
            _check_file_max(self.cfg)
            self.user = self._identity()
            self._pristine = self._repo_source()
            self.workspace = Workspace.create(
                self._pristine,
                self.cfg.workspace_root,
                self.user.uid,
                self.user.gid,
                self.spec.workdir,
                disk_mb=self.cfg.workspace_mb,
            )
            cfg = self.cfg
            self._cgroup = SandboxCgroup.create(
                self.workspace.folder.name, cfg.memory_mb << 20, cfg.max_processes
            )
            self._prepare()
            argv, env = self._launch()
            if self._cgroup is not None:
                argv = self._cgroup.enter_argv() + argv
            shell = PersistentShell(
                argv,
                popen_env=env,
                output_cap=self.cfg.output_cap_bytes,
                workdir=self._shell_workdir(),
                state_file=self._state_file(),
                process_limit=self._process_limit(),
                exports=self.spec.env,
                setup=tuple(self.spec.setup),
                repair=self.workspace.repair,
            )
            shell.start()
            self._shell = shell
        except BaseException:
            self._cleanup()
            raise

    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Run a command in the persistent shell (default timeout: sandbox.command_timeout_s)."""
        with self._lock:
            if self._shell is None:
                raise SandboxError("the sandbox is not running (not started, or stopped)")
            before = self._cgroup.events() if self._cgroup is not None else {}
            res = self._shell.run(command, self.cfg.command_timeout_s if timeout_s is None else timeout_s)
            return self._over_limit(res, before)

    def _over_limit(self, res: ExecResult, before: dict[str, int]) -> ExecResult:
        """res, with the sandbox-wide limits the command ran into named (limits_hit) and noted in its output."""
        cfg, notes = self.cfg, {}
        after = self._cgroup.events() if self._cgroup is not None else {}
        if after.get("memory", 0) > before.get("memory", 0):
            notes["memory"] = (
                f"the sandbox's memory limit ({cfg.memory_mb} MB for all its processes) was reached"
            )
        if after.get("processes", 0) > before.get("processes", 0):
            notes["processes"] = f"the sandbox's process limit ({cfg.max_processes}) was reached"
        if self.workspace.disk_capped:
            with contextlib.suppress(OSError):
                fs = os.statvfs(self.workspace.repo)
                if fs.f_bavail * fs.f_frsize < DISK_FULL_BYTES:
                    notes["disk"] = f"the workspace is full ({cfg.workspace_mb} MB, sandbox.workspace_mb)"
        if not notes:
            return res
        text = "\n[sandbox: " + "; ".join(notes.values()) + "]\n"
        return dataclasses.replace(res, output=res.output + text.encode(), limits_hit=tuple(notes))

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a repository file (or its last max_bytes bytes) through the host side of the workspace."""
        if self.workspace is None or self._stopped:
            raise SandboxError("the sandbox is not running (not started, or stopped)")
        return self.workspace.read_file(path, max_bytes)

    def write_file(self, path: str, data: bytes) -> None:
        """Write a repository file through the host side of the workspace (symlink-safe)."""
        if self.workspace is None or self._stopped:
            raise SandboxError("the sandbox is not running (not started, or stopped)")
        self.workspace.write_file(path, data)

    def host_patch(self, max_bytes: int) -> str:
        """The workspace's changes against the repository it was copied from, diffed on the host (host_diff.py)."""
        if self.workspace is None or self._stopped:
            raise SandboxError("the sandbox is not running (not started, or stopped)")
        return host_diff(self._pristine, self.workspace.repo, max_bytes)

    def stop(self) -> None:
        """Kill everything (even mid-command, from another thread) and remove the workspace; idempotent."""
        self._stopped = True
        shell = self._shell
        if shell is not None:
            shell.abort()  # not under the lock: a running exec sees its shell die and returns
        with self._lock:
            self._cleanup()

    def _cleanup(self) -> None:
        """Kill the shell, remove the workspace, give the uid back: each step runs whatever the one before
        did (the workspace's removal never raises; what stays is swept later)."""
        try:
            if self._shell is not None:
                shell, self._shell = self._shell, None
                shell.close()
            if self._cgroup is not None:
                group, self._cgroup = self._cgroup, None
                group.remove()
        finally:
            try:
                if self.workspace is not None:
                    workspace, self.workspace = self.workspace, None
                    workspace.remove()
            finally:
                if self.user is not None:
                    user, self.user = self.user, None
                    user.release()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_swept: set[str] = set()


def _check_file_max(cfg, path: str = "/proc/sys/fs/file-max") -> None:
    """Warn (once) when one sandbox could open more files than the host allows: RLIMIT_NOFILE is per process,
    so max_processes x max_open_files is what one runaway sandbox can pin. Not times max_concurrent: that
    product (4,194,304 with the defaults) needs every sandbox to fork to its limit with every file open at
    once, which no agent does, and it warned on every start on ordinary hosts (issue 42, item 11)."""
    try:
        file_max = int(Path(path).read_text())
    except (OSError, ValueError):
        return
    one_sandbox = cfg.max_processes * cfg.max_open_files
    if one_sandbox > file_max:
        warn_once(
            f"sandbox.max_processes x max_open_files = {one_sandbox} exceeds the host's fs.file-max ({file_max}): "
            "one sandbox could exhaust the host's open files; lower sandbox.max_open_files"
        )


def _sweep_once(root: str) -> None:
    """Remove workspaces left by crashed processes, once per process and root (never raises)."""
    if root not in _swept:
        _swept.add(root)
        sweep_stale(root)
        sweep_stale_groups()

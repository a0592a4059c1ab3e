"""What an agent's commands cannot do in the bwrap sandbox (design.md invariant 7), and abuse that must end
with a clear error while the host and another sandbox carry on."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from swe_megatron.sandbox.users import subuid_range

pytestmark = pytest.mark.sandbox

PROJECT = Path(__file__).resolve().parents[2]


def test_runs_as_an_unprivileged_user_without_capabilities(sandbox):
    res = sandbox.exec("id -u; id -g; grep -E '^Cap(Eff|Prm|Inh|Amb)' /proc/self/status")
    lines = res.output.decode().split("\n")
    assert lines[:2] == ["1000", "1000"]
    assert all(line.split()[1] == "0000000000000000" for line in lines[2:] if line)
    assert sandbox.exec("unshare -U true").exit_code != 0  # no new user namespaces
    host_uid = sandbox.user.uid
    assert host_uid != 0
    span = subuid_range("swe-sandbox", sandbox.user.uid)
    # tools/sandbox_setup.sh (which these tests need) reserves the range: a uid of its own from it
    assert span is not None and span[0] <= host_uid < span[0] + span[1], span


def test_host_files_are_invisible(sandbox):
    here = Path.cwd()
    for path in (
        PROJECT / "pyproject.toml",
        here / "pyproject.toml",
        Path("/root/.bashrc"),
        Path("/etc/shadow"),
    ):
        res = sandbox.exec(f"cat {path}")
        assert res.exit_code != 0 and b"No such file" in res.output, path
    for folder in (
        PROJECT,
        here,
        Path("/root"),
        Path("/home"),
        Path("/var/tmp/swe-megatron-sandboxes"),
        Path("/work"),
    ):
        res = sandbox.exec(f"ls -A {folder} 2>&1 | grep -v -x swe-sandbox")
        assert res.output == b"" or b"No such file" in res.output, (folder, res.output)
    assert b"swe-sandbox" in sandbox.exec("cat /etc/passwd").output
    assert b"root:x:0:0" in sandbox.exec("cat /etc/passwd").output  # generated: no host accounts
    assert sandbox.exec("grep -c . /etc/passwd").output == b"3\n"


def test_no_network_but_loopback_inside(sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        probe = (
            "import socket, sys\n"
            "for host, port in [('1.1.1.1', 53), ('8.8.8.8', 443), ('127.0.0.1', int(sys.argv[1]))]:\n"
            "    s = socket.socket(); s.settimeout(3)\n"
            "    try: s.connect((host, port)); print('CONNECTED', host)\n"
            "    except OSError as e: print('refused', host, e.errno)\n"
            "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()\n"
            "c = socket.create_connection(srv.getsockname(), timeout=3); print('loopback ok')\n"
        )
        sandbox.write_file("probe.py", probe.encode())
        res = sandbox.exec(f"python probe.py {port}")
    finally:
        listener.close()
    out = res.output.decode()
    assert "CONNECTED" not in out
    assert out.count("refused") == 3 and "loopback ok" in out, out
    assert sandbox.exec("getent hosts localhost").exit_code == 0
    assert sandbox.exec("getent hosts pypi.org").exit_code != 0


def test_calls_that_reach_into_other_processes_are_refused(sandbox):
    """The seccomp filter (sandbox/seccomp.py): ptrace and process_vm_readv of the shell fail with EPERM
    (the shell is the same uid: without the filter both succeed), while what test suites do still works."""
    probe = (
        "import ctypes, os, signal, socket, subprocess, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "shell = os.getppid()\n"
        "def err(rc):\n"
        "    return 'ok' if rc >= 0 else os.strerror(ctypes.get_errno())\n"
        "rc = libc.ptrace(16, shell, None, None)\n"  # PTRACE_ATTACH
        "print('attach', err(rc))\n"
        "if rc == 0:\n"
        "    libc.ptrace(17, shell, None, None)\n"
        "buf = ctypes.create_string_buffer(8)\n"
        "local = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)\n"
        "remote = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)\n"
        "print('vm_readv', err(libc.process_vm_readv(shell, local, 1, remote, 1, 0)))\n"
        "print('traceme', err(libc.ptrace(0, 0, None, None)))\n"
        "child = subprocess.Popen(['sleep', '30']); child.send_signal(signal.SIGTERM); child.wait()\n"
        "t = threading.Thread(target=print, args=('thread ok',)); t.start(); t.join()\n"
        "a, b = socket.socketpair(); a.sendall(b'x'); print('socketpair', b.recv(1).decode())\n"
    )
    sandbox.write_file("probe.py", probe.encode())
    res = sandbox.exec("grep -E '^Seccomp:' /proc/self/status; python probe.py")
    out = res.output.decode()
    assert "Seccomp:\t2" in out, out  # a filter is loaded
    for call in ("attach", "vm_readv", "traceme"):
        assert f"{call} Operation not permitted" in out, out
    assert "thread ok" in out and "socketpair x" in out and res.exit_code == 0, out


def test_cannot_write_outside_the_repository(sandbox):
    targets = (
        "/usr/evil",
        "/etc/evil",
        "/evil",
        "/opt/venv/evil",
        "/bin/evil",
        "/dev/evil",
        "/proc/sys/kernel/evil",
    )
    for target in targets:
        res = sandbox.exec(f"echo x > {target}")
        assert res.exit_code != 0, target
    assert (
        sandbox.exec(
            "echo x > /testbed/ok && echo x > /tmp/ok && echo x > ~/ok && echo x > /dev/shm/ok"
        ).exit_code
        == 0
    )
    assert not Path("/usr/evil").exists() and not Path("/etc/evil").exists()
    big = sandbox.exec("head -c 20M /dev/zero > /testbed/big")  # max_file_mb=16
    assert big.exit_code != 0 and b"File size limit exceeded" in big.output


@contextmanager
def bystander(make):
    """Another sandbox running commands (each needs a fork) and the host forking, while the test abuses."""
    other = make()
    stats = {"other": 0, "host": 0, "slowest": 0.0, "errors": []}
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            t0 = time.monotonic()
            res = other.exec("/bin/echo ok", timeout_s=10)
            if res.output != b"ok\n":
                stats["errors"].append(res)
            subprocess.run(["true"], check=True)
            stats["host"] += 1
            stats["other"] += 1
            stats["slowest"] = max(stats["slowest"], time.monotonic() - t0)
            time.sleep(0.02)

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield stats
    finally:
        stop.set()
        thread.join()
    assert not stats["errors"], stats["errors"][:1]
    assert stats["other"] > 0 and stats["host"] > 0
    assert stats["slowest"] < 5.0, stats


# Forks until refused; prints "forked=N" last. A child never returns into the loop (try/finally os._exit) and
# closes its output first, yet one that fails under load before that (issue 42 item 12: a traceback came
# before the count) may still write: the count is the parent's marked line, wherever it stands. Dead children
# are not reaped, so each forked child holds its pid (a zombie) and N stays the number of pids taken.
FORK_UNTIL_REFUSED = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            try:
                os.close(1), os.close(2)
                time.sleep(60)
            finally:
                os._exit(0)
        n += 1
except OSError as e:
    print("forked=%d" % n, e.strerror, flush=True)
"""


def forked_count(output: bytes) -> int | None:
    """FORK_UNTIL_REFUSED's count from a command's output (other processes' lines around it), None if absent."""
    found = re.findall(rb"^forked=(\d+) ", output, re.MULTILINE)
    return int(found[-1]) if len(found) == 1 else None


def test_the_fork_count_is_read_past_a_failed_childs_traceback():
    child = b'  File "<string>", line 9, in <module>\nMemoryError\n'  # as under load (issue 42 item 12)
    assert forked_count(child + b"forked=59 Resource temporarily unavailable\n\n[sandbox: ...]\n") == 59
    assert forked_count(child) is None  # no count: the test reports the output instead of a ValueError


def idle_processes(group, at_most: int | None = None, timeout_s: float = 60.0) -> int:
    """The processes in a sandbox's cgroup while no command runs: the fewest seen over half a second or, given
    `at_most` (an idle count read before), the count once it is back down to that. A bomb's processes, killed at
    its timeout, take 0.2 s to leave on an idle host and seconds on a loaded one (issue 42 item 12: read one
    second after, they were counted as idle, and the pid equation below was off by them)."""
    path = group.folders[-1] / "pids.current"
    if at_most is None:
        reads = []
        for _ in range(6):
            reads.append(int(path.read_text()))
            time.sleep(0.1)
        return min(reads)
    deadline = time.monotonic() + timeout_s
    while (now := int(path.read_text())) > at_most and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


def test_fork_bombs_end_and_others_carry_on(make, sandbox, cfg):
    group = sandbox._cgroup
    sandbox.exec("true")  # the sandbox's own processes are up
    baseline = idle_processes(group) if group is not None else 0
    with bystander(make):
        res = sandbox.exec(":(){ :|: ; };:", timeout_s=2)  # in the foreground
        assert res.timed_out and b"timed out after 2 s" in res.output
        res = sandbox.exec("python -c 'import os\nwhile True: os.fork()'", timeout_s=5)
        assert b"Resource temporarily unavailable" in res.output, res
        if group is not None:  # the sandbox's own limit refused the forks, and the result says so
            assert (
                "processes" in res.limits_hit
                and f"process limit ({cfg.max_processes})" in res.output.decode()
            )
            # Exactly max_processes processes in the sandbox: those idle in it, the python and its children.
            idle = idle_processes(group, at_most=baseline)  # once the bombs' last processes are gone
            res = sandbox.exec(f"python -c '{FORK_UNTIL_REFUSED}'", timeout_s=20)
            children = forked_count(res.output)
            assert children is not None, res
            assert idle + 1 + children == cfg.max_processes, (idle, baseline, children, res)
            assert res.limits_hit == ("processes",), res
        sandbox.exec(":(){ :|:& };:")  # left running in the background: the next timeout clears it
        assert sandbox.exec("sleep 30", timeout_s=2).timed_out
    assert sandbox.exec("/bin/echo recovered", timeout_s=5).output == b"recovered\n"
    assert int(sandbox.exec("ps -e --no-headers | wc -l").output) < 10


def test_memory_cpu_and_output_abuse_end_with_clear_errors(make, cfg, venv):
    sb = make(replace(cfg, cpu_seconds=1), env_dir=str(venv))
    with bystander(make):
        res = sb.exec("python -c 'x = bytearray(10 * 1024**3)'")
        assert res.exit_code == 1 and b"MemoryError" in res.output
        res = sb.exec("python -c 'while True: pass'", timeout_s=15)
        assert res.exit_code == 152 and b"CPU time limit exceeded" in res.output  # 128 + SIGXCPU
        res = sb.exec("while :; do sleep 1; done", timeout_s=1)  # hangs without CPU: the wall timeout ends it
        assert res.timed_out and b"timed out" in res.output
        res = sb.exec("head -c 100000000 /dev/zero; echo tail-end", timeout_s=30)
        assert res.truncated and res.exit_code == 0 and res.output.endswith(b"tail-end\n")
        assert b"bytes omitted" in res.output and len(res.output) < 5000
    assert sb.exec("echo still here").output == b"still here\n"

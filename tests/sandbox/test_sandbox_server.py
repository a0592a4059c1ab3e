"""The sandbox server (a real `swe-megatron sandbox-server` process) and its client."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sandbox_servers import TOKEN, SandboxServer

from swe_megatron.sandbox import SandboxError, SandboxSpec
from swe_megatron.sandbox.client import SandboxClient

pytestmark = pytest.mark.sandbox


def Server(tmp: Path, *overrides: str) -> SandboxServer:
    """A sandbox server with small limits."""
    return SandboxServer(tmp, 2, "sandbox.memory_mb=512", "sandbox.max_processes=64", *overrides)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("server"))
    yield srv
    srv.close()


def _processes_with(needle: bytes) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def _raw(server: Server, headers: dict) -> int:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/v1/health", headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def test_requests_need_the_token(server):
    assert _raw(server, {}) == 401
    assert _raw(server, {"Authorization": "Bearer wrong"}) == 401
    assert _raw(server, {"Authorization": f"Bearer {TOKEN}x"}) == 401
    assert _raw(server, {"Authorization": f"Bearer {TOKEN}"}) == 200
    with (
        pytest.raises(SandboxError, match="token"),
        SandboxClient(server.url, "wrong-token-0123456789", attach=False) as c,
    ):
        c.health()


def test_remote_sandbox_works_like_a_local_one(server, repo):
    with server.client() as client:
        assert client.health()["backend"] == "bwrap"
        with client.sandbox(SandboxSpec(repo_dir=str(repo), env={"K": "v"})) as sb:
            assert client.health()["running"] == 1
            sb.exec("cd pkg")
            res = sb.exec("pwd; echo $K; printf '\\xff'")
            assert res.output == b"/testbed/pkg\nv\n\xff" and res.exit_code == 0
            assert sb.exec("sleep 20", timeout_s=1).timed_out
            sb.exec("echo 'def sub(a, b):' >> __init__.py")
            assert "+def sub(a, b):" in sb.host_patch(1 << 20)  # issue 24 item 5, on the server's host
            sb.write_file("pkg/new.py", b"\x00data")
            assert sb.read_file("/testbed/pkg/new.py") == b"\x00data"
            assert sb.read_file("/testbed/pkg/new.py", max_bytes=3) == b"ata"  # only the tail (issue 24)
            sb.exec("mkfifo pipe")
            with pytest.raises(PermissionError):  # a fifo would block a capped read: refused
                sb.read_file("/testbed/pkg/pipe", max_bytes=3)
            with pytest.raises(FileNotFoundError):
                sb.read_file("nope")
            sb.exec("ln -s /etc/passwd leak")
            with pytest.raises(PermissionError):
                sb.read_file("/testbed/pkg/leak")
        assert client.health()["running"] == 0
        with pytest.raises(SandboxError, match="did not start"):
            client.sandbox(SandboxSpec(repo_dir="/nonexistent/repo")).start()
        kept = client.sandbox(SandboxSpec(repo_dir=str(repo)))
        kept.start()
        assert client.health()["running"] == 1
    # closing the client ended its session: the server stopped the sandbox it left running
    with server.client(attach=False) as other:
        assert other.health()["running"] == 0
    assert server.workspaces() == []


def test_the_concurrency_cap_is_enforced(server, repo):
    with server.client() as client:
        spec = SandboxSpec(repo_dir=str(repo))
        first, second = client.sandbox(spec), client.sandbox(spec)
        first.start()
        second.start()
        with pytest.raises(SandboxError, match="capacity: 2 of 2"):
            client.sandbox(spec).start()
        first.stop()
        third = client.sandbox(spec)
        third.start()
        assert third.exec("echo ok").output == b"ok\n"
        assert client.health()["running"] == 2


def test_bad_requests_are_rejected_clearly(server):
    with server.client(attach=False) as client:
        with pytest.raises(SandboxError, match="unknown spec fields"):
            client.request("POST", "/v1/sandboxes", {"spec": {"repo_dir": "/x", "evil": 1}})
        with pytest.raises(SandboxError, match="no such sandbox"):
            client.request("POST", "/v1/sandboxes/nope/exec", {"command": "id"})
        with pytest.raises(SandboxError, match="setup=.* is invalid"):
            client.request("POST", "/v1/sandboxes", {"spec": {"repo_dir": "/x", "setup": "export A=1"}})


def test_a_remote_sandbox_runs_its_environment_setup(server, repo):
    """SandboxSpec.setup (a task image's activation) crosses the server and runs before the first command, its
    output discarded; its exports stay and the shell is at workdir whatever the setup changed."""
    with server.client() as client:
        sb = client.sandbox(
            SandboxSpec(repo_dir=str(repo), setup=("echo noise", "export TASK_ENV=on", "cd /"))
        )
        sb.start()
        assert sb.exec("echo $TASK_ENV; pwd").output == b"on\n/testbed\n"


MALFORMED = [  # (endpoint, body, the field the answer must name)
    ("exec", {"command": "id", "timeout_s": float("nan")}, "timeout_s"),
    ("exec", {"command": "id", "timeout_s": float("inf")}, "timeout_s"),
    ("exec", {"command": "id", "timeout_s": -1}, "timeout_s"),
    ("exec", {"command": "id", "timeout_s": 0}, "timeout_s"),
    ("exec", {"command": "id", "timeout_s": True}, "timeout_s"),
    ("exec", {"command": "id", "timeout_s": "5"}, "timeout_s"),
    ("exec", {"command": "echo \x00", "timeout_s": 5}, "command"),
    ("exec", {"command": 3}, "command"),
    ("exec", {"timeout_s": 5}, "command"),
    ("read", {"path": "a\x00b"}, "path"),
    ("read", {"path": ["a"]}, "path"),
    ("read", {"path": "a", "max_bytes": -1}, "max_bytes"),
    ("read", {"path": "a", "max_bytes": "9"}, "max_bytes"),
    ("write", {"path": "a\x00b", "data_b64": ""}, "path"),
    ("write", {"path": "x.txt", "data_b64": "not base64!"}, "data_b64"),
    ("write", {"path": "x.txt", "data_b64": "abc"}, "data_b64"),
    ("write", {"path": "x.txt"}, "data_b64"),
    ("start", {"spec": {"repo_dir": "/x\x00y"}}, "repo_dir"),
    ("start", {"spec": {"repo_dir": "/x", "workdir": 5}}, "workdir"),
    ("start", {"spec": {"repo_dir": "/x", "workdir": "testbed"}}, "workdir"),
    ("start", {"spec": {"repo_dir": "/x", "env": {"A": 1}}}, "env"),
    ("start", {"spec": {"repo_dir": "/x", "env": ["A"]}}, "env"),
    ("start", {"spec": {"repo_dir": "/x", "env": {"A\x00": "1"}}}, "env"),
    ("start", {"spec": {"repo_dir": "/x", "env_dir": 1}}, "env_dir"),
    ("start", {"spec": {"repo_dir": "/x", "image": "a\x00"}}, "image"),
    ("start", {"spec": "repo"}, "spec"),
]


def test_every_malformed_request_field_is_a_400_naming_it(server, repo):
    """A NUL path, bad base64 or a NaN timeout were answered 500, timeout_s=-1 restarted the sandbox's shell and
    Infinity ran unbounded; every malformed field is now refused with 400 naming it, and the sandbox is untouched."""
    with server.client() as client, client.sandbox(SandboxSpec(repo_dir=str(repo), env={"EMPTY": ""})) as sb:
        sb.exec("export MARK=kept; cd pkg")
        for endpoint, body, field in MALFORMED:
            path = "/v1/sandboxes" if endpoint == "start" else f"/v1/sandboxes/{sb.id}/{endpoint}"
            with pytest.raises(SandboxError) as info:
                client.request("POST", path, body)
            assert "(HTTP 400)" in str(info.value) and field in str(info.value), (endpoint, body, info.value)
        assert sb.exec("echo $MARK; pwd").output == b"kept\n/testbed/pkg\n"  # same shell, not restarted
        assert client.health()["running"] == 1


def test_sandboxes_stop_when_their_client_process_dies(server, repo):
    script = textwrap.dedent(
        f"""
        import time
        from swe_megatron.sandbox import SandboxSpec
        from swe_megatron.sandbox.client import SandboxClient
        client = SandboxClient({server.url!r}, {TOKEN!r})
        sb = client.sandbox(SandboxSpec(repo_dir={str(repo)!r}))
        sb.start()
        sb.exec("sleep 4242 &")
        print("ready", flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert _processes_with(b"4242")
        child.kill()  # no close(), no goodbye: the attach stream just breaks
    finally:
        child.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (server.workspaces() or _processes_with(b"sleep\x004242")):
        time.sleep(0.2)
    assert server.workspaces() == []
    assert not _processes_with(b"sleep\x004242")


def test_idle_sandboxes_are_reaped_when_their_lease_expires(tmp_path, repo):
    srv = Server(tmp_path, "sandbox.lease_timeout_s=1")
    try:
        client = srv.client(attach=False)  # a client that holds no session open
        idle, renewed = (
            client.sandbox(SandboxSpec(repo_dir=str(repo))),
            client.sandbox(SandboxSpec(repo_dir=str(repo))),
        )
        idle.start()
        busy = srv.client(attach=False)
        long_cmd = busy.sandbox(SandboxSpec(repo_dir=str(repo)))
        long_cmd.start()
        idle_id = idle.id
        res = long_cmd.exec("sleep 1.6; echo done", timeout_s=10)  # running commands hold their lease
        assert res.output == b"done\n"
        with pytest.raises(SandboxError, match="no such sandbox"):
            client.request("POST", f"/v1/sandboxes/{idle_id}/exec", {"command": "true"})
        renewed.start()
        for _ in range(4):  # heartbeats keep it alive past the lease
            time.sleep(0.35)
            client.heartbeat()
        assert renewed.exec("echo alive").output == b"alive\n"
    finally:
        srv.close()


def test_sigterm_stops_every_sandbox(tmp_path, repo):
    srv = Server(tmp_path)
    try:
        client = srv.client()
        for _ in range(2):
            sb = client.sandbox(SandboxSpec(repo_dir=str(repo)))
            sb.start()
            sb.exec("sleep 4343 & setsid sleep 4343 &")
        assert len(srv.workspaces()) == 2 and _processes_with(b"4343")
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=30) == 0
        assert srv.workspaces() == []
        assert not _processes_with(b"sleep\x004343")
        with pytest.raises(SandboxError, match="unreachable"):
            client.health()
        client.close()
    finally:
        srv.close()


def test_the_command_refuses_a_bad_setup(tmp_path, capsys, monkeypatch):
    from swe_megatron.cli import main

    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o644)
    assert main(["sandbox-server", "--token-file", str(token)]) == 2
    assert "readable by other users" in capsys.readouterr().err
    monkeypatch.delenv("SWE_MEGATRON_SANDBOX_TOKEN", raising=False)
    assert main(["sandbox-server"]) == 2
    assert "no token" in capsys.readouterr().err
    token.chmod(0o600)
    assert main(["sandbox-server", "--token-file", str(token), "--backend", "local"]) == 2
    assert "allow_local=true" in capsys.readouterr().err
    for bad in (["--max-concurrent", "0"], ["--port", "-1"], ["--port", "70000"]):
        assert main(["sandbox-server", "--token-file", str(token), *bad]) == 2
        err = capsys.readouterr().err
        assert (
            bad[0].removeprefix("--").replace("-", "_") in err.replace("-", "_") and err.count("\n") == 1
        ), err


def _sockets() -> int:
    """Sockets this process has open."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is closed by now
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return n


def test_threads_share_the_clients_connections(server):
    """One kept connection per request in flight, not one per thread (a thousand episode threads over 16
    servers held one each: 16k sockets at the controller and ~1k at each server)."""
    import threading

    client = server.client(attach=False)
    try:
        before, done, hold = _sockets(), threading.Semaphore(0), threading.Event()

        def episode() -> None:  # one request, then the thread lives on (as an episode thread does)
            client.health()
            done.release()
            hold.wait()

        threads = [threading.Thread(target=episode) for _ in range(8)]
        for t in threads:  # one after the other: one request in flight at a time
            t.start()
            done.acquire()
        assert _sockets() - before == 1
    finally:
        hold.set()
        client.close()

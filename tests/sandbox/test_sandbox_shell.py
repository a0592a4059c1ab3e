"""The persistent shell and file access of the bwrap backend: state, timeouts, output, files, stop."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from swe_megatron.sandbox import SandboxError, SandboxSpec, make_sandbox
from swe_megatron.sandbox.workspace import Workspace, sweep_stale

pytestmark = pytest.mark.sandbox


def test_cwd_and_environment_persist(sandbox):
    assert sandbox.exec("cd pkg && export COLOR=blue && SHADE=dark").exit_code == 0
    res = sandbox.exec("pwd; echo $COLOR $SHADE")
    assert res.output == b"/testbed/pkg\nblue dark\n"
    assert (res.exit_code, res.timed_out, res.truncated) == (0, False, False)


def test_exit_code_and_stderr_are_merged(sandbox):
    res = sandbox.exec("echo out; echo err >&2; exit_code_of() { return 7; }; exit_code_of")
    assert res.exit_code == 7
    assert res.output == b"out\nerr\n"


def test_spec_env_and_venv_python(make, venv):
    sb = make(env_dir=str(venv), env={"TASK_ID": 'x\'1 "y"\n'})
    assert sb.exec('printf %s "$TASK_ID"').output == b'x\'1 "y"\n'
    res = sb.exec("which python; python -c 'import sys; print(sys.prefix, sys.executable)'")
    assert res.output == b"/opt/venv/bin/python\n/opt/venv /opt/venv/bin/python\n"


def test_commands_are_passed_verbatim(sandbox):
    weird = "printf '%s|' \"a b\" \"c'd\" $'\\t' ünï \\$HOME; cat <<'EOF'\nline $x `y`\nEOF"
    res = sandbox.exec(weird)
    assert res.output == b"a b|c'd|\t|\xc3\xbcn\xc3\xaf|$HOME|line $x `y`\n"
    assert sandbox.exec("echo 'unterminated").exit_code == 2  # a syntax error is the command's, not ours
    assert sandbox.exec("echo fine").output == b"fine\n"
    assert sandbox.exec("a\x00b").exit_code == 2


def test_a_shell_whose_pipes_are_past_fd_1024_still_runs_commands(cfg, repo):
    """A sandbox server with hundreds of sandboxes holds thousands of descriptors; select() refuses any past
    FD_SETSIZE (1024), which broke every start at 1024 episodes in flight (tools/sim_scale.py)."""
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open("/dev/null", os.O_RDONLY))
        sb = make_sandbox(SandboxSpec(repo_dir=str(repo)), cfg)
        sb.start()
        try:
            res = sb.exec("echo past-1024; printf '%s' \"$PWD\"")
            assert res.output == b"past-1024\n/testbed" and res.exit_code == 0
        finally:
            sb.stop()
    finally:
        for fd in held:
            os.close(fd)


def test_commands_cannot_read_the_protocol_stream(sandbox):
    res = sandbox.exec("cat; read -r line; echo read=$?")
    assert res.output == b"read=1\n"


def test_tracing_does_not_confuse_the_protocol(sandbox):
    sandbox.exec("set -x")
    res = sandbox.exec("echo traced")
    assert res.exit_code == 0 and b"traced\n" in res.output
    sandbox.exec("set +x")
    assert sandbox.exec("echo quiet").output.endswith(b"quiet\n")


def test_non_utf8_output_survives(sandbox):
    res = sandbox.exec("printf '\\xff\\xfe\\x00\\x80ok'")
    assert res.output == b"\xff\xfe\x00\x80ok"


def test_output_cap_keeps_head_and_tail_with_a_notice(sandbox):
    res = sandbox.exec("echo START; head -c 100000 /dev/zero | tr '\\0' x; echo; echo END")
    assert res.truncated and res.exit_code == 0
    assert res.output.startswith(b"START\n") and res.output.endswith(b"END\n")
    assert b"[sandbox: output truncated:" in res.output
    assert len(res.output) < 4096 + 200


def test_timeout_kills_the_command_but_keeps_cwd_env_and_tmp(sandbox):
    sandbox.exec("cd pkg; export KEEP=1; echo data > /tmp/scratch")
    res = sandbox.exec("sleep 30; echo never", timeout_s=1)
    assert res.timed_out and res.exit_code == -1
    assert b"never" not in res.output
    assert b"timed out after 1 s" in res.output
    assert sandbox.exec("pwd; echo $KEEP; cat /tmp/scratch").output == b"/testbed/pkg\n1\ndata\n"


def test_timeout_of_a_builtin_loop_and_of_background_work(sandbox):
    sandbox.exec("sleep 300 &")  # started by an earlier command: survives the next timeout
    res = sandbox.exec("while :; do :; done", timeout_s=1)
    assert res.timed_out
    res = sandbox.exec("(sleep 200; echo late) & setsid sleep 201 & sleep 100", timeout_s=1)
    assert res.timed_out
    left = sandbox.exec("ps -eo args").output.decode()
    assert "sleep 300" in left
    assert "sleep 200" not in left and "sleep 201" not in left and "sleep 100" not in left


def test_exit_starts_a_new_shell_with_the_same_state(sandbox):
    sandbox.exec("cd pkg; export KEEP=2")
    res = sandbox.exec("exit 3")
    assert res.exit_code == 3 and b"shell exited (status 3)" in res.output
    assert sandbox.exec("pwd; echo $KEEP").output == b"/testbed/pkg\n2\n"


def test_a_killed_supervisor_restarts_the_sandbox(sandbox):
    sandbox.exec("cd pkg; export KEEP=1")
    killed = sandbox.exec("kill -9 $PPID; sleep 1")
    # the command that killed it learns it, and the restart resets the state; the next command runs plainly
    assert b"the sandbox was restarted" in killed.output and killed.exit_code != 0, killed
    assert sandbox.exec("echo hi").output == b"hi\n"
    assert sandbox.exec("echo again$KEEP; pwd").output == b"again\n/testbed\n"


def test_read_and_write_files(sandbox):
    assert sandbox.read_file("pkg/__init__.py").startswith(b"def add")
    assert sandbox.read_file("/testbed/README.md") == b"toy\n"
    sandbox.write_file("new/dir/file.bin", b"\x00\xff")
    assert sandbox.exec("od -An -tx1 new/dir/file.bin; stat -c %U:%a new/dir/file.bin").output.split() == [
        b"00",
        b"ff",
        b"swe-sandbox:644",
    ]
    sandbox.exec("echo inside > made.txt; ln -s made.txt link; ln -s /testbed/README.md abs")
    assert sandbox.read_file("link") == b"inside\n"
    assert sandbox.read_file("abs") == b"toy\n"
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("missing.txt")
    with pytest.raises(IsADirectoryError):
        sandbox.read_file("pkg")


def test_file_access_cannot_escape_the_repository(sandbox):
    sandbox.exec(
        "ln -s /etc/shadow shadow; ln -s ../../../../etc/passwd up; ln -s /root rootdir; mkfifo fifo"
    )
    for path in ("shadow", "up", "rootdir/x", "/etc/passwd", "../outside", "/testbed/../etc/passwd"):
        with pytest.raises(PermissionError):
            sandbox.read_file(path)
    with pytest.raises(PermissionError):
        sandbox.write_file("shadow", b"pwned")
    with pytest.raises(PermissionError):
        sandbox.write_file("rootdir/evil", b"pwned")
    with pytest.raises(PermissionError):
        sandbox.read_file("fifo")  # a fifo would block the host
    assert b"pwned" not in Path("/etc/shadow").read_bytes()


def test_stop_kills_everything_and_removes_the_workspace(cfg, repo):
    sb = make_sandbox(SandboxSpec(repo_dir=str(repo)), cfg)
    sb.start()
    folder = sb.workspace.folder
    assert folder.is_dir() and not folder.is_relative_to("/root") and not folder.is_relative_to(repo)
    sb.exec("sleep 777 & setsid sleep 778 &")
    sb.stop()
    sb.stop()  # idempotent
    assert not folder.exists()
    cmdlines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            continue
    assert not any(b"sleep\x00777" in c or b"sleep\x00778" in c for c in cmdlines)
    with pytest.raises(SandboxError):
        sb.exec("true")


def test_a_sandbox_outlives_the_thread_that_started_it(cfg, repo):
    box = {}
    thread = threading.Thread(
        target=lambda: box.setdefault("sb", make_sandbox(SandboxSpec(repo_dir=str(repo)), cfg)).start()
    )
    thread.start()
    thread.join()  # bwrap's --die-with-parent follows the forking thread: it must not be this one
    try:
        assert box["sb"].exec("echo alive").output == b"alive\n"
    finally:
        box["sb"].stop()


def test_the_repository_is_copied_not_shared(sandbox, repo):
    sandbox.exec("echo changed > README.md; rm pkg/__init__.py")
    assert (repo / "README.md").read_text() == "toy\n"
    assert (repo / "pkg" / "__init__.py").exists()


def test_bad_specs_fail_with_clear_errors(cfg, tmp_path, venv):
    with pytest.raises(SandboxError, match="not a folder"):
        make_sandbox(SandboxSpec(repo_dir=str(tmp_path / "nope")), cfg).start()
    hidden = tmp_path / "env"  # under pytest's 0700 tmp folder: the sandbox user cannot reach it
    hidden.mkdir()
    (hidden / "bin").mkdir()
    with pytest.raises(SandboxError, match="not reachable by the sandbox user"):
        make_sandbox(SandboxSpec(repo_dir=str(venv), env_dir=str(hidden)), cfg).start()
    with pytest.raises(SandboxError, match="sandbox user 'nobody-here' does not exist"):
        make_sandbox(SandboxSpec(repo_dir=str(venv)), replace(cfg, user="nobody-here")).start()


def test_workspaces_of_dead_owners_are_swept(repo, tmp_path):
    root = tmp_path / "root"
    live = Workspace.create(str(repo), str(root), os.getuid(), os.getgid(), "/testbed")  # lock held
    dead = root / "sbx-dead"
    (dead / "repo").mkdir(parents=True)
    (dead / ".lock").touch()  # nobody holds it
    young = root / "sbx-young"
    young.mkdir()
    old = time.time() - 3600
    for path in (live.folder, dead):
        os.utime(path, (old, old))
    assert sweep_stale(root) == [dead]
    assert live.folder.exists() and young.exists() and not dead.exists()
    live.remove()

"""Limits hold per sandbox, not per process (issue 14, item 5): memory of all of a sandbox's processes
together (its cgroup), the workspace's disk (a tmpfs of sandbox.workspace_mb), open files (RLIMIT_NOFILE).
Each test goes past a limit and sees it contained, the sandbox reported over the limit, and the host and a
sandbox beside it unaffected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from sandbox_servers import SandboxServer

from swe_megatron.config.schema import SandboxBackend, SandboxConfig
from swe_megatron.sandbox import SandboxSpec
from swe_megatron.sandbox.cgroups import parents
from swe_megatron.sandbox.shell import _check_file_max

pytestmark = pytest.mark.sandbox

PROJECT = Path(__file__).resolve().parents[2]
HOLD = "import sys, time; b = bytearray(200 << 20); print('held', flush=True); time.sleep(4); print('kept')"


def _bystander_ok(make) -> None:
    other = make()
    assert other.exec("python3 -c 'b = bytearray(50 << 20); print(len(b))'").output == b"52428800\n"


@pytest.mark.skipif(parents() is None, reason="no usable cgroup on this host (needs root with cgroup v1/v2)")
def test_memory_is_limited_for_all_processes_of_a_sandbox_together(make, cfg):
    sb = make(replace(cfg, memory_mb=256))
    shell_cgroup = Path(f"/proc/{sb._shell._shell_pid}/cgroup").read_text()
    assert f"swe-{sb.workspace.folder.name}" in shell_cgroup  # the sandbox's processes are in its group
    res = sb.exec(f'python3 -c "{HOLD}" & python3 -c "{HOLD}" & wait', timeout_s=30)
    out = res.output.decode()
    # Each process is under the per-process address-space limit (256 MB); the two together are not.
    assert out.splitlines().count("kept") <= 1, out
    assert "memory" in res.limits_hit and "memory limit (256 MB for all its processes)" in out
    assert sb.exec("echo fine").output == b"fine\n"  # the sandbox goes on
    assert sb.exec("echo again").limits_hit == ()  # reported once, for the command that hit it
    _bystander_ok(make)


def test_workspace_disk_is_capped_for_the_sandbox(make, cfg):
    if os.geteuid() != 0:
        pytest.skip("the workspace tmpfs needs root")
    sb = make(replace(cfg, workspace_mb=64, max_file_mb=512, memory_mb=1024))
    host = os.statvfs(Path(sb.workspace.folder).parent)
    free_before = host.f_bavail * host.f_frsize
    # Four files of 30 MB: each under the per-file cap, together past the 64 MB workspace.
    res = sb.exec("for i in 1 2 3 4; do head -c 30000000 /dev/zero > big$i || echo failed $i; done; du -sm .")
    out = res.output.decode()
    assert "No space left on device" in out and "failed 3" in out, out
    assert "disk" in res.limits_hit and "workspace is full (64 MB" in out
    used = sb.exec("du -sm . | cut -f1")
    assert int(used.output.split()[0]) <= 64 and used.limits_hit == ("disk",)  # still full: still said
    host = os.statvfs(Path(sb.workspace.folder).parent)
    assert free_before - host.f_bavail * host.f_frsize < 32 << 20  # the host's disk did not take it
    assert sb.exec("rm big*; echo ok > small; cat small").output == b"ok\n"  # freed space is usable again
    _bystander_ok(make)


def test_open_files_are_limited_per_process_from_the_config(make, cfg):
    sb = make(replace(cfg, max_open_files=64))
    assert sb.exec("ulimit -n").output == b"64\n"
    script = (
        "import os\nfds = []\ntry:\n    while True: fds.append(os.open('/dev/null', os.O_RDONLY))\n"
        "except OSError as e: print(len(fds), e.strerror)"
    )
    res = sb.exec(f'python3 -c "{script}"')
    count, _, reason = res.output.decode().strip().partition(" ")
    assert reason == "Too many open files" and int(count) < 64, res.output
    _bystander_ok(make)


@pytest.mark.skipif(parents() is None, reason="no usable cgroup on this host (needs root with cgroup v1/v2)")
def test_apptainer_sandboxes_join_their_own_group_instead_of_apptainer_flags(make, cfg, venv, monkeypatch):
    """The apptainer backend (against the stand-in CLI) holds the same per-sandbox limits; apptainer's own
    --memory/--pids-limit are only for hosts where no group can be made here."""
    fake = Path(__file__).resolve().parents[1] / "fake_apptainer"
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    sif = venv.parent / "limits.sif"
    sif.write_text(json.dumps({"fake_sif": 1, "env_dir": str(venv)}))
    sif.chmod(0o644)
    sb = make(
        replace(cfg, backend=SandboxBackend.apptainer, memory_mb=256, max_open_files=100), image=str(sif)
    )
    assert "--memory" not in sb._shell.launcher and sb._shell.launcher[:2] == ["/bin/sh", "-c"]
    assert sb.exec("ulimit -n").output == b"100\n"
    res = sb.exec(f'python -c "{HOLD}" & python -c "{HOLD}" & wait', timeout_s=30)
    assert res.output.decode().splitlines().count("kept") <= 1 and "memory" in res.limits_hit, res.output


def test_without_cgroups_there_is_a_warning_and_no_group(tmp_path):
    """Not root and no delegated cgroup (as here for the sandbox user): create() warns and gives None."""
    code = (
        "import logging; logging.basicConfig(level=logging.WARNING, format='%(message)s')\n"
        "from swe_megatron.sandbox.cgroups import SandboxCgroup, parents\n"
        "print(parents(), SandboxCgroup.create('sbx-test', 1 << 28, 64))\n"
    )
    argv = [
        "setpriv",
        "--reuid=swe-sandbox",
        "--regid=swe-sandbox",
        "--clear-groups",
        sys.executable,
        "-c",
        code,
    ]
    proc = subprocess.run(argv, cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "None None", proc.stderr
    assert "no cgroup for sandboxes" in proc.stderr and "per process only" in proc.stderr


def test_a_remote_sandbox_reports_its_limits_too(tmp_path, repo):
    """Through a real sandbox server and its client: limits_hit travels with the result."""
    if os.geteuid() != 0:
        pytest.skip("the workspace tmpfs needs root")
    server = SandboxServer(tmp_path, 1, "sandbox.workspace_mb=64", "sandbox.max_file_mb=512")
    try:
        with server.client() as client, client.sandbox(SandboxSpec(repo_dir=str(repo))) as sb:
            res = sb.exec("head -c 100000000 /dev/zero > big; echo $?")
            assert res.limits_hit == ("disk",) and b"No space left on device" in res.output, res
    finally:
        server.close()


def test_a_host_file_max_the_sandboxes_could_exhaust_is_warned_about(cfg, tmp_path, caplog):
    """20,000 open files x 256 processes (one sandbox) exceeded this host's fs.file-max: said at start."""
    file_max = tmp_path / "file-max"
    file_max.write_text("2466170\n")
    _check_file_max(replace(cfg, max_concurrent=1, max_processes=256, max_open_files=20000), str(file_max))
    assert "exceeds the host's fs.file-max (2466170)" in caplog.text and "5120000" in caplog.text
    caplog.clear()
    _check_file_max(replace(cfg, max_concurrent=4, max_processes=256, max_open_files=1024), str(file_max))
    assert caplog.text == ""


def test_the_default_sandbox_settings_do_not_warn_about_file_max(tmp_path, caplog):
    """Issue 42 item 11: the defaults (16 sandboxes x 256 processes x 1024 files = 4,194,304) warned on every
    sandbox start on this ordinary host (fs.file-max 2466170); one sandbox's 262,144 is the real bound."""
    file_max = tmp_path / "file-max"
    file_max.write_text("2466170\n")
    _check_file_max(SandboxConfig(), str(file_max))
    assert caplog.text == ""

"""sandbox/cgroups.py without a sandbox: the limits it writes, the events it reads, the group its first process
joins (cgroup folders faked as plain folders: the kernel's files at the outer boundary), and, where this
process may make groups (root with cgroup v1, or a delegated v2 subtree), a real group's process limit.

Outside tests/sandbox on purpose: no bubblewrap and no sandbox user needed, so these run in the fast suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from swe_megatron.sandbox import cgroups
from swe_megatron.sandbox.cgroups import SandboxCgroup

MB = 1 << 20


def _fake(monkeypatch, tmp_path: Path, version: str) -> list[Path]:
    bases = [tmp_path / "memory", tmp_path / "pids"] if version == "v1" else [tmp_path / "unified"]
    for b in bases:
        b.mkdir()
    monkeypatch.setattr(cgroups, "parents", lambda: (version, bases))
    return bases


def test_v1_limits_and_events_each_in_its_own_hierarchy(monkeypatch, tmp_path):
    memory, pids = _fake(monkeypatch, tmp_path, "v1")
    g = SandboxCgroup.create("sbx-a", 256 * MB, 64)
    assert g is not None and g.folders == [memory / "swe-sbx-a", pids / "swe-sbx-a"]
    assert (memory / "swe-sbx-a" / "memory.limit_in_bytes").read_text() == str(256 * MB)
    assert (pids / "swe-sbx-a" / "pids.max").read_text() == "64"  # max_processes processes, not one more
    assert not (memory / "swe-sbx-a" / "pids.max").exists()
    assert g.events() == {"memory": 0, "processes": 0}  # no events files yet: nothing hit
    (memory / "swe-sbx-a" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (pids / "swe-sbx-a" / "pids.events").write_text("max 3\n")
    # A decoy in the memory folder: the pids events are read from the pids hierarchy only.
    (memory / "swe-sbx-a" / "pids.events").write_text("max 99\n")
    assert g.events() == {"memory": 2, "processes": 3}


def test_v2_limits_and_events_in_one_folder(monkeypatch, tmp_path):
    (base,) = _fake(monkeypatch, tmp_path, "v2")
    g = SandboxCgroup.create("sbx-b", 512 * MB, 100)
    folder = base / "swe-sbx-b"
    assert g is not None and g.version == "v2" and g.folders == [folder]
    assert (folder / "memory.max").read_text() == str(512 * MB)
    assert (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "pids.max").read_text() == "100"
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    (folder / "pids.events").write_text("max 5\n")
    assert g.events() == {"memory": 1, "processes": 5}


def test_the_first_process_joins_every_folder_of_the_group_before_the_command_runs(monkeypatch, tmp_path):
    _fake(monkeypatch, tmp_path, "v1")
    g = SandboxCgroup.create("sbx-c", 256 * MB, 64)
    proc = subprocess.run(
        [*g.enter_argv(), "sh", "-c", "echo $$"], capture_output=True, text=True, timeout=30
    )
    pid = proc.stdout.strip()  # the command is the process that joined: exec, not a child
    assert proc.returncode == 0 and pid.isdigit(), proc
    assert [(f / "cgroup.procs").read_text().strip() for f in g.folders] == [pid, pid]


def test_a_group_that_cannot_be_made_is_none_and_leaves_nothing(monkeypatch, tmp_path, caplog):
    memory, pids = _fake(monkeypatch, tmp_path, "v1")
    pids.rmdir()  # the second hierarchy is gone: mkdir fails after the first folder was made
    assert SandboxCgroup.create("sbx-d", 256 * MB, 64) is None
    assert not (memory / "swe-sbx-d").exists()
    assert "cannot make a cgroup" in caplog.text and "per process only" in caplog.text


def test_stale_empty_groups_are_swept_and_nothing_else(monkeypatch, tmp_path):
    memory, pids = _fake(monkeypatch, tmp_path, "v1")
    old = cgroups.time.time() - 2 * cgroups._STALE_S
    for base in (memory, pids):
        for name in ("swe-sbx-crashed", "swe-sbx-running", "swe-sbx-busy", "someone-else"):
            (base / name).mkdir()
        (base / "swe-sbx-busy" / "cgroup.procs").write_text("123\n")  # a group with processes: rmdir fails
        for name in ("swe-sbx-crashed", "swe-sbx-busy", "someone-else"):
            os.utime(base / name, (old, old))
    cgroups.sweep_stale_groups()
    for base in (memory, pids):
        assert sorted(p.name for p in base.iterdir()) == ["someone-else", "swe-sbx-busy", "swe-sbx-running"]


def test_a_warning_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(cgroups, "_warned", set())  # what this process already said (a rerun in one process)
    cgroups.warn_once("w28 test: said once")
    cgroups.warn_once("w28 test: said once")
    assert caplog.text.count("w28 test: said once") == 1


FORK_UNTIL_REFUSED = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            os.close(1), os.close(2)  # the test reads the output to its end: only the parent holds it
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as e:
    print(n, e.strerror)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or cgroups.parents() is None,
    reason="no cgroup this process may make groups in (needs root with cgroup v1, or a delegated v2 subtree)",
)
def test_a_real_group_holds_exactly_max_processes_and_counts_the_refusals():
    g = SandboxCgroup.create(f"sbx-test-{os.getpid()}", 256 * MB, 8)
    assert g is not None
    folders = list(g.folders)
    try:
        before = g.events()
        proc = subprocess.run(
            [*g.enter_argv(), sys.executable, "-c", FORK_UNTIL_REFUSED],
            capture_output=True,
            text=True,
            timeout=60,
        )
        # 8 processes in all: the python that forks and 7 children; the 8th fork is refused.
        assert proc.stdout.split() == ["7", "Resource", "temporarily", "unavailable"], proc
        after = g.events()
        assert after["processes"] > before["processes"] and after["memory"] == before["memory"]
    finally:
        g.remove()
    assert folders and not any(f.exists() for f in folders)  # the children were killed, the group removed

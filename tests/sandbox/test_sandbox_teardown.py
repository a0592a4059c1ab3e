"""Teardown never fails on what an agent left in its workspace, never leaks a uid lease, and a workspace an
earlier process could not remove never breaks a later process's sandboxes (issue 14, item 4)."""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from swe_megatron.sandbox.workspace import LOCK_NAME, remove_tree

pytestmark = pytest.mark.sandbox

DEPTH = 2500
PROJECT = Path(__file__).resolve().parents[2]


def _lease_is_free(root: Path, uid: int) -> bool:
    """Nobody holds the flock of uid's lease file (users.py)."""
    fd = os.open(root / ".uids" / f"{uid}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _deep_tree(base: Path, depth: int = DEPTH) -> None:
    """depth nested folders under base (made through dir fds: the path is longer than PATH_MAX)."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)


@pytest.fixture
def root():
    """A workspace root the sandbox user can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="swe-teardown-test-", dir="/var/tmp"))
    path.chmod(0o711)
    yield path
    subprocess.run(["chattr", "-R", "-i", "-a", str(path)], capture_output=True)
    subprocess.run(["rm", "-rf", str(path)])


def test_stop_removes_a_deep_tree_and_frees_the_uid(make, cfg, root):
    sb = make(cfg_=_at(cfg, root))
    make_deep = (
        f"import os\nfor _ in range({DEPTH}):\n    os.mkdir('d')\n    os.chdir('d')\nopen('f', 'w').close()"
    )
    res = sb.exec(f"python3 -c {shlex.quote(make_deep)}", timeout_s=60)
    assert res.exit_code == 0, res.output
    folder, uid = sb.workspace.folder, sb.user.uid
    sb.stop()  # raised RecursionError before, leaving the folder and the uid lease behind
    assert not folder.exists()
    assert _lease_is_free(root, uid)


def test_stop_removes_odd_modes_sockets_fifos_and_immutable_files(make, cfg, root):
    sb = make(cfg_=_at(cfg, root))
    script = (
        "mkdir -p locked/inner ro && echo a > locked/inner/f && chmod 000 locked/inner locked; "
        "echo b > ro/f && chmod 444 ro/f && chmod 555 ro; mkfifo fifo; chmod 000 fifo; "
        "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")'; "
        "chattr +i ro/f 2>/dev/null; touch plain; chmod 0 plain; ls -l | wc -l"
    )
    res = sb.exec(script)
    assert res.exit_code == 0, res.output
    repo = sb.workspace.repo
    # An immutable / append-only file (only root can set these flags; the host side tries the worst).
    (repo / "frozen").write_text("x")
    (repo / "append").write_text("x")
    assert subprocess.run(["chattr", "+i", str(repo / "frozen")]).returncode == 0
    assert subprocess.run(["chattr", "+a", str(repo / "append")]).returncode == 0
    folder, uid = sb.workspace.folder, sb.user.uid
    sb.stop()
    assert not folder.exists()
    assert _lease_is_free(root, uid)


def test_remove_tree_handles_what_it_is_given(root):
    """The remover itself: a deep tree, a file, a symlink (never followed), nothing at all."""
    tmp_path = root  # not pytest's tmp_path: its own cleanup of a leftover deep tree would recurse
    deep = tmp_path / "deep"
    deep.mkdir()
    _deep_tree(deep, 3000)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("k")
    (deep / "link").symlink_to(outside)
    assert remove_tree(deep)
    assert not deep.exists() and (outside / "keep").exists()
    (tmp_path / "f").write_text("x")
    assert remove_tree(tmp_path / "f") and not (tmp_path / "f").exists()
    assert remove_tree(tmp_path / "missing")


def test_a_workspace_an_earlier_run_left_never_breaks_a_later_sandbox(cfg, repo, root):
    """A dead owner's workspace with a deep tree and an immutable file: the next process's first sandbox
    (which sweeps) starts and runs; the stale folder is gone."""
    stale = root / "sbx-stale"
    (stale / "repo").mkdir(parents=True)
    (stale / LOCK_NAME).write_text("")
    _deep_tree(stale / "repo")
    (stale / "repo" / "frozen").write_text("x")
    assert subprocess.run(["chattr", "+i", str(stale / "repo" / "frozen")]).returncode == 0
    old = time.time() - 3600
    os.utime(stale, (old, old))
    code = (
        "import sys; from dataclasses import replace\n"
        "from swe_megatron.config.schema import SandboxConfig, SandboxBackend\n"
        "from swe_megatron.sandbox import SandboxSpec, make_sandbox\n"
        f"cfg = replace(SandboxConfig(), backend=SandboxBackend.bwrap, workspace_root={str(root)!r})\n"
        f"with make_sandbox(SandboxSpec(repo_dir={str(repo)!r}), cfg) as sb:\n"
        "    print(sb.exec('echo ran').output.decode().strip())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ran"
    assert not stale.exists()


def _at(cfg, root: Path):
    return replace(cfg, workspace_root=str(root))

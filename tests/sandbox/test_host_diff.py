"""sandbox/host_diff.py: the patch of a workspace whose sandbox cannot run `git diff` any more, taken on the
host. Applied to the pristine repository it must give what git's own diff gives, and it must read nothing
outside the workspace."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from swe_megatron.sandbox.host_diff import host_diff

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "safe.directory=*"]


def _git(cwd, *args, **kw):
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, **kw)


@pytest.fixture
def pristine(tmp_path):
    repo = tmp_path / "pristine"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    (repo / "pkg" / "gone.py").write_text("x = 1\n")
    (repo / "pkg" / "crlf.txt").write_bytes(b"a\r\nb\rc\x0cd\n")
    (repo / "empty.txt").write_text("")
    (repo / "data.bin").write_bytes(b"\0\1\2")
    (repo / ".gitignore").write_text(".pytest_cache/\nbuild/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    return repo


def _copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _edit_like_an_agent(ws, outside):
    (ws / "pkg" / "mod.py").write_text("def f():\n    return 10\n\n\ndef g():\n    return 2")  # no final \n
    (ws / "pkg" / "gone.py").unlink()
    (ws / "pkg" / "crlf.txt").write_bytes(b"a\r\nb\rc\x0cd\ne\n")
    (ws / "empty.txt").unlink()
    (ws / "new.py").write_text("print('new')\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(ws / "run.sh", 0o755)
    (ws / "blank.txt").write_text("")
    (ws / "deep" / "er").mkdir(parents=True)
    (ws / "deep" / "er" / "x.py").write_text("y = 2\n")
    (ws / ".pytest_cache").mkdir()
    (ws / ".pytest_cache" / "v").write_text("cache\n")  # ignored by the pristine .gitignore
    (ws / "pkg" / "__pycache__").mkdir()
    (ws / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0pyc")
    (ws / "data.bin").write_bytes(b"\0\1\2\3")  # binary: git's text diff carries no content either
    (ws / "leak.py").symlink_to(outside)  # never followed
    (ws / "leakdir").symlink_to(outside.parent, target_is_directory=True)


def _tree(root):
    out = {}
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in (".git", "__pycache__", ".pytest_cache")]
        for n in names:
            p = os.path.join(top, n)
            if not os.path.islink(p) and n != "data.bin":
                with open(p, "rb") as f:
                    out[os.path.relpath(p, root)] = (f.read(), os.stat(p).st_mode & 0o111 != 0)
    return out


def test_the_host_diff_applies_to_the_pristine_repository_like_gits_own(pristine, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("host secret\n")
    ws = _copy(pristine, tmp_path / "ws")
    _edit_like_an_agent(ws, outside)

    patch = host_diff(pristine, ws, 1 << 20)
    assert "host secret" not in patch and "leak" not in patch and "cache" not in patch
    assert "pyc" not in patch and "data.bin" not in patch

    ours = _copy(pristine, tmp_path / "ours")
    _git(ours, "apply", "--whitespace=nowarn", "-", input=patch.encode())
    # git's own diff of the same workspace (what the sandbox takes when it can), applied the same way
    _git(ws, "add", "-A", "--", ".", ":(exclude,glob)**/__pycache__/**", ":(exclude)leak.py", ":(exclude)leakdir",
         ":(exclude)data.bin")  # fmt: skip
    theirs_patch = _git(ws, "diff", "--cached", "--no-color", "HEAD").stdout
    theirs = _copy(pristine, tmp_path / "theirs")
    _git(theirs, "apply", "--whitespace=nowarn", "-", input=theirs_patch)
    assert _tree(ours) == _tree(theirs)
    assert _tree(ours)["run.sh"][1] and _tree(ours)["pkg/mod.py"][0].endswith(b"return 2")
    assert "empty.txt" not in _tree(ours) and "blank.txt" in _tree(ours) and "pkg/gone.py" not in _tree(ours)


def test_an_unchanged_workspace_gives_the_empty_patch(pristine, tmp_path):
    assert host_diff(pristine, _copy(pristine, tmp_path / "ws"), 1 << 20) == ""


def test_a_diff_over_the_cap_is_the_empty_patch_and_big_unchanged_files_are_fine(pristine, tmp_path):
    (pristine / "big.txt").write_text("line\n" * 50_000)  # 250 kB, over the cap but unchanged
    ws = _copy(pristine, tmp_path / "ws")
    (ws / "pkg" / "mod.py").write_text("changed\n")
    assert "+changed" in host_diff(pristine, ws, 100_000)
    (ws / "huge.py").write_text("x = 1\n" * 30_000)  # a new 180 kB file: the diff passes the cap
    assert host_diff(pristine, ws, 100_000) == ""
    (ws / "huge.py").unlink()
    (ws / "big.txt").write_text("line\n" * 50_001)  # a changed file over the cap
    assert host_diff(pristine, ws, 100_000) == ""


def test_a_sandbox_whose_shell_will_not_restart_still_gives_its_patch(cfg, repo, monkeypatch):
    """Issue 24 item 5: the agent edits files, locks its repository and kills everything; a restart that
    fails after that (stood in for by a shell whose every command raises, since whether `kill -9 -1`
    reaches the supervisor is a race) makes exec raise SandboxError. The patch is then read from the
    host side of the real workspace, mode 000 and all, running nothing there."""
    from swe_megatron.sandbox import SandboxError, SandboxSpec, make_sandbox
    from swe_megatron.sandbox.shell import PersistentShell

    sb = make_sandbox(SandboxSpec(repo_dir=str(repo)), cfg)
    sb.start()
    try:
        sb.exec(
            "sed -i 's/a - b/a + b/' pkg/__init__.py && echo 'x = 1' > pkg/extra.py && chmod 000 /testbed"
        )

        def restart_fails(self, command, timeout_s):
            raise SandboxError("the sandbox could not be restarted")

        monkeypatch.setattr(PersistentShell, "run", restart_fails)
        with pytest.raises(SandboxError):
            sb.exec("kill -9 -1")
        patch = sb.host_patch(1 << 20)
        assert "-    return a - b\n+    return a + b\n" in patch and "+x = 1" in patch
    finally:
        sb.stop()
    with pytest.raises(SandboxError, match="not running"):
        sb.host_patch(1 << 20)

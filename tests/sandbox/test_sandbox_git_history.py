"""An episode's repository holds nothing after the task's base commit (SWE-bench issue 465: agents read the fix
from `git log --all`, future commits, remote refs, tags, reflog, stash and packed or unreachable objects)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from swe_megatron.config.schema import SandboxBackend
from swe_megatron.sandbox import SandboxSpec, make_sandbox

pytestmark = pytest.mark.sandbox

FAKE_APPTAINER = Path(__file__).resolve().parents[1] / "fake_apptainer"
FIX = "FUTURE_FIX_7f3a"  # in every object written after the base commit


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@x", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@x")  # fmt: skip
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout


@pytest.fixture
def history_repo(repo: Path) -> tuple[Path, str]:
    """The task repository at its base commit, with what real SWE-bench images carry past it: the fix as a
    later commit on the branch (reset away, in the reflog), another branch, a tag, a remote-tracking ref, a
    stash, a note, an unreachable blob, all packed; a tag on the base commit's history (kept)."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "old")
    git(repo, "tag", "v1.0")
    (repo / "CHANGES").write_text("base\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "pkg" / "__init__.py").write_text(f"def add(a, b):\n    return a + b  # {FIX}\n")
    git(repo, "commit", "-qam", f"fix add ({FIX})")
    git(repo, "tag", "-a", "v2.0", "-m", f"release {FIX}")
    git(repo, "branch", "feature")
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    git(repo, "notes", "add", "-m", f"note {FIX}", "HEAD")
    git(repo, "remote", "add", "origin", "https://example.invalid/repo.git")
    git(repo, "reset", "-q", "--hard", base)
    (repo / "README.md").write_text(f"stashed {FIX}\n")
    git(repo, "stash", "-q")
    subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=f"loose {FIX}\n",
                   check=True, capture_output=True, text=True)  # fmt: skip
    git(repo, "gc", "-q")  # the history in packs, as in real images
    subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=f"unreachable {FIX}\n",
                   check=True, capture_output=True, text=True)  # fmt: skip
    assert FIX in git(repo, "log", "--all", "-p")  # the source repository keeps everything
    return repo, base


@pytest.fixture(params=["bwrap", "apptainer"])
def backend_cfg(request, cfg, venv, monkeypatch):
    """The sandbox config and extra spec fields of each backend (apptainer: the stand-in CLI)."""
    if request.param == "bwrap":
        return cfg, {"env_dir": str(venv)}
    monkeypatch.setenv("PATH", f"{FAKE_APPTAINER}:{os.environ['PATH']}")
    sif = venv.parent / "git-history.sif"
    sif.write_text(json.dumps({"fake_sif": 1, "env_dir": str(venv)}))
    sif.chmod(0o644)
    return replace(cfg, backend=SandboxBackend.apptainer), {"image": str(sif)}


def test_the_workspace_holds_nothing_after_the_base_commit(history_repo, backend_cfg):
    repo, base = history_repo
    cfg, fields = backend_cfg
    sb = make_sandbox(SandboxSpec(repo_dir=str(repo), **fields), cfg)
    sb.start()
    try:

        def run(cmd: str) -> str:
            res = sb.exec(cmd)
            assert res.exit_code == 0, (cmd, res.output)
            return res.output.decode()

        assert run("git rev-parse HEAD").strip() == base
        assert run("git log --format=%s").split() == ["base", "old"]  # the task's own history stays
        assert run("git describe --tags").strip().startswith("v1.0")  # tags on it too (setuptools_scm)
        assert run("git status --porcelain") == ""  # the buggy state is untouched
        refs = run("git for-each-ref --format='%(refname)'").split()
        assert sorted(refs) == [run("git symbolic-ref HEAD").strip(), "refs/tags/v1.0"], refs
        assert run("git remote") == "" and run("git stash list") == "" and run("git notes list") == ""
        assert run("git reflog --all") == ""
        assert run("git log --all --format=%s").split() == ["base", "old"]
        assert (
            int(run("git cat-file --batch-all-objects --batch-check | wc -l")) > 5
        )  # packed, loose, unreachable
        assert run(f"git cat-file --batch-all-objects --batch | grep -ac {FIX} || true").strip() == "0"
        assert run(f"grep -rla {FIX} .git || true") == ""
        assert run("git fsck --unreachable --no-reflogs 2>&1 | grep -c unreachable || true").strip() == "0"
    finally:
        sb.stop()
    assert FIX in git(repo, "log", "--all", "-p")  # the task's repository itself is never changed

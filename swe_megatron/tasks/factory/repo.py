"""A task's repository: a git repo whose only commit is the buggy state, without the revealing test files.

The gold `patch` (buggy -> original source) and the `test_patch` (re-adding the hidden test files) are
made by git from that commit, so SWE-bench's `git apply` takes them as they are. Authors, dates and
configuration are fixed, so the same inputs give the same commit sha on any machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

COMMIT_DATE = "2024-01-01T00:00:00+00:00"
IDENTITY = ("swe-megatron task factory", "tasks@swe-megatron.invalid")
SKIP_NAMES = frozenset({"__pycache__", ".git", ".pytest_cache", ".tox", ".eggs"})


@dataclass
class TaskRepo:
    """What writing a task repository produced."""

    base_commit: str
    patch: str
    test_patch: str


def git_env(home: Path | None = None) -> dict[str, str]:
    """An environment that makes git ignore user/system configuration and dates."""
    name, email = IDENTITY
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home or "/nonexistent"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_AUTHOR_DATE": COMMIT_DATE,
        "GIT_COMMITTER_DATE": COMMIT_DATE,
        "LC_ALL": "C",
    }
    return env


def git(repo: Path, *args: str) -> str:
    """Run git in repo; its stdout, or RuntimeError with stderr."""
    proc = subprocess.run(
        ["git", "-c", "core.autocrlf=false", "-c", "core.quotepath=off", "-c", "commit.gpgsign=false", *args],
        cwd=repo,
        env=git_env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo}: {proc.stderr.strip()}")
    return proc.stdout


def copy_tree(src: Path, dest: Path) -> None:
    """Copy an unpacked sdist, leaving out caches and *.egg-info (its SOURCES.txt lists the hidden tests)."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n in SKIP_NAMES or n.endswith(".egg-info")}

    shutil.copytree(src, dest, ignore=ignore, symlinks=True)


def write_task_repo(
    pristine: Path, dest: Path, buggy: dict[str, str], hidden_tests: list[str], message: str
) -> TaskRepo:
    """Create dest as a git repo of `pristine` with `buggy` ({relative path: buggy source}) applied and
    `hidden_tests` removed, committed once; returns its sha, the gold patch and the test patch."""
    copy_tree(pristine, dest)
    for rel, text in buggy.items():
        (dest / rel).write_text(text, encoding="utf-8")
    for rel in hidden_tests:
        (dest / rel).unlink()
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A", "-f")
    git(dest, "commit", "-q", "--no-verify", "-m", message)
    base = git(dest, "rev-parse", "HEAD").strip()

    for rel in buggy:
        shutil.copyfile(pristine / rel, dest / rel)
    patch = git(dest, "diff", "--no-color", "--no-ext-diff", "HEAD", "--", *sorted(buggy))
    git(dest, "checkout", "-q", "HEAD", "--", *sorted(buggy))

    for rel in hidden_tests:
        shutil.copyfile(pristine / rel, dest / rel)
    git(dest, "add", "-N", "-f", "--", *hidden_tests)
    test_patch = git(dest, "diff", "--no-color", "--no-ext-diff", "--", *sorted(hidden_tests))
    git(dest, "reset", "-q", "--", *hidden_tests)
    for rel in hidden_tests:
        (dest / rel).unlink()
    status = git(dest, "status", "--porcelain", "--untracked-files=all")
    if status.strip():
        raise RuntimeError(f"{dest}: working tree not clean after writing the task: {status[:500]}")
    return TaskRepo(base_commit=base, patch=patch, test_patch=test_patch)

"""A small real task built on the spot: a git repository with a bug, hidden tests, and a Python env.

Stands in for the task factory's output (same Task.extra layout: repo_dir, env_dir, test_cmd,
test_files) so the grader can be tested against real pytest runs in a real sandbox.

- repo: package `calc` whose `clamp` returns the wrong bound above the range; visible tests in
  tests/test_basic.py (PASS_TO_PASS); tests/test_clamp.py is not in the repository and comes back
  with the test patch (FAIL_TO_PASS test_clamp_high, PASS_TO_PASS test_clamp_low).
- env: a venv of /usr/bin/python3 (the sandbox sees /usr only) with pytest copied in from the
  project's venv; built once per pytest version under the system temp folder and reused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from swe_megatron.tasks.schema import Task

OPS = '''\
"""Small arithmetic helpers."""


def add(a, b):
    """a + b."""
    return a + b


def mean(values):
    """Arithmetic mean of a non-empty sequence."""
    return sum(values) / len(values)


def clamp(x, lo, hi):
    """x limited to [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return lo
    return x
'''

INIT = "from calc.ops import add, clamp, mean\n"

TEST_BASIC = """\
from calc import add, mean


def test_add():
    assert add(2, 3) == 5


def test_mean():
    assert mean([1, 2, 3]) == 2
"""

TEST_CLAMP = """\
from calc import clamp


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(15, 0, 10) == 10
"""

PYTEST_INI = "[pytest]\ntestpaths = tests\n"

OPS_FIXED = OPS.replace("    if x > hi:\n        return lo", "    if x > hi:\n        return hi")

F2P = ["tests/test_clamp.py::test_clamp_high"]
P2P = [
    "tests/test_basic.py::test_add",
    "tests/test_basic.py::test_mean",
    "tests/test_clamp.py::test_clamp_low",
]


def diff(*files: tuple[str, str | None, str | None]) -> str:
    """A git-style unified diff from (path, old text or None, new text or None) triples."""
    import difflib

    out = []
    for path, old, new in files:
        a = (old or "").splitlines(keepends=True)
        b = (new or "").splitlines(keepends=True)
        out.append(f"diff --git a/{path} b/{path}\n")
        if old is None:
            out.append("new file mode 100644\n")
        if new is None:
            out.append("deleted file mode 100644\n")
        body = list(
            difflib.unified_diff(
                a, b, "/dev/null" if old is None else f"a/{path}", "/dev/null" if new is None else f"b/{path}"
            )
        )
        out.extend(
            line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in body
        )
    return "".join(out)


GOLD_PATCH = diff(("calc/ops.py", OPS, OPS_FIXED))
TEST_PATCH = diff(("tests/test_clamp.py", None, TEST_CLAMP))

PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py.py", "pygments")


def build_env(root: Path | None = None) -> Path:
    """A venv of /usr/bin/python3 with pytest, readable by the sandbox user; cached by pytest version."""
    import pytest

    root = Path(root or tempfile.gettempdir())
    env = (
        root
        / f"swe_megatron_grading_env_py{sys.version_info[0]}{sys.version_info[1]}_pytest{pytest.__version__}"
    )
    if (env / ".complete").exists():
        return env
    build = Path(tempfile.mkdtemp(prefix=env.name + ".build-", dir=root))
    os.chmod(build, 0o755)
    subprocess.run(
        [
            f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
            "-m",
            "venv",
            "--without-pip",
            str(build),
        ],
        check=True,
    )
    site = next((build / "lib").glob("python3*/site-packages"))
    source = Path(pytest.__file__).parent.parent
    for entry in source.iterdir():
        name = entry.name
        base = name.split("-", 1)[0].lower().replace("_", "") if name.endswith(".dist-info") else None
        wanted = name in PYTEST_PACKAGES or (
            base is not None and any(base == p.replace("_", "").replace(".py", "") for p in PYTEST_PACKAGES)
        )
        if wanted:
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, site / name)
    for dirpath, dirnames, filenames in os.walk(build):
        for n in dirnames:
            os.chmod(os.path.join(dirpath, n), 0o755)
        for n in filenames:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o444)
    (build / ".complete").write_text("ok\n")
    try:
        os.rename(build, env)
    except OSError:  # another process finished first
        shutil.rmtree(build, ignore_errors=True)
    return env


def git(repo: Path, *args: str) -> str:
    """Run git in repo with a fixed identity; returns stdout."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout


def build_task(folder: Path, env_dir: Path, instance_id: str = "calc__calc-0001") -> Task:
    """Write the buggy repository under folder/repo and return its Task (absolute paths, as tasks.load gives)."""
    repo = folder / "repo"
    files = {
        "calc/__init__.py": INIT,
        "calc/ops.py": OPS,
        "tests/test_basic.py": TEST_BASIC,
        "pytest.ini": PYTEST_INI,
    }
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "buggy state")
    base_commit = git(repo, "rev-parse", "HEAD").strip()
    return Task(
        instance_id=instance_id,
        repo="calc/calc",
        base_commit=base_commit,
        patch=GOLD_PATCH,
        test_patch=TEST_PATCH,
        problem_statement="clamp(15, 0, 10) returns 0 instead of 10.",
        FAIL_TO_PASS=list(F2P),
        PASS_TO_PASS=list(P2P),
        extra={
            "repo_dir": str(repo.resolve()),
            "env_dir": str(Path(env_dir).resolve()),
            "test_cmd": "python -m pytest -p no:cacheprovider tests",
            "test_files": ["tests/test_clamp.py"],
        },
    )


UNBUILT_REPO = "/nonexistent/calc/repo"  # absolute, as tasks.load makes it; never on disk


def unbuilt_task(**extra) -> Task:
    """The tiny task's row without a repository on disk (for tests that never start a sandbox)."""
    return Task(
        instance_id="calc__calc-0001",
        repo="calc/calc",
        base_commit="0" * 40,
        patch=GOLD_PATCH,
        test_patch=TEST_PATCH,
        problem_statement="",
        FAIL_TO_PASS=list(F2P),
        PASS_TO_PASS=list(P2P),
        extra={"repo_dir": UNBUILT_REPO, "test_cmd": "python -m pytest tests", **extra},
    )

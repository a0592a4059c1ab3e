"""A django task built offline for grading with a runner other than pytest (issue 39 item 3).

    task = django_task()     # cached under the system temp folder; needs PyPI (pip download) the first time

The repository is Django 4.2.16's PyPI sdist (its tests/ with tests/runtests.py; docs/ left out to keep the image
small) as a git repository with one planted bug in django/utils/text.py (phone2numeric maps "w" to 8); the gold
patch is the fix and the test patch adds back tests/utils_tests/test_text.py. The environment is a venv of Debian's
Python with Django's requirements (asgiref, sqlparse), the repository on its path in the image. The tests run as
SWE-bench runs django's (`./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 MODULE`, the test
command of swebench 4.x's MAP_REPO_VERSION_TO_SPECS for django/django) and are read by the parser swebench 5.0.2 maps
for django/django (MAP_REPO_TO_PARSER_PY: parse_log_django). FAIL_TO_PASS and PASS_TO_PASS are what that parser
reads from a run before and after the gold patch, as the factory computes its tasks' (trusted build-time runs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from swe_megatron.tasks.factory.env import build_env
from swe_megatron.tasks.factory.pypi import PackageSpec, fetch_sdist
from swe_megatron.tasks.factory.repo import git, write_task_repo
from swe_megatron.tasks.load import load_tasks, write_tasks
from swe_megatron.tasks.plan import make_eval_script
from swe_megatron.tasks.schema import Task

DJANGO = PackageSpec("Django", "4.2.16")
REQUIREMENTS = ["asgiref>=3.6.0,<4", "sqlparse>=0.3.1"]
"""Django 4.2's install_requires."""
MODULE = "utils_tests.test_text"
TEST_FILE = "tests/utils_tests/test_text.py"
TEST_CMD = f"./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {MODULE}"
LOG_PARSER = "parse_log_django"
BUG = ('"w": "9",', '"w": "8",')
INSTANCE_ID = "django__django-90001"


def _run_tests(repo: Path, env_dir: Path) -> dict[str, str]:
    """{test: status} of one run of TEST_CMD in repo with the env's python, as parse_log_django reads it."""
    from swe_megatron.grading.swebench_light import import_swebench_grading

    env = {"PATH": f"{env_dir}/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/nonexistent",
           "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    proc = subprocess.run(
        TEST_CMD, shell=True, cwd=repo, env=env, capture_output=True, text=True, timeout=600
    )
    parse = import_swebench_grading()[1].PARSER_REGISTRY[LOG_PARSER]
    return parse(proc.stdout + proc.stderr, None)


def _pack(repo: Path, timeout_s: float = 300.0) -> None:
    """Pack the repository's objects now: the commit of ~6,000 files leaves git's automatic gc running in the
    background, and copying the repository while it moves loose objects into a pack fails (seen here)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            git(repo, "gc", "-q")
            return
        except RuntimeError as e:  # "gc is already running": the automatic one; wait for it
            if "already running" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(1)


def django_task(root: Path | None = None) -> Task:
    """The django task (built once under root, default the system temp folder; see the module docstring)."""
    root = Path(root or Path(tempfile.gettempdir()) / "swe_megatron_django_task")
    done = root / "task.jsonl"
    if done.exists():
        return load_tasks(done)[0]
    shutil.rmtree(root / "work", ignore_errors=True)
    work = root / "work"
    archive, _ = fetch_sdist(DJANGO, root / "sdists")
    with tarfile.open(archive) as tar:
        tar.extractall(work / "src", filter="data")
    (pristine,) = (work / "src").iterdir()
    for extra in ("docs", "js_tests"):
        shutil.rmtree(pristine / extra, ignore_errors=True)
    text = (pristine / "django/utils/text.py").read_text()
    assert text.count(BUG[0]) == 1, "the planted bug's line is not in django/utils/text.py"
    repo_dir, env_dir = work / "repo", root / "envs" / "django"
    made = write_task_repo(pristine, repo_dir, {"django/utils/text.py": text.replace(*BUG)}, [TEST_FILE],
                           "Django 4.2.16 (sdist) with a planted bug")  # fmt: skip
    _pack(repo_dir)
    build_env(env_dir, REQUIREMENTS)
    tests_dir = repo_dir / TEST_FILE
    shutil.copyfile(pristine / TEST_FILE, tests_dir)
    before = _run_tests(repo_dir, env_dir)
    (repo_dir / "django/utils/text.py").write_text(text)
    after = _run_tests(repo_dir, env_dir)
    git(repo_dir, "checkout", "-q", "HEAD", "--", "django/utils/text.py")
    tests_dir.unlink()
    f2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED")
    p2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED")
    assert f2p and p2p, (before, after)
    task = Task(instance_id=INSTANCE_ID, repo="django/django", base_commit=made.base_commit, patch=made.patch,
                test_patch=made.test_patch, problem_statement="phone2numeric() maps 'w' to 8; it should be 9.",
                FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, version="4.2", created_at="2026-01-01T00:00:00",
                extra={"repo_dir": str(repo_dir), "env_dir": str(env_dir), "log_parser": LOG_PARSER,
                       "eval_script": make_eval_script(made.base_commit, TEST_CMD, [TEST_FILE], made.test_patch)})  # fmt: skip
    write_tasks([task], done)
    os.chmod(root, 0o755)
    return load_tasks(done)[0]

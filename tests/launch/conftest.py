"""Fixtures of the Slurm job tests: a short run folder and the pipeline tests' tiny task files."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def short_dir(request):
    """A run folder with a short path (vLLM's IPC socket paths under the run dir must stay < 108 bytes);
    kept after a failure for its logs."""
    d = Path(tempfile.mkdtemp(prefix="swe-l-", dir="/tmp"))
    failed_before = request.session.testsfailed
    yield d
    if request.session.testsfailed == failed_before:
        shutil.rmtree(d, ignore_errors=True)
    else:
        print(f"kept {d} for its logs")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> list[str]:
    sys.path.insert(0, str(REPO / "tests" / "pipeline"))
    import tiny_tasks

    train, test = tiny_tasks.make_task_files(tmp_path_factory.mktemp("tasks"), n_train=2, n_test=1)
    return [f"tasks.train_file={train}", f"tasks.test_file={test}"]

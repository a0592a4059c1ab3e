"""Every task of a factory build grades as it should: its gold patch resolves, no patch does not.

Which tasks: the JSONL named by SWE_MEGATRON_GRADE_TASKS; else the first few tasks of each
data/tasks/*.jsonl built by `swe-megatron make-tasks`; else a 3-task toolz build made here with
make-tasks and kept under the system temp folder (~80 s once, needs PyPI; instant afterwards).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from swe_megatron.cli import main
from swe_megatron.grading.command import load_tasks_for_grading
from swe_megatron.grading.grader import RESOLVED, UNRESOLVED, grade_many

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
PER_FILE = 4  # from a full default build (60+ tasks) only a sample, to keep this folder under two minutes


SMALL_BUILD = ["--package", "toolz==1.1.0", "--max-tasks", "3", "--seed", "0"]


@pytest.fixture(scope="session")
def factory_task_files() -> list[tuple[Path, int | None]]:
    explicit = os.environ.get("SWE_MEGATRON_GRADE_TASKS")
    if explicit:
        return [(Path(explicit), None)]
    built = sorted((REPO / "data" / "tasks").glob("*.jsonl"))
    if built:
        return [(p, PER_FILE) for p in built]
    out = Path(tempfile.gettempdir()) / "swe_megatron_grading_factory_toolz3"
    if main(["make-tasks", "--out", str(out), *SMALL_BUILD]) != 0:
        pytest.skip(f"make-tasks {' '.join(SMALL_BUILD)} built no tasks (offline?); see {out}/report.json")
    return [(p, None) for p in sorted(out.glob("*.jsonl")) if p.stat().st_size]


def test_factory_tasks_gold_resolves_and_empty_does_not(sandbox_factory, factory_task_files, tmp_path):
    assert factory_task_files, "make-tasks wrote no non-empty tasks file"
    failures = []
    for path, limit in factory_task_files:
        tasks = load_tasks_for_grading(str(path))[:limit]
        base = path.resolve().parent
        jobs = [(t, t.patch, tmp_path / path.stem / t.instance_id / "gold") for t in tasks]
        for task, result in zip(tasks, grade_many(jobs, sandbox_factory, workers=2, base_dir=base)):
            if result.status != RESOLVED or result.dropped:
                failures.append(
                    f"{task.instance_id} gold: {result.status} {result.reason} dropped={result.dropped}"
                )
        jobs = [(t, "", tmp_path / path.stem / t.instance_id / "empty") for t in tasks]
        results = grade_many(jobs, sandbox_factory, workers=2, base_dir=base, skip_empty=False)
        for task, result in zip(tasks, results):
            if result.status != UNRESOLVED:
                failures.append(f"{task.instance_id} without a patch: {result.status} {result.reason}")
    assert not failures, "\n".join(failures)

"""Every task of a factory build grades as it should: its gold patch resolves, no patch does not.

Which tasks: the JSONL named by SWE_MEGATRON_GRADE_TASKS; else the first few tasks of each
data/tasks/*.jsonl built by `swe-megatron make-tasks`; else a 3-task toolz build made here with
make-tasks and kept under the system temp folder (~80 s once, needs PyPI; instant afterwards).
"""

from __future__ import annotations

import pytest

from swe_megatron.grading.grader import RESOLVED, UNRESOLVED, grade_many
from swe_megatron.tasks.load import load_tasks_for_command

pytestmark = pytest.mark.sandbox


def test_factory_tasks_gold_resolves_and_empty_does_not(sandbox_factory, factory_task_files, tmp_path):
    assert factory_task_files, "make-tasks wrote no non-empty tasks file"
    failures = []
    for path, limit in factory_task_files:
        tasks = load_tasks_for_command(str(path))[:limit]
        jobs = [(t, t.patch, tmp_path / path.stem / t.instance_id / "gold") for t in tasks]
        for task, result in zip(tasks, grade_many(jobs, sandbox_factory, workers=2)):
            if result.status != RESOLVED or result.dropped:
                failures.append(
                    f"{task.instance_id} gold: {result.status} {result.reason} dropped={result.dropped}"
                )
        jobs = [(t, "", tmp_path / path.stem / t.instance_id / "empty") for t in tasks]
        results = grade_many(jobs, sandbox_factory, workers=2, skip_empty=False)
        for task, result in zip(tasks, results):
            if result.status != UNRESOLVED:
                failures.append(f"{task.instance_id} without a patch: {result.status} {result.reason}")
    assert not failures, "\n".join(failures)

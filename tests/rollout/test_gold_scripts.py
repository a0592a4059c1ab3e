"""`rollout --policy gold` can resolve every factory task on every run preset (tests/gold_fit.py), on the tasks
README's main command builds: data/tasks/{train,test}.jsonl, skipped when they are not built (a fresh clone, CI).
CI checks the same on the tasks `make-tasks` builds in tests/tasks/test_make_tasks_e2e.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gold_fit import gold_problems

from swe_megatron.tasks.load import load_tasks_for_command

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))
TASK_FILES = [p for p in (REPO / "data" / "tasks" / n for n in ("train.jsonl", "test.jsonl")) if p.is_file()]


@pytest.mark.parametrize("preset", PRESETS)
def test_gold_scripts_fit_every_stage_of_every_preset(preset, capsys):
    if not TASK_FILES:
        pytest.skip(
            "no data/tasks/*.jsonl (`swe-megatron run embedded` builds them); "
            "tests/tasks/test_make_tasks_e2e.py checks freshly built tasks"
        )
    problems = gold_problems(preset, [t for f in TASK_FILES for t in load_tasks_for_command(str(f))])
    assert not problems, "\n".join(f"{k}: {v}" for k, v in problems.items())
    assert capsys.readouterr().err == ""  # the rollout names no task it cannot resolve

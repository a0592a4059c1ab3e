"""`rollout --policy gold` can resolve every factory task on every run preset: each task's scripted solution
fits the preset's per-turn token cap and every stage's t_max (issue 27: the embedded preset's 96-token cap cut
6 of 32 scripted edits, silently). Fast: the tokenizer and the task files only, no sandbox.

Which tasks: data/tasks/{train,test}.jsonl as `swe-megatron make-tasks` builds them (skipped when not built).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.config.load import load_config
from swe_megatron.config.schema import STAGE_NAMES
from swe_megatron.model.tokenizer import load_tokenizer
from swe_megatron.rollout.command import gold_policy
from swe_megatron.tasks.load import load_tasks_for_command

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))
TASK_FILES = [p for p in (REPO / "data" / "tasks" / n for n in ("train.jsonl", "test.jsonl")) if p.is_file()]


@pytest.mark.parametrize("preset", PRESETS)
def test_gold_scripts_fit_every_stage_of_every_preset(preset, capsys):
    if not TASK_FILES:
        pytest.skip(
            "no data/tasks/*.jsonl: build them with `swe-megatron make-tasks` (tools/install_cpu.sh does)"
        )
    cfg = load_config(preset)
    try:
        chat = ChatFormat(load_tokenizer(cfg.model.tokenizer))
    except Exception as e:  # a hub tokenizer not in the local cache, a model folder not downloaded
        pytest.skip(f"{preset}: tokenizer {cfg.model.tokenizer} not available here ({type(e).__name__})")
    tasks = [t for f in TASK_FILES for t in load_tasks_for_command(str(f))]
    problems = {}
    for stage in STAGE_NAMES:
        t_max = getattr(cfg, stage).t_max
        policy = gold_policy(chat, tasks, cfg.sampling.max_tokens_per_turn, t_max)
        problems |= {
            f"{stage}: {k}": v for k, v in policy.problems(cfg.sampling.max_tokens_per_turn, t_max).items()
        }
    assert not problems, "\n".join(f"{k}: {v}" for k, v in problems.items())
    assert capsys.readouterr().err == ""  # the rollout names no task it cannot resolve

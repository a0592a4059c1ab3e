"""Whether `rollout --policy gold` can resolve every task on a preset: each task's scripted solution fits the
preset's per-turn token cap and every stage's t_max (issue 27: the embedded preset's 96-token cap cut 6 of 32
scripted edits, silently). The tokenizer and the task files only, no sandbox."""

from __future__ import annotations

import pytest

from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.config.load import load_config
from swe_megatron.config.schema import STAGE_NAMES
from swe_megatron.model.tokenizer import load_tokenizer
from swe_megatron.rollout.command import gold_policy


def gold_problems(preset: str, tasks: list) -> dict[str, str]:
    """Stage and task -> why the scripted solution does not fit (empty: every task fits every stage)."""
    cfg = load_config(preset)
    try:
        chat = ChatFormat(load_tokenizer(cfg.model.tokenizer))
    except Exception as e:  # a hub tokenizer not in the local cache, a model folder not downloaded
        pytest.skip(f"{preset}: tokenizer {cfg.model.tokenizer} not available here ({type(e).__name__})")
    problems = {}
    for stage in STAGE_NAMES:
        t_max = getattr(cfg, stage).t_max
        policy = gold_policy(chat, tasks, cfg.sampling.max_tokens_per_turn, t_max)
        problems |= {
            f"{stage}: {k}": v for k, v in policy.problems(cfg.sampling.max_tokens_per_turn, t_max).items()
        }
    return problems

"""rollout/plan.py's estimate against numbers worked out by hand from the module docstring's model and the
models' published shapes (the CLI's output is in tests/config/test_capacity.py)."""

from __future__ import annotations

import math
import warnings

import pytest

from swe_megatron.config.load import CapacityWarning, load_config
from swe_megatron.rollout.plan import (
    RolloutAssumptions,
    describe_assumptions,
    format_phases,
    kv_tokens_per_server,
    rollout_phase,
)

GIB = 2**30
A = RolloutAssumptions()


def _cfg(preset: str = "paper-72b", *overrides: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityWarning)
        return load_config(preset, list(overrides))


def test_kv_tokens_per_server_from_the_models_published_shapes():
    """Qwen2.5-72B: 80 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes = 320 KiB a token, 72.7e9 bf16 weights,
    on a 4-GPU server at 0.85 of 140 GiB each; Qwen2.5-7B: 28 x 4 x 128 x 2 x 2 = 56 KiB, 7.6e9 weights, 1 GPU."""
    big = (4 * 140 * GIB * 0.85 - 2 * 72_706_203_648) / (80 * 8 * 128 * 2 * 2)
    small = (1 * 140 * GIB * 0.85 - 2 * 7_615_616_512) / (28 * 4 * 128 * 2 * 2)
    assert kv_tokens_per_server(_cfg("paper-72b"), A) == pytest.approx(big, rel=1e-9)  # 1.12e6
    assert kv_tokens_per_server(_cfg("paper-7b"), A) == pytest.approx(small, rel=1e-9)  # 1.96e6
    assert (
        kv_tokens_per_server(_cfg("paper-72b"), RolloutAssumptions(gpu_gib=30.0)) == 0.0
    )  # weights do not fit


def test_a_phase_worked_out_by_hand():
    """32 episodes of 24 turns on 16 servers, 1024 in flight: every episode in one wave, 2 per server."""
    cfg = _cfg("paper-72b", "stage1.tasks_per_iteration=8", "stage1.samples_per_task=4")
    p = rollout_phase(cfg, "stage1", A)
    assert (p.stage, p.episodes, p.turns, p.servers, p.concurrency) == ("stage1", 32, 24.0, 16, 1024)
    assert p.mean_context == 2500 + 1000 * 23 / 2  # contexts 2500, 3500, ... after 0..23 turns
    assert p.generated == 32 * 24 * 300
    assert p.prefilled == 32 * (2500 + 23 * 700)  # the first prompt, then each observation once
    assert p.prefilled_uncached == 32 * 24 * 14000
    assert p.engine_s == pytest.approx((32 * 24 * 300 / 2500 + 32 * 18600 / 20000) / 16)
    # 2 episodes per server share its decode speed: 300 tokens at 1250 tok/s + 3 s of tool, 24 turns: 78 s
    assert p.latency_s == pytest.approx(24 * (300 / 1250 + 3.0))
    assert p.wall_s == max(p.engine_s, p.latency_s) == p.latency_s
    assert p.episodes_fitting == pytest.approx(p.kv_tokens / 14000)
    uncached = rollout_phase(cfg, "stage1", RolloutAssumptions(prefix_cache=False))
    assert uncached.prefilled == 32 * 24 * 14000


def test_latency_waves_and_the_per_server_floor():
    """3000 episodes at 1024 at a time are 3 waves of 64 per server; 8 episodes on 16 servers run alone."""
    p = rollout_phase(_cfg(), "stage1", A)
    assert p.latency_s == pytest.approx(3 * 24 * (300 / (2500 / 64) + 3.0))
    few = rollout_phase(
        _cfg("paper-72b", "stage1.tasks_per_iteration=2", "stage1.samples_per_task=4"), "stage1", A
    )
    assert few.latency_s == pytest.approx(24 * (300 / 2500 + 3.0))


def test_turns_oversampling_and_the_context_that_bounds_them():
    cfg = _cfg(
        "paper-72b", "stage1.tasks_per_iteration=7", "stage1.samples_per_task=3", "algo.oversample_factor=1.5"
    )
    assert rollout_phase(cfg, "stage1", A).episodes == math.ceil(21 * 1.5)  # RL stages oversample
    assert rollout_phase(cfg, "rft", A).episodes == cfg.rft.tasks_per_iteration * cfg.rft.samples_per_task
    assert (
        rollout_phase(cfg, "stage1", RolloutAssumptions(turns_fraction=0.5)).turns == 20.0
    )  # half of t_max 40
    assert rollout_phase(cfg, "stage1", RolloutAssumptions(turns_fraction=0.001)).turns == 1.0  # at least one
    # 6,500 tokens of context hold the first prompt and 4 turns of 1,000 tokens
    short = RolloutAssumptions(first_prompt_tokens=65536 - 4500)
    assert rollout_phase(cfg, "stage1", short).turns == 4.0
    assert rollout_phase(cfg, "stage1", RolloutAssumptions(first_prompt_tokens=65536)).turns == 1.0


def test_format_phases_prints_the_hand_worked_figures():
    """paper-72b's stage1: 3000 x 24 x 300 = 21.6M generated, 3000 x (2500 + 23 x 700) = 55.8M prefilled
    (3000 x 24 x 14000 = 1.01G without the cache), 714 s engine-bound, 769 s latency-bound, 1.12M KV tokens / 14k."""
    lines = format_phases(_cfg(), A).splitlines()
    assert lines[1] == (
        "  capacity: agent.concurrency 1024 episodes in flight; engines 16 x 64 = 1024 (engine.num_servers x "
        "episodes_per_server); sandbox slots 1024 (sandbox.max_concurrent x cluster.nodes); prewarm 0; weight sync "
        "broadcast"
    )
    assert lines[3] == (
        "  stage1: 3000 episodes x 24 turns (mean context 14k); generated 21.6M tokens, prefilled 55.8M (prefix "
        "cache; without it 1.01G); engine-bound 12 min, latency-bound 13 min -> expected 13 min; one server's KV "
        "cache holds 1.12M tokens = 80 episodes at the mean context"
    )
    assert [line.split(":")[0].strip() for line in lines[2:]] == ["rft", "stage1", "stage2"]
    uncached = format_phases(_cfg(), RolloutAssumptions(prefix_cache=False)).splitlines()[3]
    assert "prefilled 1008.0M (no prefix cache; without it 1.01G); engine-bound 62 min" in uncached


def test_the_assumptions_say_whether_the_prefix_cache_is_counted():
    assert describe_assumptions(RolloutAssumptions(prefix_cache=True)).endswith(", prefix cache on")
    assert describe_assumptions(RolloutAssumptions(prefix_cache=False)).endswith(", prefix cache off")

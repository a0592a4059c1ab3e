"""Presets that use their cluster (config/capacity.py) and `swe-megatron plan PRESET`'s rollout phase."""

from __future__ import annotations

import warnings

import pytest

from swe_megatron.cli import main
from swe_megatron.config.load import CapacityWarning, ConfigError, load_config
from swe_megatron.rollout.plan import RolloutAssumptions, rollout_phase


def test_paper_presets_keep_their_engines_busy():
    with warnings.catch_warnings():
        warnings.simplefilter("error", CapacityWarning)
        big, small = load_config("paper-72b"), load_config("paper-7b")
    # 16 servers x 64 episodes = 16 nodes x 64 sandbox slots; none left over to start sandboxes ahead
    assert (big.agent.concurrency, big.agent.prewarm_sandboxes) == (1024, 0)
    assert (small.agent.concurrency, small.agent.prewarm_sandboxes) == (512, 0)  # 16 x 32; 4 x 128 slots
    assert big.engine.weight_sync == small.engine.weight_sync == "broadcast"


def test_explicit_values_stay_and_prewarm_takes_the_spare_slots():
    cfg = load_config("embedded", ["sandbox.max_concurrent=20", "agent.prewarm_sandboxes=-1"])
    assert cfg.agent.concurrency == 4  # explicit
    assert cfg.agent.prewarm_sandboxes == 4  # (20 - 4 x 2) // 2 = 6 spare, at most concurrency
    cfg = load_config("embedded", ["agent.concurrency=0", "agent.prewarm_sandboxes=-1"])
    assert (cfg.agent.concurrency, cfg.agent.prewarm_sandboxes) == (4, 0)  # 4 slots, engine capacity unstated


def test_more_episodes_than_sandbox_slots_is_refused_with_one_message():
    with pytest.raises(ConfigError) as info:
        load_config("paper-72b", ["agent.concurrency=1500"])
    msg = str(info.value)
    assert "\n" not in msg and "agent.concurrency=1500" in msg and "64 x 16 = 1024" in msg


def test_a_concurrency_that_idles_most_engines_warns():
    with pytest.warns(CapacityWarning, match=r"agent.concurrency=4 .* 1024 .* 100% of them idle"):
        load_config("paper-72b", ["agent.concurrency=4"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CapacityWarning)
        load_config("paper-72b", ["agent.concurrency=600"])  # most engines busy: quiet
        load_config("embedded")


def test_plan_prints_each_stage_rollout_phase(capsys):
    assert main(["plan", "paper-72b", "--top", "1"]) == 0
    out = capsys.readouterr().out
    for needle in ("stage1: 3000 episodes x 24 turns", "stage2: 1000 episodes x 48 turns", "generated",
                   "prefilled", "expected", "decode_tps=2500.0", "broadcast:", "TP  PP  CP"):  # fmt: skip
        assert needle in out, needle


def test_rollout_phase_scales_with_concurrency_and_prefix_cache():
    cfg = load_config("paper-72b")
    a = RolloutAssumptions()
    wide = rollout_phase(cfg, "stage1", a)
    with pytest.warns(CapacityWarning):
        narrow = rollout_phase(load_config("paper-72b", ["agent.concurrency=4"]), "stage1", a)
    # four at a time: 750 waves of 24 turns of (300 tokens at 2500 tok/s + 3 s) = 15.6 hours
    assert narrow.wall_s == pytest.approx(750 * 24 * (300 / 2500 + 3.0))
    assert wide.wall_s < narrow.wall_s / 50
    assert wide.generated == 3000 * 24 * 300
    uncached = rollout_phase(cfg, "stage1", RolloutAssumptions(prefix_cache=False))
    assert uncached.prefilled == uncached.prefilled_uncached > 10 * wide.prefilled

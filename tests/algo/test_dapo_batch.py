"""build_dapo_batch: exclusions, R_final with the step penalty, group advantages, dynamic sampling."""

import math
from dataclasses import asdict

import pytest
import torch
from omegaconf import OmegaConf

from swe_megatron.algo import DapoOptions, build_dapo_batch
from swe_megatron.config.schema import AlgoConfig, StageConfig, StdKind
from swe_megatron.pipeline.metrics import rollout_metrics
from swe_megatron.trajectory import ExitReason

from .conftest import build_trajectory as traj


def _iteration():
    return [
        # task A: R_final = [1, 0, -1] (40 steps: turn limit, full penalty); one infra failure excluded
        traj("A", 0, turns=5, resolved=True),
        traj("A", 1, turns=5),
        traj("A", 2, turns=40, exit_reason=ExitReason.turn_limit),
        traj("A", 3, turns=3, exit_reason=ExitReason.sandbox_error, infra_failure="sandbox: crashed"),
        # task B: all failed at equal length: no signal
        traj("B", 0, turns=4),
        traj("B", 1, turns=4),
        # task C: both solved, but in 5 and 25 steps: R_final = [1, 0.5]
        traj("C", 0, turns=5, resolved=True),
        traj("C", 1, turns=25, resolved=True),
    ]


def test_batch_by_hand():
    batch = build_dapo_batch(_iteration(), DapoOptions(t_max=40, l_thr=10, adv_eps=0.0))
    kept = [(t.task_id, t.sample_index) for t in batch.trajectories]
    # A1 sits exactly on its group mean (advantage 0) and is dropped as a zero-advantage sample
    assert kept == [("A", 0), ("A", 2), ("C", 0), ("C", 1)]
    a = 1 / math.sqrt(2 / 3)  # A: mean 0, population std sqrt(2/3)
    assert batch.advantages.tolist() == pytest.approx([a, -a, 1.0, -1.0])  # C: mean 0.75, std 0.25
    assert batch.final_rewards == pytest.approx([1.0, -1.0, 1.0, 0.5])
    assert batch.excluded == 1
    ds = batch.dynamic_sampling
    assert (
        ds.trajectories_in,
        ds.dropped_all_equal_groups,
        ds.dropped_all_equal,
        ds.dropped_zero_advantage,
    ) == (7, 1, 2, 1)
    m = batch.as_metrics()
    assert m["advantage"] == pytest.approx({"mean": 0.0, "abs_mean": (2 * a + 2) / 4, "min": -a, "max": a})
    assert m["dynamic_sampling"] == {**{k: float(v) for k, v in asdict(ds).items()}, "dropped_groups": 1.0,
                                     "dropped_trajectories": 3.0, "excluded": 1.0}  # fmt: skip


def test_the_rollout_metrics_hold_the_batch_rewards_once():
    """reward/* are computed from the trajectories once (pipeline/metrics.py), R_final included."""
    m = rollout_metrics(_iteration(), t_max=40, l_thr=10)
    assert m["reward"]["mean"] == pytest.approx(3 / 7)
    assert m["reward"]["final_mean"] == pytest.approx((1 + 0 - 1 + 0 + 0 + 1 + 0.5) / 7)
    assert m["infra"]["sandbox_error"] == 1.0 and m["episode"]["turn_limit_rate"] == pytest.approx(1 / 7)


def test_give_ups_are_submissions_without_a_change():
    """episode/give_up_rate: submitted with an empty patch, over the valid episodes (a turn-limit ending with no
    patch is not a give-up; a submitted change that fails is not one either)."""
    trajs = _iteration()
    for t in trajs:
        t.patch = "diff --git a/x b/x\n" if t.resolved else ""
    trajs[1].patch = "diff --git a/y b/y\n"  # A1: a wrong fix, not a give-up
    m = rollout_metrics(trajs, t_max=40, l_thr=10)
    # valid: A0 A1 A2 B0 B1 C0 C1; give-ups: B0, B1 (A2 ended at the turn limit, A3 is excluded)
    assert m["episode"]["give_up_rate"] == pytest.approx(2 / 7)


def test_the_rollout_metrics_of_long_trajectories_make_no_per_token_python_objects():
    """An iteration of the paper's stage 2 is thousands of trajectories of up to 131k tokens; a Python float per
    action token (32 bytes) made ~1.7 GB at 3,000 episodes at the end of each rollout phase. The token
    counts and the entropy estimate come from the arrays (docs/benchmarks.md, "Scale")."""
    import tracemalloc

    trajs = [traj("A", k, turns=25_000) for k in range(4)]  # 100k tokens each, half of them actions
    for t in trajs[1:]:
        t.logprobs[3] = -2.0  # an action token's logprob: the estimate is their mean, not the last one's
    tracemalloc.start()
    try:
        m = rollout_metrics(trajs, t_max=40, l_thr=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak  # per-token lists: 200k actions x 32 bytes, 6.4 MB
    n = 4 * 50_000
    assert m["tokens"]["generated"] == n and m["tokens"]["trajectory_mean"] == 100_003
    assert m["policy"]["entropy_estimate"] == pytest.approx((4 * 25_000 * 0.75 + 3 * 1.5) / n)


def test_without_dynamic_sampling_everything_valid_is_kept_with_zero_advantages():
    batch = build_dapo_batch(_iteration(), DapoOptions(t_max=40, l_thr=10, drop_zero_advantage=False))
    assert len(batch.trajectories) == 7
    assert batch.advantages[1].item() == 0.0 and batch.advantages[3:5].tolist() == [0.0, 0.0]


def test_max_groups_limits_an_oversampled_batch():
    batch = build_dapo_batch(_iteration(), DapoOptions(t_max=40, l_thr=10), max_groups=1)
    assert {t.task_id for t in batch.trajectories} == {"A"}
    assert batch.dynamic_sampling.dropped_surplus_groups == 1


def test_options_from_config_dataclass_and_omegaconf():
    algo, stage2 = AlgoConfig(std=StdKind.sample, adv_eps=1e-4), StageConfig(t_max=80, eps_high=0.26)
    expected = DapoOptions(t_max=80, l_thr=10, adv_eps=1e-4, std="sample", eps_low=0.2, eps_high=0.26)
    assert DapoOptions.from_config(algo, stage2) == expected
    node = OmegaConf.structured
    assert DapoOptions.from_config(node(algo), node(stage2)) == expected


def test_sample_std_option_changes_the_scale():
    pop = build_dapo_batch(_iteration(), DapoOptions(adv_eps=0.0))
    smp = build_dapo_batch(_iteration(), DapoOptions(adv_eps=0.0, std="sample"))
    # C has G = 2 kept: sample std is sqrt(2) x population std
    torch.testing.assert_close(smp.advantages[-2:] * math.sqrt(2), pop.advantages[-2:])

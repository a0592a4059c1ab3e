"""algo/staleness.py by hand: a trajectory is as old as its oldest turn; more than k behind is dropped."""

import pytest

from swe_megatron.algo.staleness import split_stale, staleness, staleness_lr_scale, staleness_metrics
from swe_megatron.rollout.command import render_trajectory
from swe_megatron.trajectory import Trajectory


def _traj(i: int, versions: list[int]) -> Trajectory:
    return Trajectory(task_id="t", sample_index=i, policy_versions=versions)


def test_staleness_is_counted_from_the_oldest_turn():
    assert staleness(_traj(0, [5, 5, 6]), 6) == 1
    assert staleness(_traj(0, [6, 6]), 6) == 0
    assert staleness(_traj(0, []), 9) == 0  # not tracked (a scripted policy): on-policy by definition


def test_more_than_k_updates_behind_is_dropped_and_counted():
    trajs = [_traj(0, [4, 5]), _traj(1, [5]), _traj(2, [3, 4, 5]), _traj(3, [6])]
    kept, dropped = split_stale(trajs, 6, 1)
    assert [t.sample_index for t in kept] == [1, 3] and [t.sample_index for t in dropped] == [0, 2]
    kept, dropped = split_stale(trajs, 6, 3)
    assert len(kept) == 4 and not dropped
    assert split_stale(trajs, 6, 0)[0] == [trajs[3]]
    with pytest.raises(ValueError, match="max_staleness=-1"):
        split_stale(trajs, 6, -1)
    m = staleness_metrics(trajs, 6, dropped=2)
    assert m == {"staleness_mean": (2 + 1 + 3 + 0) / 4, "staleness_max": 3.0, "mixed_version_trajectories": 2.0,
                 "dropped_stale": 2.0}  # fmt: skip


def test_a_trajectory_with_a_version_per_turn_checks():
    t = Trajectory(task_id="t", sample_index=0, token_ids=[1, 2, 3], action_mask=[0, 1, 1], logprobs=[0, -1, -1],
                   prompt_len=1, turn_spans=[[1, 2], [2, 3]], num_steps=2, policy_versions=[0, 1])  # fmt: skip
    t.check()
    t.messages = [{"role": "user", "content": "fix"}, {"role": "assistant", "content": "a"},
                  {"role": "assistant", "content": "b"}]  # fmt: skip
    assert "[turn 1, weights v1]" in render_trajectory(t)  # show-trajectory names the weights of each turn
    t.policy_versions = [0]
    with pytest.raises(ValueError, match="1 policy_versions but 2 assistant turns"):
        t.check()
    assert Trajectory.from_json(
        Trajectory(task_id="t", sample_index=0, policy_versions=[2]).to_json()
    ).policy_versions == [2]


def test_an_empty_batch_has_zero_staleness_and_counts_its_drops():
    """Every trajectory of an iteration dropped (or none returned): the metrics still come, no ZeroDivisionError."""
    assert split_stale([], 3, 1) == ([], [])
    assert staleness_metrics([], 3, dropped=4) == {
        "staleness_mean": 0.0, "staleness_max": 0.0, "mixed_version_trajectories": 0.0, "dropped_stale": 4.0,
    }  # fmt: skip


def test_the_staleness_aware_lr_divides_by_one_plus_the_mean_staleness():
    """algo.staleness_lr: lr / (1 + mean staleness) over the trained trajectories; on-policy and empty batches 1."""
    assert staleness_lr_scale([_traj(0, [6]), _traj(1, [])], 6) == 1.0
    assert staleness_lr_scale([], 6) == 1.0
    assert staleness_lr_scale([_traj(0, [5, 6]), _traj(1, [6])], 6) == 1 / 1.5  # oldest turn counts: mean 0.5
    assert staleness_lr_scale([_traj(0, [4]), _traj(1, [5])], 6) == 1 / 2.5


@pytest.mark.parametrize("on", [True, False])
def test_the_dapo_batch_carries_the_staleness_lr_to_every_rank(on, tmp_path):
    """pipeline/stages.py: algo.staleness_lr sets the unit's Batch.lr_scale from the trajectories it trains on (all
    stale here: sampled by version 4, the trainer at 5), and Batch.shared, what the other ranks get, keeps it; off,
    the factor is 1. (dapo_iteration hands b.lr_scale to Trainer.update, whose use of it test_optim checks.)"""
    from types import SimpleNamespace

    from swe_megatron.config.load import load_config
    from swe_megatron.pipeline import stages

    from .conftest import build_trajectory

    cfg = load_config("embedded", ["algo=async", f"algo.staleness_lr={str(on).lower()}", "stage1.iterations=1"])
    trajs = [build_trajectory(f"t{i // 2}", i % 2, resolved=i % 2 == 0, policy_versions=[4, 5]) for i in range(4)]
    rolled = stages.Rolled(trajs, {}, 0)
    ahead = SimpleNamespace(begin=lambda stage: None, start_process=lambda factory: None, take=lambda unit: rolled)
    ctx = SimpleNamespace(cfg=cfg, ahead=ahead, run=SimpleNamespace(step=5), rollouts=None, gate=None)
    batch = stages._dapo_batch(ctx, "stage1", 0, "stage1:0")
    assert len(batch.info.trajectories) == 4
    want = 0.5 if on else 1.0
    assert batch.lr_scale == want and batch.shared().lr_scale == want

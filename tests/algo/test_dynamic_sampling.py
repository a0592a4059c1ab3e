"""Dynamic sampling: which trajectories are dropped, the report, and the over-sampling count."""

import pytest
import torch

from swe_megatron.algo import dynamic_sampling, group_advantages, tasks_to_sample


def test_drops_all_equal_groups_and_zero_advantage_samples():
    items = ["a", "b", "c", "d", "e", "f", "g"]
    groups = ["g1", "g1", "g2", "g2", "g3", "g3", "g3"]
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.5, 0.0, -0.5])
    kept, kept_adv, rep = dynamic_sampling(items, groups, adv)
    assert kept == ["a", "b", "e", "g"]
    assert kept_adv.tolist() == [1.0, -1.0, 0.5, -0.5]
    assert (rep.trajectories_in, rep.groups_in, rep.kept, rep.groups_kept) == (7, 3, 4, 2)
    assert (rep.dropped_all_equal_groups, rep.dropped_all_equal, rep.dropped_zero_advantage) == (1, 2, 1)
    assert rep.dropped_surplus_groups == 0
    assert rep.as_metrics("dynamic_sampling/")["dynamic_sampling/dropped_all_equal"] == 2.0


def test_with_real_advantages_all_solved_and_all_failed_groups_go():
    rewards = [1, 1, 1, 0, 0, 0, 1, 0, 0]
    groups = ["solved"] * 3 + ["failed"] * 3 + ["mixed"] * 3
    adv = group_advantages(rewards, groups, 1e-6)
    kept, _, rep = dynamic_sampling(list(range(9)), groups, adv)
    assert kept == [6, 7, 8]
    assert rep.dropped_all_equal_groups == 2 and rep.dropped_all_equal == 6


def test_max_groups_keeps_the_first_nondegenerate_groups_in_order():
    groups = ["z", "z", "y", "y", "x", "x", "w", "w"]
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0, 2.0, -2.0, 3.0, -3.0])
    kept, _, rep = dynamic_sampling(list("abcdefgh"), groups, adv, max_groups=2)
    assert kept == list("abef")  # z and x fill the batch; y was degenerate; w is surplus
    assert (rep.groups_kept, rep.dropped_surplus_groups, rep.dropped_surplus) == (2, 1, 2)
    assert (
        rep.kept + rep.dropped_all_equal + rep.dropped_zero_advantage + rep.dropped_surplus
        == rep.trajectories_in
    )


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="must match"):
        dynamic_sampling(["a"], ["g", "g"], torch.zeros(2))


@pytest.mark.parametrize(
    ("n", "factor", "pool", "expected"),
    [
        (300, 1.0, 7249, 300),
        (300, 1.1, 7249, 330),
        (300, 1.25, 7249, 375),
        (100, 1.5, 120, 120),
        (3, 1.01, 10, 4),
    ],
)
def test_tasks_to_sample(n, factor, pool, expected):
    assert tasks_to_sample(n, factor, pool) == expected


def test_oversample_factor_below_one_is_rejected():
    with pytest.raises(ValueError, match="oversample_factor"):
        tasks_to_sample(300, 0.9, 7249)

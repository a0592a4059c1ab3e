"""Group advantages A = (R - mean_G) / (std_G + eps), hand-computed, both std conventions."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from swe_megatron.algo import group_advantages
from swe_megatron.config.schema import StdKind


def test_population_std_one_success_in_four():
    # mean 0.25, population std sqrt(0.25 * 0.75) = sqrt(3) / 4
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], ["a"] * 4, eps=0.0, dtype=torch.float64)
    assert adv.tolist() == pytest.approx(
        [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)]
    )


def test_sample_std_one_success_in_four():
    # sample variance (0.75^2 + 3 * 0.25^2) / 3 = 0.25, std 0.5
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], ["a"] * 4, eps=0.0, std="sample", dtype=torch.float64)
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])


def test_eps_is_added_to_the_std():
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], ["a"] * 4, eps=0.5, std=StdKind.sample, dtype=torch.float64)
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_groups_are_normalised_separately_whatever_the_order():
    rewards = [1.0, 0.5, 0.0, 0.0, 1.0, 0.5]
    groups = ["x", "y", "x", "y", "x", "y"]
    adv = group_advantages(rewards, groups, eps=0.0, dtype=torch.float64)
    # x: [1, 0, 1] mean 2/3, std sqrt(2)/3; y: [0.5, 0, 0.5] mean 1/3, std sqrt(2)/6
    a = 1 / math.sqrt(2)
    assert adv.tolist() == pytest.approx([a, a, -2 * a, -2 * a, a, a])


def test_all_equal_groups_and_singletons_are_exactly_zero():
    rewards = [0.1, 0.1, 0.1, -0.7, -0.7, 1.0, 0.3]
    adv = group_advantages(rewards, ["a", "a", "a", "b", "b", "c", "d"], eps=1e-6)
    assert adv.tolist() == [0.0] * 7


def test_length_penalty_breaks_ties_between_failures():
    # two failures of different length are no longer an all-equal group
    adv = group_advantages([0.0, -0.5], ["a", "a"], eps=0.0, dtype=torch.float64)
    assert adv.tolist() == pytest.approx([1.0, -1.0])


def test_default_dtype_and_errors():
    assert group_advantages([1.0, 0.0], [0, 0], 1e-6).dtype == torch.float32
    with pytest.raises(ValueError, match="std"):
        group_advantages([1.0, 0.0], [0, 0], 1e-6, std="biased")
    with pytest.raises(ValueError, match="group ids"):
        group_advantages([1.0, 0.0], [0], 1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-2, 1, allow_nan=False), min_size=2, max_size=12))
def test_population_advantages_have_zero_mean_and_unit_mean_square(rewards):
    assume(max(rewards) - min(rewards) > 1e-6)  # near-degenerate groups amplify rounding
    adv = group_advantages(rewards, [0] * len(rewards), eps=0.0, dtype=torch.float64)
    assert adv.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert (adv**2).mean().item() == pytest.approx(1.0, rel=1e-9)


def test_tensor_group_ids_group_by_value():
    """Group ids given as a tensor group by value (its elements hash by identity, which made every trajectory
    its own group and every advantage 0)."""
    rewards = [1.0, 0.0, 1.0, 0.0]
    expected = group_advantages(rewards, [7, 7, 9, 9], eps=0.0, dtype=torch.float64)
    got = group_advantages(rewards, torch.tensor([7, 7, 9, 9]), eps=0.0, dtype=torch.float64)
    torch.testing.assert_close(got, expected)
    assert got.abs().sum() > 0
    with pytest.raises(ValueError, match="group_ids.*1-D"):
        group_advantages(rewards, torch.tensor([[7, 7], [9, 9]]), eps=0.0)

"""Splitting an iteration's kept trajectories into optimiser steps (StageConfig batch/min/max)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swe_megatron.algo import num_optimizer_steps, split_optimizer_steps


@pytest.mark.parametrize(
    ("n", "batch", "lo", "hi", "sizes"),
    [
        (1000, 128, 2, 8, [125] * 8),  # ceil(1000 / 128) = 8
        (3000, 128, 2, 8, [375] * 8),  # capped at 8 steps: larger steps, every trajectory used once
        (100, 128, 2, 8, [50, 50]),  # fewer than one batch: still the minimum of 2 steps
        (513, 256, 2, 8, [171, 171, 171]),  # stage 2: ceil(513 / 256) = 3
        (1, 128, 2, 8, [1]),  # never an empty step
        (0, 128, 2, 8, []),
        (130, 64, 1, 0, [44, 43, 43]),  # RFT: no cap, ceil(130 / 64) = 3
    ],
)
def test_step_sizes_by_hand(n, batch, lo, hi, sizes):
    steps = split_optimizer_steps(list(range(n)), batch, lo, hi)
    assert [len(s) for s in steps] == sizes
    assert [i for s in steps for i in s] == list(range(n))  # no seed: input order kept


def test_rft_paper_numbers():
    # 6,548 kept trajectories, batch 64, no cap: 103 steps of 63 or 64
    sizes = [len(s) for s in split_optimizer_steps(list(range(6548)), 64, 1, 0)]
    assert len(sizes) == 103 and sizes.count(64) == 59 and sizes.count(63) == 44


def test_seed_shuffles_reproducibly():
    a = split_optimizer_steps(list(range(50)), 16, 2, 8, seed=3)
    assert a == split_optimizer_steps(list(range(50)), 16, 2, 8, seed=3)
    assert a != split_optimizer_steps(list(range(50)), 16, 2, 8, seed=4)
    assert sorted(i for s in a for i in s) == list(range(50))


@pytest.mark.parametrize(("batch", "lo", "hi"), [(0, 2, 8), (128, 0, 8), (128, 3, 2), (128, 2, -1)])
def test_invalid_settings_are_rejected(batch, lo, hi):
    with pytest.raises(ValueError):
        num_optimizer_steps(10, batch, lo, hi)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 600), batch=st.integers(1, 300), lo=st.integers(1, 8), extra=st.integers(-1, 8))
def test_partition_properties(n, batch, lo, extra):
    hi = 0 if extra < 0 else lo + extra
    steps = split_optimizer_steps(list(range(n)), batch, lo, hi, seed=0)
    sizes = [len(s) for s in steps]
    assert sorted(i for s in steps for i in s) == list(range(n))
    if n:
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
        assert len(steps) >= min(lo, n) and (hi == 0 or len(steps) <= hi)
        if len(steps) > lo and (hi == 0 or len(steps) < hi):
            assert max(sizes) <= batch  # unclamped: no step over batch_size, and one step fewer would be
            assert n > batch * (len(steps) - 1)

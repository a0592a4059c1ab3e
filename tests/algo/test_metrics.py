"""pass@k (unbiased estimator) and mean +- SEM, against exact combinatorics and hand values."""

import math
from fractions import Fraction

import pytest

from swe_megatron.algo import mean_pass_at_k, mean_sem, pass_at_k, pass_rate_per_run


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [(10, 1, 1, 0.1), (10, 0, 5, 0.0), (10, 3, 10, 1.0), (5, 2, 2, 0.7), (10, 9, 2, 1.0), (4, 1, 2, 0.5)],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_k_matches_the_binomial_formula_exactly():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(10, 11, 1), (10, -1, 1), (10, 3, 0), (10, 3, 11)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_sem_by_hand():
    mean, sem = mean_sem([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert sem == pytest.approx(math.sqrt((5 / 3) / 4))  # sample variance 5/3 over n = 4
    mean1, sem1 = mean_sem([0.39])
    assert mean1 == 0.39 and math.isnan(sem1)
    with pytest.raises(ValueError):
        mean_sem([])


def test_per_run_pass_rates_and_mean_pass_at_k():
    results = {
        "a": [True, False, True],
        "b": [False, False, False],
        "c": [True, True, False],
        "d": [False] * 3,
    }
    assert pass_rate_per_run(results) == [0.5, 0.25, 0.25]
    # pass@1 per task = c / n: (2/3 + 0 + 2/3 + 0) / 4; pass@3 = any success: 2/4
    assert mean_pass_at_k(results, 1) == pytest.approx(1 / 3)
    assert mean_pass_at_k(results, 3) == 0.5
    with pytest.raises(ValueError, match="run counts"):
        pass_rate_per_run({"a": [True], "b": [True, False]})


def test_train_metrics_name_the_loss_by_its_kind():
    """SFT and DAPO losses are two TensorBoard curves (train/sft_loss, train/dapo_loss), not one."""
    from swe_megatron.pipeline.metrics import train_metrics

    steps = [
        {"loss": 1.0, "grad_norm": 2.0, "action_tokens": 5.0},
        {"loss": 3.0, "grad_norm": 4.0, "action_tokens": 7.0},
    ]
    assert train_metrics(steps, "dapo") == {
        "dapo_loss": 2.0, "grad_norm": 3.0, "optimizer_steps": 2.0, "tokens_trained": 12.0,
    }  # fmt: skip
    assert "sft_loss" in train_metrics(steps, "sft") and "loss" not in train_metrics(steps, "sft")

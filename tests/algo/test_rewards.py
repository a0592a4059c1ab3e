"""Length penalty and final reward, hand-computed from paper-spec.md (R_length, L_thr = 10)."""

import pytest

from swe_megatron.algo import final_reward, length_penalty


@pytest.mark.parametrize(
    ("steps", "t_max", "expected"),
    [
        (0, 40, 0.0),
        (1, 40, 0.0),
        (9, 40, 0.0),  # below L_thr: no penalty
        (10, 40, 0.0),  # at L_thr the formula itself is 0
        (11, 40, -1 / 30),
        (25, 40, -0.5),
        (39, 40, -29 / 30),
        (40, 40, -1.0),  # reaches -1 at T_max (stage 1)
        (45, 80, -0.5),
        (80, 80, -1.0),  # stage 2
    ],
)
def test_length_penalty_hand_values(steps, t_max, expected):
    assert length_penalty(steps, t_max, 10) == pytest.approx(expected, abs=1e-15)


def test_length_penalty_is_linear_from_l_thr_to_t_max():
    values = [length_penalty(s, 40, 10) for s in range(10, 41)]
    steps = [b - a for a, b in zip(values, values[1:])]
    assert all(d == pytest.approx(-1 / 30) for d in steps)


def test_final_reward_adds_the_penalty_to_the_test_reward():
    assert final_reward(1.0, 25, 40, 10) == pytest.approx(0.5)
    assert final_reward(0.0, 40, 40, 10) == -1.0  # a turn-limit failure keeps its full penalty
    assert final_reward(1.0, 5, 40, 10) == 1.0


@pytest.mark.parametrize(("steps", "t_max", "l_thr"), [(5, 10, 10), (5, 9, 10), (-1, 40, 10)])
def test_length_penalty_rejects_invalid_arguments(steps, t_max, l_thr):
    with pytest.raises(ValueError):
        length_penalty(steps, t_max, l_thr)

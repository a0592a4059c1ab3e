"""The paper's final reward: test reward plus a penalty on the number of agent STEPS (not tokens).

R_final = R + R_length, with R_length = 0 for |tau| < L_thr and (L_thr - |tau|) / (T_max - L_thr) from
L_thr on, so the penalty falls linearly from 0 at L_thr turns to -1 at T_max turns. Trajectories that
hit the turn or context limit keep this penalty: the paper warns that filtering them out teaches looping.
"""

from __future__ import annotations


def length_penalty(num_steps: int, t_max: int, l_thr: int) -> float:
    """R_length for an episode of `num_steps` assistant turns: 0 below l_thr, -1 at t_max.

    Not clamped: a step count above t_max (which the agent loop does not produce) goes below -1.
    """
    if t_max <= l_thr:
        raise ValueError(f"length_penalty needs t_max > l_thr, got t_max={t_max}, l_thr={l_thr}")
    if num_steps < 0:
        raise ValueError(f"length_penalty: num_steps={num_steps} is negative")
    if num_steps < l_thr:
        return 0.0
    return (l_thr - num_steps) / (t_max - l_thr)


def final_reward(reward: float, num_steps: int, t_max: int, l_thr: int) -> float:
    """R_final = R + R_length: the test reward (0/1) plus the step-count length penalty."""
    return reward + length_penalty(num_steps, t_max, l_thr)

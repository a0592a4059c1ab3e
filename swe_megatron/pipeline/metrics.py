"""What one iteration logs: plain dicts of scalars computed from trajectories, the batch and trainer metrics."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from swe_megatron.algo import length_penalty, mean_pass_at_k
from swe_megatron.trajectory import Trajectory


def _actions(t: Trajectory) -> np.ndarray:
    """The action mask as booleans, a view of the trajectory's array (no per-token Python objects: an iteration
    is thousands of trajectories of up to 131k tokens)."""
    return np.frombuffer(t.action_mask, np.int8).view(np.bool_)


def rollout_metrics(trajs: list[Trajectory], t_max: int, l_thr: int) -> dict[str, dict[str, float]]:
    """Groups of scalars over the iteration's trajectories; model outcomes only, infra failures counted apart."""
    valid = [t for t in trajs if not t.excluded]
    n = max(len(valid), 1)
    turns = sum(t.num_steps for t in valid)
    by_task: dict[str, list[bool]] = defaultdict(list)
    for t in valid:
        by_task[t.task_id].append(bool(t.resolved))
    infra = Counter()
    for t in trajs:
        if t.excluded:
            kind = t.exit_reason.value if t.exit_reason.is_infra else "drift" if t.drifted else "grading"
            infra[kind] += 1
    masks = [_actions(t) for t in trajs]
    actions = [int(m.sum()) for m in masks]
    lp_sum, lp_n = 0.0, 0  # over the valid trajectories' action tokens
    for t, m, a in zip(trajs, masks, actions):
        if not t.excluded:
            lp_sum += float(np.frombuffer(t.logprobs, np.float32)[m].sum(dtype=np.float64))
            lp_n += a
    reward = sum(float(t.reward) for t in valid) / n
    penalty = sum(length_penalty(t.num_steps, t_max, l_thr) for t in valid) / n
    return {
        "reward": {
            "mean": reward,
            "resolved_rate": sum(bool(t.resolved) for t in valid) / n,
            "pass@1": mean_pass_at_k(by_task, 1) if by_task else 0.0,
            "length_penalty_mean": penalty,
            "final_mean": reward + penalty,  # R_final = R + R_length, the reward DAPO's advantages use
        },
        "episode": {
            "steps_mean": turns / n,
            "steps_max": max((t.num_steps for t in valid), default=0),
            "submit_rate": sum(t.exit_reason.value == "submitted" for t in valid) / n,
            # Give-ups: the agent submitted without changing anything (the decision RL learns on the embedded default).
            "give_up_rate": sum(t.exit_reason.value == "submitted" and not t.patch.strip() for t in valid) / n,
            "format_error_rate": sum(len(t.malformed_turns) for t in valid) / max(turns, 1),
            "turn_limit_rate": sum(t.exit_reason.value == "turn_limit" for t in valid) / n,
            "context_limit_rate": sum(t.exit_reason.value == "context_limit" for t in valid) / n,
            "trajectories": float(len(trajs)),
        },
        "tokens": {
            "generated": float(sum(actions)),
            "trajectory_mean": sum(len(t.token_ids) for t in trajs) / max(len(trajs), 1),
        },
        # Mean -log p of the engine's own samples: an unbiased estimate of the sampling policy's entropy per token.
        "policy": {"entropy_estimate": -lp_sum / lp_n if lp_n else float("nan")},
        "infra": {"failures": float(sum(infra.values())), **{k: float(v) for k, v in infra.items()}},
        # Graded trajectories whose patch mentions the test runner, whose run the canaries caught, or on whose
        # patch the harness itself failed (scored 0, never excluded: a crash must not be a way out of a 0).
        "grading": {
            f: float(sum(f in t.grading_flags for t in trajs))
            for f in ("suspicious", "tampered", "harness_fault")
        },
    }


def train_metrics(steps: list[dict[str, float]], loss: str) -> dict[str, float]:
    """Trainer metrics averaged over the iteration's optimiser steps (action tokens summed); the loss is named
    after its kind (`sft_loss`, `dapo_loss`: two curves, not one that changes meaning between stages)."""
    if not steps:
        return {"optimizer_steps": 0.0}
    out = {(f"{loss}_loss" if k == "loss" else k): sum(s[k] for s in steps if k in s) / len(steps)
           for k in steps[0] if k != "action_tokens"}  # fmt: skip
    out["optimizer_steps"] = float(len(steps))
    out["tokens_trained"] = float(sum(s.get("action_tokens", 0.0) for s in steps))
    return out

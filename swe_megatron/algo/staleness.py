"""How far behind the trainer a trajectory's tokens are (bounded-staleness async RL, algo.max_staleness).

A trajectory's policy version is the OLDEST weight version among its turns (its tokens are only as fresh as
its first turn); its staleness is the trainer's version minus that: the number of updates between the
weights that sampled its oldest tokens and those the trainer updates from.
"""

from __future__ import annotations

from collections.abc import Sequence

from swe_megatron.trajectory import Trajectory


def staleness(traj: Trajectory, trainer_version: int) -> int:
    """Updates between the oldest weights that sampled traj and trainer_version (0: on-policy or untracked)."""
    if not traj.policy_versions:
        return 0
    return trainer_version - min(traj.policy_versions)


def split_stale(trajs: Sequence[Trajectory], trainer_version: int, max_staleness: int):
    """(kept, dropped): the trajectories at most max_staleness updates behind trainer_version, and the others."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness={max_staleness} is invalid; allowed: >= 0")
    kept, dropped = [], []
    for t in trajs:
        (dropped if staleness(t, trainer_version) > max_staleness else kept).append(t)
    return kept, dropped


def staleness_lr_scale(trajs: Sequence[Trajectory], trainer_version: int) -> float:
    """1 / (1 + mean staleness of trajs): the factor of algo.staleness_lr (1.0 for none or an on-policy batch)."""
    if not trajs:
        return 1.0
    return 1.0 / (1.0 + sum(staleness(t, trainer_version) for t in trajs) / len(trajs))


def staleness_metrics(trajs: Sequence[Trajectory], trainer_version: int, dropped: int) -> dict[str, float]:
    """async/* scalars of one batch: staleness mean and max over its trajectories, how many of them were sampled
    by more than one version (weights changed mid-episode), and how many were dropped as too stale."""
    s = [staleness(t, trainer_version) for t in trajs] or [0]
    mixed = sum(len(set(t.policy_versions)) > 1 for t in trajs)
    return {
        "staleness_mean": sum(s) / len(s),
        "staleness_max": float(max(s)),
        "mixed_version_trajectories": float(mixed),
        "dropped_stale": float(dropped),
    }

"""Rejection fine-tuning data: keep resolved trajectories, at most k per task, malformed turns masked."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from swe_megatron.algo.metrics import Counts
from swe_megatron.trajectory import Trajectory


@dataclass
class RftReport(Counts):
    """What rft_select kept and why it dropped the rest."""

    trajectories_in: int = 0
    """Trajectories offered."""
    excluded: int = 0
    """Infrastructure failures or drifted trajectories (not model outcomes)."""
    unresolved: int = 0
    """Graded but not resolved."""
    over_cap: int = 0
    """Resolved, but the task already had max_per_task kept."""
    nothing_to_train: int = 0
    """Resolved, but every assistant turn was malformed, so no token is left to train."""
    kept: int = 0
    """Trajectories kept."""
    tasks_in: int = 0
    """Distinct tasks offered."""
    tasks_kept: int = 0
    """Tasks with at least one kept trajectory."""
    masked_turns: int = 0
    """Malformed assistant turns masked in the kept trajectories."""
    loss_tokens: int = 0
    """Tokens trained on in the kept trajectories."""


def rft_select(
    trajectories: Iterable[Trajectory], max_per_task: int
) -> tuple[list[Trajectory], list[list[int]], RftReport]:
    """Select SFT data from sampled trajectories.

    Keeps resolved trajectories that are not excluded (infra failure, drift), at most `max_per_task`
    per task: those with the lowest sample_index, a choice independent of their content and so
    unbiased and reproducible. Returns (kept trajectories in input order, their loss masks
    (`Trajectory.loss_mask(mask_malformed=True)`: action tokens of well-formed turns), report).
    """
    if max_per_task < 1:
        raise ValueError(f"rft_select: max_per_task={max_per_task} is invalid; allowed: >= 1")
    trajs = list(trajectories)
    report = RftReport(trajectories_in=len(trajs), tasks_in=len({t.task_id for t in trajs}))
    candidates: list[tuple[int, Trajectory, list[int]]] = []
    for i, t in enumerate(trajs):
        if t.excluded:
            report.excluded += 1
        elif not t.resolved:
            report.unresolved += 1
        else:
            mask = t.loss_mask(mask_malformed=True)
            if not any(mask):
                report.nothing_to_train += 1
            else:
                candidates.append((i, t, mask))
    taken: dict[str, int] = {}
    chosen: list[tuple[int, Trajectory, list[int]]] = []
    for item in sorted(candidates, key=lambda c: (c[1].task_id, c[1].sample_index, c[0])):
        t = item[1]
        if taken.get(t.task_id, 0) >= max_per_task:
            report.over_cap += 1
            continue
        taken[t.task_id] = taken.get(t.task_id, 0) + 1
        chosen.append(item)
    chosen.sort(key=lambda c: c[0])
    report.kept = len(chosen)
    report.tasks_kept = len(taken)
    report.masked_turns = sum(len(set(t.malformed_turns)) for _, t, _ in chosen)
    report.loss_tokens = sum(sum(m) for _, _, m in chosen)
    return [t for _, t, _ in chosen], [m for _, _, m in chosen], report

"""Dynamic sampling: drop trajectories with zero advantage, and over-sample tasks so a batch still fills.

A group whose rewards are all equal (all solved, all failed with equal length penalties) has advantage
exactly 0 everywhere and no learning signal; keeping it would only dilute the per-token normalisation.
A trajectory of a mixed group can also sit exactly on its group mean; the paper drops zero-advantage
samples as well, so both are dropped and counted separately.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from swe_megatron.algo.metrics import Counts

T = TypeVar("T")


@dataclass
class DynamicSamplingReport(Counts):
    """What dynamic sampling kept and dropped, and why."""

    trajectories_in: int = 0
    """Trajectories offered."""
    groups_in: int = 0
    """Groups offered."""
    dropped_all_equal_groups: int = 0
    """Groups dropped because every advantage in them was zero (all rewards equal)."""
    dropped_all_equal: int = 0
    """Trajectories in those groups."""
    dropped_zero_advantage: int = 0
    """Trajectories of mixed groups whose advantage was exactly zero (reward equal to the group mean)."""
    dropped_surplus_groups: int = 0
    """Non-degenerate groups beyond max_groups (over-sampling filled the batch before them)."""
    dropped_surplus: int = 0
    """Trajectories in those surplus groups."""
    kept: int = 0
    """Trajectories kept."""
    groups_kept: int = 0
    """Groups with at least one kept trajectory."""


def dynamic_sampling(
    items: Sequence[T],
    group_ids: Sequence[Hashable],
    advantages: torch.Tensor,
    max_groups: int | None = None,
) -> tuple[list[T], torch.Tensor, DynamicSamplingReport]:
    """Keep the items with nonzero advantage, at most `max_groups` groups (first seen first).

    items: [N] anything (trajectories). group_ids: [N]. advantages: [N] from `group_advantages`.
    max_groups: with over-sampling, the number of groups the batch needs (tasks per iteration); later
    non-degenerate groups are surplus and dropped. None keeps every non-degenerate group.
    Returns (kept items in input order, their [K] advantages, report).
    """
    adv = advantages.reshape(-1)
    if not len(items) == len(group_ids) == adv.numel():
        raise ValueError(
            f"dynamic_sampling: {len(items)} items, {len(group_ids)} group ids, {adv.numel()} advantages must match"
        )
    nonzero = (adv != 0).tolist()
    order: list[Hashable] = []
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        if g not in members:
            order.append(g)
            members[g] = []
        members[g].append(i)
    report = DynamicSamplingReport(trajectories_in=len(items), groups_in=len(order))
    keep: list[int] = []
    for g in order:
        idx = members[g]
        live = [i for i in idx if nonzero[i]]
        if not live:
            report.dropped_all_equal_groups += 1
            report.dropped_all_equal += len(idx)
            continue
        if max_groups is not None and report.groups_kept >= max_groups:
            report.dropped_surplus_groups += 1
            report.dropped_surplus += len(idx)
            continue
        report.dropped_zero_advantage += len(idx) - len(live)
        report.groups_kept += 1
        keep.extend(live)
    keep.sort()
    report.kept = len(keep)
    return [items[i] for i in keep], adv[keep], report


def tasks_to_sample(tasks_per_iteration: int, oversample_factor: float, pool_size: int) -> int:
    """Tasks to roll out so that about `tasks_per_iteration` groups survive dynamic sampling.

    ceil(tasks_per_iteration x oversample_factor), capped by the pool. A factor of 1 is no over-sampling;
    a good factor is 1 / (fraction of groups kept lately), e.g. from the last DynamicSamplingReport.
    """
    if oversample_factor < 1.0:
        raise ValueError(f"oversample_factor={oversample_factor} is invalid; allowed: >= 1.0 (1.0 = off)")
    # The small slack keeps e.g. 300 x 1.1 = 330.00000000000006 from rounding up to 331.
    return min(pool_size, math.ceil(tasks_per_iteration * oversample_factor - 1e-9))

"""From graded trajectories to a DAPO batch: exclusions, final rewards, group advantages, dynamic sampling.

This is `dapo.make_batch` of design.md's iteration, as one pure function over Trajectory records.
Infrastructure failures and drifted trajectories are excluded and counted, never rewarded 0
(design.md invariant 4); turn- and context-limit endings are model outcomes and keep their penalty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from swe_megatron.algo.advantages import group_advantages
from swe_megatron.algo.dynamic_sampling import DynamicSamplingReport, dynamic_sampling
from swe_megatron.algo.rewards import length_penalty
from swe_megatron.trajectory import Trajectory


@dataclass
class DapoOptions:
    """The settings the DAPO batch and loss need, as plain values."""

    t_max: int = 40
    """Turn limit (length penalty reaches -1 here)."""
    l_thr: int = 10
    """Turns from which the length penalty starts."""
    adv_eps: float = 1e-6
    """delta in the advantage's denominator."""
    std: str = "population"
    """Group std: "population" or "sample"."""
    drop_zero_advantage: bool = True
    """Dynamic sampling on/off."""
    eps_low: float = 0.2
    """Lower clip bound 1 - eps_low."""
    eps_high: float = 0.3
    """Upper clip bound 1 + eps_high."""

    @classmethod
    def from_config(cls, algo: Any, stage: Any) -> DapoOptions:
        """Map an AlgoConfig and a StageConfig (dataclass or OmegaConf node) to options."""
        return cls(
            t_max=int(stage.t_max),
            l_thr=int(stage.l_thr),
            adv_eps=float(algo.adv_eps),
            std=str(getattr(algo.std, "value", algo.std)),
            drop_zero_advantage=bool(algo.drop_zero_advantage),
            eps_low=float(stage.eps_low),
            eps_high=float(stage.eps_high),
        )


@dataclass
class DapoBatch:
    """The trajectories to train on with their advantages, and what happened to the others."""

    trajectories: list[Trajectory]
    """[K] kept trajectories, input order."""
    advantages: torch.Tensor
    """[K] one advantage per kept trajectory (broadcast over its action tokens by the loss)."""
    final_rewards: list[float]
    """[K] R + R_length of the kept trajectories."""
    excluded: int = 0
    """Trajectories excluded as infrastructure failures or drift."""
    dynamic_sampling: DynamicSamplingReport = field(default_factory=DynamicSamplingReport)
    """Dynamic-sampling counts (over the non-excluded trajectories)."""

    def as_metrics(self) -> dict[str, dict[str, float]]:
        """What the batch adds to the rollout's metrics: advantage statistics and dynamic-sampling counts."""
        adv, ds = self.advantages.tolist(), self.dynamic_sampling
        advantage = {"mean": sum(adv) / len(adv), "abs_mean": sum(map(abs, adv)) / len(adv),
                     "min": min(adv), "max": max(adv)} if adv else {}  # fmt: skip
        dropped_groups = ds.dropped_all_equal_groups + ds.dropped_surplus_groups
        dropped = ds.dropped_all_equal + ds.dropped_zero_advantage + ds.dropped_surplus
        totals = {"dropped_groups": float(dropped_groups), "dropped_trajectories": float(dropped)}
        return {
            "advantage": advantage,
            "dynamic_sampling": ds.as_metrics() | totals | {"excluded": float(self.excluded)},
        }


def build_dapo_batch(
    trajectories: list[Trajectory], options: DapoOptions, max_groups: int | None = None
) -> DapoBatch:
    """Exclude infra/drift, score R_final, compute group advantages (group = task id), drop zero advantage.

    trajectories: [N] graded rollouts of one iteration. max_groups: with over-sampling, keep at most this
    many non-degenerate groups (see dynamic_sampling; only with drop_zero_advantage). Returns a DapoBatch.
    """
    valid = [t for t in trajectories if not t.excluded]
    excluded = len(trajectories) - len(valid)
    penalties = [length_penalty(t.num_steps, options.t_max, options.l_thr) for t in valid]
    finals = [float(t.reward) + p for t, p in zip(valid, penalties)]
    groups = [t.task_id for t in valid]
    adv = group_advantages(finals, groups, options.adv_eps, options.std)
    if options.drop_zero_advantage:
        pairs = list(zip(valid, finals))
        kept_pairs, kept_adv, report = dynamic_sampling(pairs, groups, adv, max_groups)
    else:
        kept_pairs, kept_adv = list(zip(valid, finals)), adv
        report = DynamicSamplingReport(
            trajectories_in=len(valid),
            groups_in=len(set(groups)),
            kept=len(valid),
            groups_kept=len(set(groups)),
        )
    return DapoBatch(
        trajectories=[t for t, _ in kept_pairs],
        advantages=kept_adv,
        final_rewards=[f for _, f in kept_pairs],
        excluded=excluded,
        dynamic_sampling=report,
    )

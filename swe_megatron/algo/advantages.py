"""Group-relative advantages: A_i = (R_i - mean_G) / (std_G + eps), one value per trajectory.

Which std: `population` (divide by G) by default. The paper is silent. With the population std the
advantages of every non-degenerate group have a mean square of exactly 1 (up to eps) whatever G is,
so a group's total weight in the loss does not depend on how many of its rollouts survived infra
failures; the sample std (divide by G - 1, torch.std's default, common in GRPO code) gives the same
direction with a G-dependent scale of sqrt((G - 1) / G), i.e. 5% smaller at the paper's G = 10.
Both are available (`algo.std`).

Groups whose rewards are all equal get an advantage of exactly 0.0 (not a rounding residue of
x - mean(x)), so dynamic sampling can recognise and drop them by an exact test.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

STD_KINDS = ("population", "sample")


def group_advantages(
    rewards: Sequence[float] | torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    eps: float,
    std: str = "population",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per-trajectory advantages normalised within each group.

    rewards: [N] final rewards (test reward + length penalty). group_ids: [N] group key of each
    trajectory (its task id; a 1-D tensor groups by value). eps: the delta added to the std. std: "population" or "sample".
    Returns a [N] tensor of `dtype`, computed in float64; groups with all rewards equal (including
    groups of one) are exactly 0.
    """
    std = getattr(std, "value", std)  # accepts the config's StdKind enum as well as its string
    if std not in STD_KINDS:
        raise ValueError(f"group_advantages: std={std!r} is invalid; allowed: {', '.join(STD_KINDS)}")
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1:
            raise ValueError(
                f"group_advantages: group_ids is a tensor of shape {tuple(group_ids.shape)}; allowed: 1-D [N]"
            )
        group_ids = group_ids.tolist()  # tensor elements hash by identity: every element its own group
    if len(group_ids) != r.numel():
        raise ValueError(f"group_advantages: {r.numel()} rewards but {len(group_ids)} group ids")
    out = torch.zeros_like(r)
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    for idx in members.values():
        x = r[idx]
        if bool((x == x[0]).all()):
            continue  # all-equal group (or a group of one): exactly zero
        sd = x.std(correction=0 if std == "population" else 1)
        out[idx] = (x - x.mean()) / (sd + eps)
    return out.to(dtype)

"""Off-policy correction of the DAPO loss against the behaviour policy (the engine that sampled), pure torch.

The loss's ratio compares the new policy with the trainer's OWN logprobs before the update ("old"), but the
tokens were sampled by the engine: even with no staleness its logprobs differ from the trainer's (other kernels,
bf16), and with stale weights they differ more. Two corrections (verl's rollout correction), both off by default
(`algo.off_policy`), both beyond the paper:

- token-level truncated importance sampling: each action token's clipped objective is multiplied by
  w_t = min(exp(old_t - behaviour_t), C), detached (C = `tis_cap`);
- trajectory masking: a trajectory whose mismatch m = |mean over its action tokens of (old_t - behaviour_t)|
  exceeds `mask_threshold` gets weight 0 on every token. m is the absolute log of the geometric-mean ratio:
  length-normalised (the product of 30k token ratios of a long episode is meaningless), 0 when engine and
  trainer agree, and under behaviour samples its expectation is KL(behaviour || old), so it measures systematic
  drift (stale or wrong weights, different numerics) while single-token outliers are left to the cap.

Tokens without a behaviour logprob (NaN: RFT data, trajectories recorded without them) get weight 1 and never
count towards a trajectory's mismatch; a trajectory with none is never masked. Layouts: padded [B, T] (a row
is a trajectory) or any shape with `segments`, the trajectory index of each token (a packed micro-batch).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _check(old: torch.Tensor, behaviour: torch.Tensor, action_mask: torch.Tensor) -> None:
    if old.shape != behaviour.shape or old.shape != action_mask.shape:
        raise ValueError(
            f"off_policy: old {tuple(old.shape)}, behaviour {tuple(behaviour.shape)} and action_mask "
            f"{tuple(action_mask.shape)} logprobs must have the same shape"
        )


def _log_ratio(old: torch.Tensor, behaviour: torch.Tensor, action_mask: torch.Tensor):
    """(old - behaviour where known else 0, known = action token with a behaviour logprob), detached."""
    _check(old, behaviour, action_mask)
    dt = torch.promote_types(old.dtype, torch.float32)
    known = action_mask.bool() & ~torch.isnan(behaviour)
    return torch.where(known, old.detach().to(dt) - behaviour.detach().to(dt), 0.0), known


def truncated_is_weights(
    old: torch.Tensor, behaviour: torch.Tensor, action_mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """min(exp(old - behaviour), cap) on action tokens with a behaviour logprob, 1 on the others, 0 off the mask."""
    d, known = _log_ratio(old, behaviour, action_mask)
    w = torch.where(known, torch.exp(d).clamp(max=cap), 1.0)
    return torch.where(action_mask.bool(), w, 0.0)


def _segments(shape: torch.Size, segments: torch.Tensor | None, num_segments: int | None):
    if segments is None:
        if len(shape) != 2:
            raise ValueError(f"off_policy: inputs of shape {tuple(shape)} need segments (one id per token)")
        segments, num_segments = torch.arange(shape[0])[:, None].expand(shape), shape[0]
    elif segments.shape != shape:
        raise ValueError(
            f"off_policy: segments {tuple(segments.shape)} must have the inputs' shape {tuple(shape)}"
        )
    if num_segments is None:
        num_segments = int(segments.max()) + 1 if segments.numel() else 0
    return segments.reshape(-1).long(), num_segments


def segment_log_ratios(
    old: torch.Tensor,
    behaviour: torch.Tensor,
    action_mask: torch.Tensor,
    segments: torch.Tensor | None = None,
    num_segments: int | None = None,
) -> torch.Tensor:
    """[num_segments, 3] per trajectory: (sum of old - behaviour, tokens with a behaviour logprob, action tokens).

    segments: the trajectory index (0..num_segments-1) of each token; None for [B, T] inputs (row b is b).
    Sums, so that parts of a trajectory on other ranks (context parallelism) add up.
    """
    d, known = _log_ratio(old, behaviour, action_mask)
    seg, n = _segments(old.shape, None if segments is None else segments.to(old.device), num_segments)
    cols = torch.stack(
        [d.reshape(-1), known.reshape(-1).to(d.dtype), action_mask.reshape(-1).to(d.dtype)], -1
    )
    return torch.zeros(n, 3, dtype=d.dtype, device=d.device).index_add_(0, seg.to(d.device), cols)


def off_policy_weights(
    old: torch.Tensor,
    behaviour: torch.Tensor,
    action_mask: torch.Tensor,
    tis_cap: float | None,
    mask_threshold: float | None,
    segments: torch.Tensor | None = None,
    num_segments: int | None = None,
    reduce_segments: Callable[[torch.Tensor], object] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The per-token loss weights of `algo.off_policy` (detached; 0 off the mask) and their metrics.

    weight = truncated IS weight (if tis_cap, else 1) x 0 on trajectories whose |mean log ratio| > mask_threshold.
    reduce_segments: applied in place to `segment_log_ratios` before the masking decision (an all-reduce over
    context-parallel ranks); None for a whole batch. Metrics (0-dim sums, to add over micro-batches and ranks):
    with tis_cap: is_weight_sum / is_weight_max / is_clipped_tokens (weight capped) over the is_tokens action
    tokens with a behaviour logprob, before masking; with mask_threshold: masked_trajectories and trajectories
    (those with an action token).
    """
    mask = action_mask.bool()
    d, known = _log_ratio(old, behaviour, action_mask)
    metrics: dict[str, torch.Tensor] = {}
    if tis_cap is None:
        w = mask.to(d.dtype)
    else:
        w = truncated_is_weights(old, behaviour, action_mask, tis_cap)
        metrics["is_weight_sum"] = torch.where(known, w, 0.0).sum()
        metrics["is_weight_max"] = torch.where(known, w, 0.0).amax() if w.numel() else d.new_zeros(())
        metrics["is_clipped_tokens"] = (known & (torch.exp(d) > tis_cap)).sum().to(d.dtype)
        metrics["is_tokens"] = known.sum().to(d.dtype)
    if mask_threshold is not None:
        sums = segment_log_ratios(old, behaviour, action_mask, segments, num_segments)
        if reduce_segments is not None:
            reduce_segments(sums)
        drop = (sums[:, 1] > 0) & ((sums[:, 0] / sums[:, 1].clamp_min(1)).abs() > mask_threshold)
        seg, _ = _segments(old.shape, None if segments is None else segments.to(old.device), num_segments)
        w = torch.where(drop[seg.to(d.device)].reshape(w.shape), 0.0, w)
        metrics["masked_trajectories"] = drop.sum().to(d.dtype)
        metrics["trajectories"] = (sums[:, 2] > 0).sum().to(d.dtype)
    return w, metrics

"""Token-level losses: the modified-DAPO policy loss (RL stages) and the SFT loss (RFT), pure torch.

Both are sums over the trained tokens divided by a count the caller passes in: the GLOBAL number of
trained tokens of the optimiser step (all micro-batches, all data-parallel ranks). Summing the losses
(and gradients) of any split of the step's batch then gives exactly the loss and gradient of the
whole batch (design.md invariant 5). With a data-parallel reduction that AVERAGES gradients over ranks,
multiply each rank's loss by the data-parallel size (or reduce with a sum) to keep that identity.

Masked positions (observations, prompt, padding) take part through `torch.where`, never through a
multiplication, so no gradient (not even a NaN from -inf logprobs) reaches them.
"""

from __future__ import annotations

import torch


def _count(n: int | torch.Tensor) -> torch.Tensor | int:
    """The normaliser, at least 1 so that a step without trained tokens gives loss 0, not NaN."""
    return n.clamp_min(1) if isinstance(n, torch.Tensor) else max(int(n), 1)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    # Ratios exp(logp - old) in bf16 would be off by ~1%, as large as the clip range itself.
    return torch.promote_types(t.dtype, torch.float32)


def dapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    num_action_tokens: int | torch.Tensor,
    logits: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped-ratio policy loss over action tokens, normalised by the global action-token count; no KL.

    loss = -sum_{t in action} min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t) / num_action_tokens,
    with r_t = exp(logprobs_t - old_logprobs_t).

    Shapes: logprobs, old_logprobs, action_mask: any shape S, e.g. [B, T] padded or [T] packed
    (logprobs of the sampled token at each position; old_logprobs from the engine that sampled them).
    advantages: S (per token, the trajectory's advantage broadcast over its tokens) or [B] when S is
    [B, T] (one per sequence). action_mask: bool or 0/1, True on action tokens. logits: optional
    S + [V] for the entropy metric only (no gradient). is_weights: optional S, detached per-token weights
    multiplying each token's clipped objective (off-policy correction, `algo.off_policy.off_policy_weights`);
    the normaliser stays num_action_tokens. None: the paper's loss, bit for bit.
    Returns (scalar loss, metrics): 0-dim detached tensors averaged over THIS call's action tokens —
    clip_frac_low / clip_frac_high (fraction of action tokens where the clip is active and removes the
    gradient: r < 1 - eps_low with A < 0, r > 1 + eps_high with A > 0), ratio_mean, ratio_max,
    approx_kl (the k3 estimator of KL(old || new), (r - 1) - log r, unbiased under old-policy samples
    and never negative), entropy (if logits), and action_tokens (this call's count: the weight for
    combining means over micro-batches; combine ratio_max by max). With no action tokens the means are 0.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != action_mask.shape:
        raise ValueError(
            f"dapo_loss: logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
            f"action_mask {tuple(action_mask.shape)} must have the same shape"
        )
    if advantages.shape != logprobs.shape:
        if logprobs.dim() == 2 and advantages.shape == logprobs.shape[:1]:
            advantages = advantages[:, None]
        else:
            raise ValueError(
                f"dapo_loss: advantages {tuple(advantages.shape)} must match logprobs {tuple(logprobs.shape)} "
                "or be one per sequence [B] for [B, T] inputs"
            )
    dt = _compute_dtype(logprobs)
    mask = action_mask.bool()
    log_ratio = torch.where(mask, logprobs.to(dt) - old_logprobs.to(dt), 0.0)
    ratio = torch.exp(log_ratio)
    adv = advantages.to(dt)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    objective = torch.minimum(ratio * adv, clipped * adv)
    if is_weights is not None:
        if is_weights.shape != logprobs.shape:
            raise ValueError(
                f"dapo_loss: is_weights {tuple(is_weights.shape)} must match logprobs {tuple(logprobs.shape)}"
            )
        objective = objective * is_weights.detach().to(dt)
    loss = -torch.where(mask, objective, 0.0).sum() / _count(num_action_tokens)

    with torch.no_grad():
        n = mask.sum()
        denom = n.clamp_min(1).to(dt)
        r = ratio.detach()

        def mean(x: torch.Tensor) -> torch.Tensor:
            return torch.where(mask, x, 0.0).sum() / denom

        metrics = {
            "clip_frac_low": mean(((r < 1.0 - eps_low) & (adv < 0)).to(dt)),
            "clip_frac_high": mean(((r > 1.0 + eps_high) & (adv > 0)).to(dt)),
            "ratio_mean": mean(r),
            "ratio_max": torch.where(mask, r, 0.0).amax() if r.numel() else torch.zeros((), dtype=dt),
            "approx_kl": mean((r - 1.0) - log_ratio.detach()),
            "action_tokens": n,
        }
        if logits is not None:
            metrics["entropy"] = mean(token_entropy(logits))
    return loss, metrics


def sft_loss(
    logprobs: torch.Tensor, loss_mask: torch.Tensor, num_loss_tokens: int | torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative log-likelihood summed over trained tokens, divided by the global trained-token count.

    logprobs: any shape S (logprob of the target token at each position). loss_mask: S, True on the
    tokens to imitate (assistant tokens of well-formed turns; Trajectory.loss_mask(mask_malformed=True)).
    Returns (scalar loss, metrics): nll (mean over this call's trained tokens, detached) and loss_tokens.
    """
    if logprobs.shape != loss_mask.shape:
        raise ValueError(
            f"sft_loss: logprobs {tuple(logprobs.shape)} and loss_mask {tuple(loss_mask.shape)} differ"
        )
    mask = loss_mask.bool()
    picked = torch.where(mask, logprobs.to(_compute_dtype(logprobs)), 0.0)
    loss = -picked.sum() / _count(num_loss_tokens)
    n = mask.sum()
    return loss, {"nll": -picked.detach().sum() / n.clamp_min(1), "loss_tokens": n}


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] at each position. logits: S + [V]; targets: S (long). Returns S.

    The caller aligns them: logits at position t score the token at t + 1.
    """
    logp = torch.log_softmax(logits.to(_compute_dtype(logits)), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the next-token distribution at each position. logits: S + [V]; returns S."""
    logp = torch.log_softmax(logits.detach().to(_compute_dtype(logits)), dim=-1)
    return -(logp.exp() * logp).sum(-1)

"""Trajectories -> micro-batches under a token budget, and the split of a batch over data-parallel ranks.

A micro-batch is a [b, s] block of right-padded trajectories (one per row) with b * s within
`ParallelConfig.micro_batch_tokens`; a trajectory longer than the budget gets a micro-batch of its
own. Rows keep their true positions (0..len-1), so RoPE and the causal mask see exactly what the
engine saw. Each micro-batch also carries the flat indices of the hidden-state rows that predict an
action token, which is all `logprobs.action_logprobs` scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class TrainSample:
    """One trajectory as the trainer sees it: the engine's tokens, which of them train, and their weights."""

    tokens: torch.Tensor
    """[T] long: prompt, assistant and observation tokens in order, as the engine produced them."""
    action_mask: torch.Tensor
    """[T] bool: True on tokens that train (assistant tokens; position 0 never does)."""
    advantage: float = 0.0
    """The trajectory's advantage, broadcast to its action tokens (DAPO); unused by SFT."""
    engine_logprobs: torch.Tensor | None = None
    """[T] float: the engine's logprob of each token (read at action positions), for the mismatch metric."""

    def __post_init__(self) -> None:
        if self.tokens.shape != self.action_mask.shape or self.tokens.dim() != 1:
            raise ValueError(
                f"TrainSample: tokens {tuple(self.tokens.shape)} and action_mask "
                f"{tuple(self.action_mask.shape)} must be equal 1-D shapes"
            )
        if self.tokens.numel() and bool(self.action_mask[0]):
            raise ValueError("TrainSample: the first token cannot be an action token (nothing predicts it)")

    @property
    def num_action_tokens(self) -> int:
        """Tokens of this trajectory that train."""
        return int(self.action_mask.sum())


@dataclass
class MicroBatch:
    """Padded trajectories of one forward pass, with the action rows to score. N = action tokens."""

    tokens: torch.Tensor
    """[b, s] long, right-padded with 0."""
    position_ids: torch.Tensor
    """[b, s] long, 0..s-1 in every row."""
    rows: torch.Tensor
    """[N] long: flat index b_i * s + t - 1 of the hidden state that predicts action token t of row b_i."""
    targets: torch.Tensor
    """[N] long: the action tokens."""
    advantages: torch.Tensor
    """[N] float: each action token's trajectory advantage."""
    engine_logprobs: torch.Tensor
    """[N] float: the engine's logprobs of the action tokens (NaN where unknown)."""
    sample_ids: list[int] = field(default_factory=list)
    """Indices of the packed samples in the caller's list, row by row."""
    old_logprobs: torch.Tensor | None = None
    """[N] float: the trainer's logprobs before the update (filled by the step)."""

    @property
    def num_action_tokens(self) -> int:
        """Action tokens in this micro-batch."""
        return int(self.targets.numel())

    def to(self, device: torch.device) -> MicroBatch:
        """This micro-batch with its tensors on `device` (the trainer's GPU; a no-op on CPU)."""
        if self.tokens.device == torch.device(device):
            return self
        move = {k: getattr(self, k) for k in ("tokens", "position_ids", "rows", "targets", "advantages")}
        move["engine_logprobs"] = self.engine_logprobs
        out = {k: v.to(device, non_blocking=True) for k, v in move.items()}
        old = None if self.old_logprobs is None else self.old_logprobs.to(device)
        return MicroBatch(**out, sample_ids=self.sample_ids, old_logprobs=old)


def _collate(samples: list[TrainSample], ids: list[int], pad_multiple: int = 1) -> MicroBatch:
    s = max(int(x.tokens.numel()) for x in samples)
    s = -(-s // pad_multiple) * pad_multiple
    b = len(samples)
    tokens = torch.zeros(b, s, dtype=torch.long)
    rows, targets, adv, eng = [], [], [], []
    for i, x in enumerate(samples):
        n = x.tokens.numel()
        tokens[i, :n] = x.tokens
        pos = torch.nonzero(x.action_mask.bool(), as_tuple=False)[:, 0]
        rows.append(i * s + pos - 1)
        targets.append(x.tokens[pos])
        adv.append(torch.full((pos.numel(),), float(x.advantage)))
        lp = x.engine_logprobs
        eng.append(lp[pos].float() if lp is not None else torch.full((pos.numel(),), float("nan")))
    return MicroBatch(
        tokens=tokens,
        position_ids=torch.arange(s).expand(b, s).contiguous(),
        rows=torch.cat(rows).long(),
        targets=torch.cat(targets).long(),
        advantages=torch.cat(adv),
        engine_logprobs=torch.cat(eng),
        sample_ids=ids,
    )


def pack(
    samples: list[TrainSample], token_budget: int, ids: list[int] | None = None, pad_multiple: int = 1
) -> list[MicroBatch]:
    """Group `samples` into micro-batches of at most `token_budget` padded tokens (b x longest row).

    Longest first, first fit: rows of similar length share a micro-batch, which keeps padding low. Rows are
    padded to a multiple of `pad_multiple` (context parallelism needs 2 x CP, sequence parallelism TP).
    """
    if token_budget <= 0:
        raise ValueError(f"micro_batch_tokens must be positive, got {token_budget}")
    ids = list(range(len(samples))) if ids is None else ids
    order = sorted(range(len(samples)), key=lambda i: (-samples[i].tokens.numel(), i))
    bins: list[list[int]] = []
    for i in order:
        n = samples[i].tokens.numel()
        for members in bins:
            longest = samples[members[0]].tokens.numel()
            if (len(members) + 1) * max(longest, n) <= token_budget:
                members.append(i)
                break
        else:
            bins.append([i])
    return [
        _collate([samples[i] for i in members], [ids[i] for i in members], pad_multiple) for members in bins
    ]


def split_for_context_parallel(mb: MicroBatch, cp_rank: int, cp_size: int) -> MicroBatch:
    """This context-parallel rank's share of `mb`, in Megatron-Core's load-balanced layout.

    The sequence [b, s] is cut into 2 x cp_size chunks of c = s / (2 cp_size) tokens; rank r keeps chunks r
    and 2 cp_size - 1 - r (so causal attention work is even), as `get_batch_on_this_cp_rank` does. Action
    rows whose hidden state falls in those chunks are kept and re-indexed into the local [b, 2c] layout;
    the others belong to other CP ranks (every action row lands on exactly one rank).
    """
    b, s = mb.tokens.shape
    if s % (2 * cp_size):
        raise ValueError(f"sequence length {s} is not a multiple of 2 x context_parallel = {2 * cp_size}")
    c = s // (2 * cp_size)
    lo, hi = cp_rank, 2 * cp_size - 1 - cp_rank

    def local(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[:, lo * c : (lo + 1) * c], t[:, hi * c : (hi + 1) * c]], dim=1).contiguous()

    row, pos = mb.rows // s, mb.rows % s
    chunk = pos // c
    keep = (chunk == lo) | (chunk == hi)
    local_pos = torch.where(chunk == lo, pos - lo * c, c + pos - hi * c)
    return MicroBatch(
        tokens=local(mb.tokens),
        position_ids=local(mb.position_ids),
        rows=(row * 2 * c + local_pos)[keep],
        targets=mb.targets[keep],
        advantages=mb.advantages[keep],
        engine_logprobs=mb.engine_logprobs[keep],
        sample_ids=mb.sample_ids,
        old_logprobs=None if mb.old_logprobs is None else mb.old_logprobs[keep],
    )


def split_for_data_parallel(samples: list[TrainSample], dp_rank: int, dp_size: int) -> list[int]:
    """Indices of `samples` this data-parallel rank trains on: a split balanced by token count.

    Deterministic (every rank computes the same split from the same batch).
    """
    loads = [0] * dp_size
    owner = [0] * len(samples)
    for i in sorted(range(len(samples)), key=lambda i: (-samples[i].tokens.numel(), i)):
        r = min(range(dp_size), key=lambda r: (loads[r], r))
        owner[i] = r
        loads[r] += samples[i].tokens.numel()
    return [i for i in range(len(samples)) if owner[i] == dp_rank]


def split_into_steps(n_samples: int, num_steps: int) -> list[range]:
    """Consecutive, near-equal slices of a batch of `n_samples`, one per optimiser step."""
    num_steps = max(1, min(num_steps, n_samples)) if n_samples else 1
    base, extra = divmod(n_samples, num_steps)
    out, start = [], 0
    for k in range(num_steps):
        size = base + (1 if k < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out

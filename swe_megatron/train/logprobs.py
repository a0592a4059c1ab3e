"""Logprobs of the sampled tokens at action positions only, vocab-parallel, chunked.

The last pipeline stage hands its final hidden states [s, b, h] to `action_logprobs` (through
GPTModel's `output_processor` hook) instead of computing [s, b, vocab] logits. We pick the rows that
predict an action token, then score them in chunks: each chunk's logits cover only this rank's
vocabulary shard ([chunk, vocab / TP]), Megatron-Core's `vocab_parallel_cross_entropy` reduces the
softmax over the TP group, and every chunk runs under activation checkpointing so its logits are
freed after the forward and rebuilt one chunk at a time in the backward. Peak extra memory is one
chunk's logits, whatever the sequence length.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint

DEFAULT_CHUNK = 1024
"""Action rows scored per chunk (memory: chunk x vocab/TP floats)."""


def _chunk_logprobs(
    rows: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, tp_group
) -> torch.Tensor:
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    logits = torch.matmul(rows, weight.t()).float()
    if tp_group is None or tp_group.size() == 1:
        # The fused cross-entropy kernel: forward and backward each pass over [chunk, vocab] about half as
        # often as `gather - logsumexp` (which builds a shifted copy and its exp, and their gradients).
        return -torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    return -vocab_parallel_cross_entropy(logits[:, None, :], targets[:, None], tp_group=tp_group)[:, 0]


def action_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    rows: torch.Tensor,
    targets: torch.Tensor,
    tp_group=None,
    sequence_parallel: bool = False,
    chunk: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """Logprob of `targets` under the model at hidden-state rows `rows`; never builds [s x vocab] logits.

    hidden: [s, b, h] final hidden states (after the final norm; [s / TP, b, h] with sequence parallel).
    weight: [vocab / TP, h] this rank's shard of the output layer. rows: [N] long, flat indices into the
    batch-major [b * s] positions (the position BEFORE each action token). targets: [N] long token ids.
    Returns [N] float32 logprobs, differentiable w.r.t. hidden and weight.
    """
    from megatron.core import tensor_parallel

    if tp_group is not None and tp_group.size() > 1:
        if sequence_parallel:
            hidden = tensor_parallel.gather_from_sequence_parallel_region(hidden, group=tp_group)
        else:
            # Every TP rank scores its vocabulary shard with the same rows; the backward sums their grads.
            hidden = tensor_parallel.copy_to_tensor_model_parallel_region(hidden, group=tp_group)
    flat = hidden.transpose(0, 1).reshape(-1, hidden.shape[-1])
    picked = flat.index_select(0, rows)
    out = []
    for start in range(0, picked.shape[0], chunk):
        part = (picked[start : start + chunk], weight, targets[start : start + chunk], tp_group)
        if torch.is_grad_enabled() and (picked.requires_grad or weight.requires_grad):
            out.append(torch.utils.checkpoint.checkpoint(_chunk_logprobs, *part, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(*part))
    if not out:
        return picked.new_zeros(0, dtype=torch.float32) + 0.0 * picked.sum()
    return torch.cat(out)


def full_logprobs_reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Plain log_softmax + gather over full logits [N, V] (for tests and the memory benchmark)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None])[:, 0]

"""transformers' teacher-forced logprobs: the reference that trainer and engine logprobs are compared with."""

from __future__ import annotations

import torch


def teacher_forced(model, ids) -> torch.Tensor:
    """fp64 logprob under `model` of every token after the first (index k holds token k+1's)."""
    ids = torch.as_tensor(ids)
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0].double()
    return torch.log_softmax(logits, -1)[:-1].gather(1, ids[1:, None])[:, 0]

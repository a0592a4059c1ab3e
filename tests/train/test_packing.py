"""Packing: token budget respected, every action token scored once at the right row."""

from __future__ import annotations

import pytest
import torch

from swe_megatron.train.packing import (
    MicroBatch,
    TrainSample,
    pack,
    split_for_context_parallel,
    split_for_data_parallel,
    split_into_steps,
)

from ._workers import batch


def test_pack_respects_budget_and_indexes_action_tokens():
    samples = batch(9)
    mbs = pack(samples, token_budget=80)
    assert sorted(i for mb in mbs for i in mb.sample_ids) == list(range(9))
    for mb in mbs:
        b, s = mb.tokens.shape
        assert b * s <= 80 or b == 1
        # the row before each action token, flattened batch-major, predicts that token
        flat = mb.tokens.reshape(-1)
        assert torch.equal(flat[mb.rows + 1], mb.targets)
    assert sum(mb.num_action_tokens for mb in mbs) == sum(x.num_action_tokens for x in samples)


def test_data_parallel_split_and_step_split_cover_the_batch_once():
    samples = batch(7)
    parts = [split_for_data_parallel(samples, r, 3) for r in range(3)]
    assert sorted(i for p in parts for i in p) == list(range(7))
    assert [len(r) for r in split_into_steps(7, 3)] == [3, 2, 2]
    assert [len(r) for r in split_into_steps(2, 8)] == [1, 1]


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_split_covers_every_action_row_once(cp):
    g = torch.Generator().manual_seed(0)
    samples = []
    for n in (13, 29, 7):
        mask = torch.rand(n, generator=g) > 0.3
        mask[0] = False
        samples.append(
            TrainSample(torch.randint(1, 50, (n,), generator=g), mask, 0.5, torch.randn(n, generator=g))
        )
    (mb,) = pack(samples, 1000, pad_multiple=2 * cp)
    assert mb.tokens.shape[1] % (2 * cp) == 0
    flat = torch.arange(mb.tokens.numel()).reshape(mb.tokens.shape)  # a "hidden state" naming its position
    seen = []
    for r in range(cp):
        part = split_for_context_parallel(
            MicroBatch(flat, mb.position_ids, mb.rows, mb.targets, mb.advantages, mb.engine_logprobs), r, cp
        )
        assert part.tokens.shape == (mb.tokens.shape[0], mb.tokens.shape[1] // cp)
        # The local row indexes the same global position the full micro-batch's row did.
        seen += part.tokens.reshape(-1)[part.rows].tolist()
        assert part.targets.numel() == part.rows.numel() == part.engine_logprobs.numel()
    assert sorted(seen) == sorted(mb.rows.tolist())

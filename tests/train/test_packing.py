"""Packing: token budget respected, every action token scored once at the right row."""

from __future__ import annotations

import torch

from swe_megatron.train.packing import pack, split_for_data_parallel, split_into_steps

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

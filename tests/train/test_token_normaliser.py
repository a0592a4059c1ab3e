"""The loss normaliser is the GLOBAL action-token count (invariant 5), checked in one process.

The DP=2 tests in test_parallel.py catch a trainer that divides by its own rank's count only under `-m dist`;
here the data-parallel reduction is made to report a second rank's tokens, so a normaliser taken from the
local count (not from the reduction) shows in the fast suite.
"""

from __future__ import annotations

from swe_megatron.config.schema import ParallelConfig
from swe_megatron.model.hf_config import model_config_from_hf
from swe_megatron.train import parallel
from swe_megatron.train.step import LossSpec, Trainer

from ._workers import OPTIM, batch, tiny_hf


def _step_loss(hf, cfg, par, other_rank_tokens: int) -> float:
    trainer = Trainer(cfg, par, OPTIM, total_steps=2, hf_state=hf.state_dict())
    reduce = trainer._sum

    def with_other_rank(values, groups):
        # The step's first reduction is the action-token count over data x context parallel ranks.
        out = reduce(values, groups)
        if groups == [trainer.dp_cp_group] and len(values) == 1:
            out = [out[0] + other_rank_tokens]
        return out

    trainer._sum = with_other_rank
    samples = batch(4)
    out = trainer.train_step(trainer._my_microbatches(samples, list(range(len(samples)))), LossSpec("sft"))
    return out["loss"], out["action_tokens"]


def test_the_step_divides_by_the_reduced_action_token_count(megatron_world):
    hf = tiny_hf()
    cfg = model_config_from_hf(hf.config)
    par = ParallelConfig(micro_batch_tokens=64)
    parallel.init_model_parallel(par, seed=1)
    alone, tokens = _step_loss(hf, cfg, par, 0)
    shared, doubled = _step_loss(hf, cfg, par, int(tokens))  # another rank holds as many action tokens
    assert doubled == 2 * tokens
    assert abs(shared - alone / 2) < 1e-6 * abs(alone), (alone, shared)

"""The LR schedule a stage passes in: warmup then constant or cosine over the stage's step budget, and a
trainer that follows the schedule it is given (no stage reaches into the trainer's settings)."""

from __future__ import annotations

import pytest
import torch

from swe_megatron.config.schema import LrSchedule, OptimConfig, ParallelConfig
from swe_megatron.train.optim import LrScheduler
from swe_megatron.train.packing import TrainSample, pack


def test_lr_schedule_warmup_then_constant_or_cosine():
    const = LrScheduler.from_optim(OptimConfig(lr=1e-6, warmup_steps=2), 10)
    assert [const.lr_at(k) for k in range(4)] == pytest.approx([5e-7, 1e-6, 1e-6, 1e-6])
    cos = LrScheduler.from_optim(
        OptimConfig(lr=5e-6, min_lr=0.0, warmup_steps=10, schedule=LrSchedule.cosine), 110
    )
    lrs = [cos.lr_at(k) for k in range(110)]
    assert lrs[0] == pytest.approx(5e-7) and lrs[9] == 5e-6 and lrs[10] == 5e-6
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[-1] == 0.0


def test_a_schedule_set_mid_stage_counts_from_its_start_step():
    late = LrScheduler(1.0, 0.0, 2, LrSchedule.cosine, 6, start_step=100)
    early = LrScheduler(1.0, 0.0, 2, LrSchedule.cosine, 6)
    assert [late.lr_at(100 + k) for k in range(6)] == [early.lr_at(k) for k in range(6)]
    assert late.lr_at(100) == 0.5 and late.lr_at(105) == 0.0


def test_a_budget_only_grows():
    cos = LrScheduler(1.0, 0.0, 0, LrSchedule.cosine, 10)
    assert cos.at_least(4).total_steps == 10 and cos.at_least(20).total_steps == 20
    assert cos.at_least(20).lr_at(10) > cos.lr_at(10)  # a longer budget decays more slowly


def test_the_trainer_follows_the_schedule_a_stage_passes_in(megatron_world):
    from swe_megatron.model.hf_config import model_config_from_hf
    from swe_megatron.train import parallel
    from swe_megatron.train.step import LossSpec, Trainer

    from ._workers import tiny_hf

    par = ParallelConfig(micro_batch_tokens=64)
    parallel.init_model_parallel(par, seed=1)
    hf = tiny_hf(seed=2)
    trainer = Trainer(
        model_config_from_hf(hf.config), par, OptimConfig(lr=1e-3, warmup_steps=0), 4, hf.state_dict()
    )
    mask = torch.ones(16, dtype=torch.bool)
    mask[0] = False
    sample = TrainSample(torch.arange(1, 17), mask)
    assert trainer.train_step(pack([sample], 64), LossSpec("sft"))["lr"] == 1e-3
    trainer.set_schedule(LrScheduler(2e-4, 2e-4, 0, LrSchedule.constant, 4))
    assert trainer.train_step(pack([sample], 64), LossSpec("sft"))["lr"] == 2e-4
    assert trainer.steps_done == 2
    # algo.staleness_lr: the factor reaches the optimiser itself, not only the report
    assert trainer.train_step(pack([sample], 64), LossSpec("sft"), lr_scale=0.5)["lr"] == 1e-4
    assert {g["lr"] / g.get("lr_mult", 1.0) for g in trainer.optimizer.param_groups} == {1e-4}
    steps = trainer.update([sample, sample], 2, LossSpec("sft"), lr_scale=0.25)
    assert [m["lr"] for m in steps] == [5e-5, 5e-5]

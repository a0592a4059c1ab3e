"""The optimiser and its learning-rate schedule: Megatron's Adam over the DDP-wrapped policy, and the
schedule a stage passes in (its LR settings and step budget)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from swe_megatron.config.schema import LrSchedule, OptimConfig, ParallelConfig


@dataclass(frozen=True)
class LrScheduler:
    """Learning rate per optimiser step: linear warmup to `lr`, then constant or cosine down to `min_lr`."""

    lr: float
    """Peak learning rate."""
    min_lr: float
    """Cosine floor, reached at step total_steps - 1."""
    warmup_steps: int
    """Linear warmup steps (step k of the warmup uses lr * (k + 1) / warmup_steps: no step at lr 0)."""
    schedule: LrSchedule
    """constant or cosine after the warmup."""
    total_steps: int
    """The stage's step budget, from start_step: the cosine's length."""
    start_step: int = 0
    """The trainer's step count when the schedule starts: lr_at counts warmup and cosine from there (a schedule
    set in the middle of a stage, such as the warm start's anneal)."""

    @classmethod
    def from_optim(cls, optim: OptimConfig, total_steps: int) -> LrScheduler:
        """The schedule of a stage's optimiser settings over `total_steps` optimiser steps."""
        return cls(optim.lr, optim.min_lr, optim.warmup_steps, LrSchedule(optim.schedule), total_steps)

    def at_least(self, total_steps: int) -> LrScheduler:
        """The same schedule with a budget of at least `total_steps` (a budget never shrinks mid-stage)."""
        return dataclasses.replace(self, total_steps=max(self.total_steps, total_steps))

    def lr_at(self, step: int) -> float:
        """Learning rate of optimiser step `step` (0-based, counted by the trainer)."""
        step -= self.start_step
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.schedule == LrSchedule.constant:
            return self.lr
        span = max(self.total_steps - self.warmup_steps - 1, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * progress))


def build_optimizer(model, optim: OptimConfig, parallel: ParallelConfig):
    """Megatron's Adam (distributed when parallel.use_distributed_optimizer) over the DDP-wrapped `model`."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    dtype = model.module.config.params_dtype
    return get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=optim.lr,
            min_lr=optim.min_lr,
            weight_decay=optim.weight_decay,
            adam_beta1=optim.betas[0],
            adam_beta2=optim.betas[1],
            adam_eps=optim.eps,
            clip_grad=optim.grad_clip,
            bf16=dtype == torch.bfloat16,
            params_dtype=dtype,
            use_distributed_optimizer=parallel.use_distributed_optimizer,
        ),
        [model],
    )

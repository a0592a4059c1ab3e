"""The learning algorithm as pure functions: rewards, advantages, dynamic sampling, losses, RFT, curriculum.

Everything here takes tensors or plain data and returns them; nothing knows about parallelism (the
trainer passes global token counts in) or reads the config tree (the `from_config` helpers map it).
"""

from swe_megatron.algo.advantages import group_advantages
from swe_megatron.algo.curriculum import (
    RefreshReport,
    RefreshRule,
    TaskPool,
    TaskStats,
    outcomes,
    refresh_pool,
)
from swe_megatron.algo.dapo_batch import DapoBatch, DapoOptions, build_dapo_batch
from swe_megatron.algo.dynamic_sampling import DynamicSamplingReport, dynamic_sampling, tasks_to_sample
from swe_megatron.algo.losses import dapo_loss, sft_loss, token_entropy, token_logprobs
from swe_megatron.algo.metrics import mean_pass_at_k, mean_sem, pass_at_k, pass_rate_per_run
from swe_megatron.algo.optimizer_steps import num_optimizer_steps, split_optimizer_steps
from swe_megatron.algo.rewards import final_reward, length_penalty
from swe_megatron.algo.rft import RftReport, rft_select

__all__ = [
    "DapoBatch",
    "DapoOptions",
    "DynamicSamplingReport",
    "RefreshReport",
    "RefreshRule",
    "RftReport",
    "TaskPool",
    "TaskStats",
    "build_dapo_batch",
    "dapo_loss",
    "dynamic_sampling",
    "final_reward",
    "group_advantages",
    "length_penalty",
    "mean_pass_at_k",
    "mean_sem",
    "num_optimizer_steps",
    "outcomes",
    "pass_at_k",
    "pass_rate_per_run",
    "refresh_pool",
    "rft_select",
    "sft_loss",
    "split_optimizer_steps",
    "tasks_to_sample",
    "token_entropy",
    "token_logprobs",
]

"""The trainer's update: DAPO or SFT optimiser steps on Megatron-Core over any TP x PP x DP layout.

One `update(samples, ...)` call is one iteration's training: old logprobs from the trainer's own
forward pass before any change (engine logprobs kept beside them for the mismatch metric and the
off-policy weights of `algo.off_policy`, computed once per iteration), then the
batch split into `num_steps` optimiser steps; each step shares its trajectories out over the
data-parallel ranks, packs them into micro-batches under `ParallelConfig.micro_batch_tokens`, and
runs Megatron's `get_forward_backward_func()` with a `forward_step` that returns (output, loss_fn).

Every loss is a sum over action tokens divided by the step's GLOBAL action-token count (all-reduced
over data parallel), Megatron computes "per-token" losses (no division by the number of
micro-batches) and DDP sums gradients over ranks, so loss and gradient do not depend on the
micro-batch size, the number of DP ranks or the TP/PP layout (design.md invariant 5).

Every rank of the trainer calls the same methods with the same full batch (rank 0 of the iteration
loop broadcasts it); metrics come back on every rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from swe_megatron.algo.losses import dapo_loss, sft_loss
from swe_megatron.algo.off_policy import off_policy_weights
from swe_megatron.config.schema import ModelConfig, OffPolicyConfig, OptimConfig, ParallelConfig
from swe_megatron.train.checkpoint import CheckpointManager
from swe_megatron.train.export import ExportReport, export_hf
from swe_megatron.train.logprobs import action_logprobs
from swe_megatron.train.model import build_policy
from swe_megatron.train.optim import LrScheduler, build_optimizer
from swe_megatron.train.packing import (
    MicroBatch,
    TrainSample,
    pack,
    split_for_context_parallel,
    split_for_data_parallel,
    split_into_steps,
)

if TYPE_CHECKING:  # Megatron is imported where it runs, after parallel.py set up the ranks and CPU shims
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import MegatronOptimizer


@dataclass
class LossSpec:
    """Which loss an update uses: "dapo" with its clip range, or "sft"."""

    kind: str = "dapo"
    """dapo (clipped ratio with advantages) or sft (negative log-likelihood)."""
    eps_low: float = 0.2
    """DAPO lower clip."""
    eps_high: float = 0.3
    """DAPO upper clip."""
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    """Off-policy correction against the engine's logprobs (algo.off_policy; DAPO only, off by default)."""


class Trainer:
    """The packed DAPO/SFT step over a Megatron-Core policy, for this rank's part of the layout.

    Its parts, each from its own builder: the DDP-wrapped policy (`model.build_policy`: model build + HF
    load), the optimiser and LR schedule (`optim.py`), checkpoints (`checkpoint.CheckpointManager`) and the
    HF export (`export.export_hf`). A stage passes its optimiser settings and step budget in: `optim_cfg`
    and `total_steps` here, `set_schedule` later.

    hf_state: HF-named weights to start from (see `build_policy`). wait_group: the process group in which
    ranks wait while a few of them do slow work (export writers, rank 0's engine reloads): the driver's gloo
    group with parallel.driver_timeout_s (pipeline/spmd.py World.group), not the default group with its
    collective timeout (on GPUs, NCCL's watchdog); None: the default group.
    """

    model: DistributedDataParallel
    """This rank's stage of the policy."""
    optimizer: MegatronOptimizer
    """Adam over `model` (Megatron's, distributed or not)."""
    schedule: LrScheduler
    """The learning rate of each optimiser step."""
    checkpoint: CheckpointManager
    """Saves and restores `model` and `optimizer`."""
    steps_done: int
    """Optimiser steps taken (the schedule's position)."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        parallel_cfg: ParallelConfig,
        optim_cfg: OptimConfig,
        total_steps: int,
        hf_state: Mapping[str, torch.Tensor] | None = None,
        wait_group=None,
        initialize: bool = True,
    ):
        from megatron.core import parallel_state as ps

        self.model_cfg, self.parallel_cfg, self.wait_group = model_cfg, parallel_cfg, wait_group
        self.first_stage, self.last_stage = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
        self.tp_group, self.dp_group, self.pp_group = (
            ps.get_tensor_model_parallel_group(),
            ps.get_data_parallel_group(),
            ps.get_pipeline_model_parallel_group(),
        )
        # Context-parallel ranks hold parts of the same trajectories: token counts and metric sums run over
        # data x context parallel (as Megatron's DDP does for gradients); the batch split over DP only.
        self.cp_rank, self.cp_size = ps.get_context_parallel_rank(), ps.get_context_parallel_world_size()
        self.dp_cp_group = ps.get_data_parallel_group(with_context_parallel=True)
        # Batches and metric reductions live where the model does (NCCL reduces only CUDA tensors).
        on_gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        self.model = build_policy(model_cfg, parallel_cfg, hf_state, initialize)
        self.optimizer = build_optimizer(self.model, optim_cfg, parallel_cfg)
        self.schedule = LrScheduler.from_optim(optim_cfg, total_steps)
        self.checkpoint = CheckpointManager(self.model, self.optimizer, wait_group)
        self.steps_done = 0

    def set_schedule(self, schedule: LrScheduler) -> None:
        """Follow `schedule` from the next optimiser step on (a stage's own LR settings, a longer budget)."""
        self.schedule = schedule

    # --- forward pieces -------------------------------------------------------------------------
    def _forward_step(self, loss_fn, data_iterator, model):
        mb: MicroBatch = next(data_iterator)
        sp = self.parallel_cfg.sequence_parallel

        def to_logprobs(hidden_states, output_weight, output_layer, **_):
            weight = output_weight if output_weight is not None else output_layer.weight
            return action_logprobs(hidden_states, weight, mb.rows, mb.targets, self.tp_group, sp)

        out = model(mb.tokens, mb.position_ids, None, output_processor=to_logprobs)
        return out, partial(loss_fn, mb)

    def _run(self, microbatches: list[MicroBatch], loss_fn, forward_only: bool) -> list[dict]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if not microbatches:
            return []
        return get_forward_backward_func()(
            forward_step_func=partial(self._forward_step, loss_fn),
            data_iterator=iter(microbatches),
            model=self.model,
            num_microbatches=len(microbatches),
            # Megatron divides by CP itself when it sizes pipeline messages: pass the full length.
            seq_length=max(mb.tokens.shape[1] for mb in microbatches) * self.cp_size,
            micro_batch_size=max(mb.tokens.shape[0] for mb in microbatches),
            forward_only=forward_only,
        )

    def _my_microbatches(self, samples: list[TrainSample], ids: list[int]) -> list[MicroBatch]:
        mine = split_for_data_parallel([samples[i] for i in ids], *self._dp())
        chosen = [ids[i] for i in mine]
        par = self.parallel_cfg
        multiple = (2 * self.cp_size if self.cp_size > 1 else 1) * (
            par.tensor_parallel if par.sequence_parallel else 1
        )
        if chosen:
            mbs = pack([samples[i] for i in chosen], par.micro_batch_tokens, chosen, multiple)
        else:
            # No sample for this rank in this step: it still runs forward/backward (and so joins the
            # gradient reduction and the pipeline's messages) on padding that holds no action token, which
            # adds nothing to the loss or the gradients (the loss is normalised by the global token count).
            empty = TrainSample(
                torch.zeros(multiple, dtype=torch.long), torch.zeros(multiple, dtype=torch.bool)
            )
            mbs = pack([empty], par.micro_batch_tokens, None, multiple)
            mbs[0].sample_ids = []
        if self.cp_size > 1:
            mbs = [split_for_context_parallel(mb, self.cp_rank, self.cp_size) for mb in mbs]
        return [mb.to(self.device) for mb in mbs]

    def _dp(self) -> tuple[int, int]:
        return dist.get_rank(self.dp_group), dist.get_world_size(self.dp_group)

    def _sum(self, values: list[float], groups) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        for g in groups:
            dist.all_reduce(t, group=g)
        return t.tolist()

    # --- public API ---------------------------------------------------------------------------
    @torch.no_grad()
    def logprobs(self, microbatches: list[MicroBatch]) -> None:
        """Fill `old_logprobs` of each micro-batch (last pipeline stage) from a forward pass of the current weights."""

        def keep(mb, logprobs):
            mb.old_logprobs = logprobs.detach().float()
            return logprobs.sum() * 0.0, torch.tensor(0, device=logprobs.device), {}

        self.model.eval()
        self._run(microbatches, keep, forward_only=True)
        self.model.train()

    def sample_logprobs(self, samples: list[TrainSample]) -> list[torch.Tensor]:
        """Each sample's action-token logprobs under the current weights ([A_i] float on CPU), one forward pass per
        sample. A world of one rank only (tools and tests: no data or pipeline split to gather)."""
        if dist.get_world_size() != 1:
            raise RuntimeError("Trainer.sample_logprobs: a world of one rank only")
        out = []
        for i in range(len(samples)):
            mbs = self._my_microbatches(samples, [i])
            self.logprobs(mbs)
            out.append(torch.cat([mb.old_logprobs.cpu() for mb in mbs]))
        return out

    def train_step(
        self,
        microbatches: list[MicroBatch],
        loss: LossSpec,
        is_weights: list[torch.Tensor] | None = None,
        lr_scale: float = 1.0,
    ) -> dict[str, float]:
        """One optimiser step over this rank's micro-batches (old_logprobs must be set for DAPO).

        is_weights: per micro-batch, the DAPO loss's per-token off-policy weights (`off_policy`); None: none.
        lr_scale: multiplies the schedule's lr for this step (algo.staleness_lr); reported lr is the one used.
        """
        weight_of = {id(mb): w for mb, w in zip(microbatches, is_weights or [])}
        local_tokens = sum(mb.num_action_tokens for mb in microbatches)
        (global_tokens,) = self._sum([local_tokens], [self.dp_cp_group])
        denom = torch.tensor(max(global_tokens, 1.0), dtype=torch.float64, device=self.device)

        def loss_fn(mb, logprobs):
            mask = torch.ones_like(mb.targets, dtype=torch.bool)
            if loss.kind == "dapo":
                value, metrics = dapo_loss(
                    logprobs, mb.old_logprobs, mb.advantages, mask, loss.eps_low, loss.eps_high, denom,
                    is_weights=weight_of.get(id(mb)),
                )  # fmt: skip
                stats = {k: metrics[k] for k in ("clip_frac_low", "clip_frac_high", "approx_kl")}
            else:
                value, _ = sft_loss(logprobs, mask, denom)
                stats = {"nll": -logprobs.detach().double().sum() / max(mb.num_action_tokens, 1)}
            value = value.float()
            n = mb.num_action_tokens
            report = {"loss": value.detach().double()} | {k: v.double() * n for k, v in stats.items()}
            return value, torch.tensor(n, device=value.device), report

        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        reports = self._run(microbatches, loss_fn, forward_only=False)
        lr = self.schedule.lr_at(self.steps_done) * lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
        ok, grad_norm, _ = self.optimizer.step()
        self.steps_done += 1
        keys = ("loss", "clip_frac_low", "clip_frac_high", "approx_kl", "nll")
        sums = [sum(float(r[k]) for r in reports if k in r) for k in keys]
        totals = self._sum(sums, [self.dp_cp_group, self.pp_group])
        out = {"loss": totals[0], "action_tokens": global_tokens}
        for k, v in zip(keys[1:], totals[1:]):
            if (loss.kind == "dapo") == (k != "nll"):
                out[k] = v / max(global_tokens, 1.0)
        out["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
        out["lr"] = lr
        out["update_ok"] = float(bool(ok))
        return out

    def update(
        self, samples: list[TrainSample], num_steps: int, loss: LossSpec, lr_scale: float = 1.0
    ) -> list[dict[str, float]]:
        """One iteration: old logprobs first, then `num_steps` optimiser steps over `samples` at the schedule's lr
        times lr_scale (algo.staleness_lr). Metrics per step."""
        steps = [self._my_microbatches(samples, list(r)) for r in split_into_steps(len(samples), num_steps)]
        mismatch, weights = None, None
        if loss.kind == "dapo":
            for mbs in steps:
                self.logprobs(mbs)
            mismatch = self.mismatch([mb for mbs in steps for mb in mbs])
            off = loss.off_policy
            if off.tis_cap is not None or off.mask_threshold is not None:
                all_weights, stats = self.off_policy([mb for mbs in steps for mb in mbs], off)
                mismatch |= stats
                weights = iter(all_weights)
        out = []
        for mbs in steps:
            metrics = self.train_step(
                mbs, loss, None if weights is None else [next(weights) for _ in mbs], lr_scale
            )
            if mismatch is not None:
                metrics.update(mismatch)
            out.append(metrics)
        return out

    def mismatch(self, microbatches: list[MicroBatch]) -> dict[str, float]:
        """Engine-vs-trainer logprob mismatch over action tokens with engine logprobs (invariant 3)."""
        abs_sum, count, k3, worst = 0.0, 0.0, 0.0, 0.0
        if self.last_stage:
            for mb in microbatches:
                known = ~torch.isnan(mb.engine_logprobs)
                if mb.old_logprobs is None or not bool(known.any()):
                    continue
                d = (mb.old_logprobs[known] - mb.engine_logprobs[known]).double()
                abs_sum += float(d.abs().sum())
                count += float(known.sum())
                # k3 estimate of KL(engine || trainer) under engine samples: exp(-d) - 1 + d, d = trainer - engine.
                k3 += float((torch.exp(d) - 1 - d).sum())
                worst = max(worst, float(d.abs().max()))
        abs_sum, count, k3 = self._sum([abs_sum, count, k3], [self.dp_cp_group, self.pp_group])
        w = torch.tensor([worst], dtype=torch.float64, device=self.device)
        dist.all_reduce(w, op=dist.ReduceOp.MAX)
        n = max(count, 1.0)
        return {
            "logprob_mismatch_abs_mean": abs_sum / n,
            "logprob_mismatch_abs_max": float(w),
            "logprob_kl_k3": k3 / n,
        }

    def off_policy(
        self, microbatches: list[MicroBatch], off: OffPolicyConfig
    ) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Per micro-batch DAPO weights of `algo.off_policy` (None off the last pipeline stage), and the iteration's
        metrics: is_weight_mean / is_weight_max / is_clipped_frac over action tokens with engine logprobs (with
        tis_cap), masked_trajectories and masked_trajectories_frac (with mask_threshold)."""
        from megatron.core import parallel_state as ps

        cp_group = ps.get_context_parallel_group() if self.cp_size > 1 else None
        keys = ("is_weight_sum", "is_tokens", "is_clipped_tokens", "masked_trajectories", "trajectories")
        weights, sums, worst = [], dict.fromkeys(keys, 0.0), 0.0
        for mb in microbatches:
            if not self.last_stage:
                weights.append(None)
                continue
            w, m = off_policy_weights(
                mb.old_logprobs, mb.engine_logprobs, torch.ones_like(mb.targets, dtype=torch.bool),
                off.tis_cap, off.mask_threshold,
                segments=mb.rows // mb.tokens.shape[1],  # the row (trajectory) of each action token
                num_segments=mb.tokens.shape[0],
                reduce_segments=None if cp_group is None else partial(dist.all_reduce, group=cp_group),
            )  # fmt: skip
            weights.append(w)
            for k in keys:
                # After the CP reduction every CP rank knows whole trajectories: count them on one.
                skip = k in ("masked_trajectories", "trajectories") and self.cp_rank > 0
                sums[k] += 0.0 if skip or k not in m else float(m[k])
            worst = max(worst, float(m.get("is_weight_max", 0.0)))
        totals = dict(zip(keys, self._sum(list(sums.values()), [self.dp_cp_group, self.pp_group])))
        w = torch.tensor([worst], dtype=torch.float64, device=self.device)
        dist.all_reduce(w, op=dist.ReduceOp.MAX)
        out = {}
        if off.tis_cap is not None:
            n = max(totals["is_tokens"], 1.0)
            out |= {
                "is_weight_mean": totals["is_weight_sum"] / n,
                "is_weight_max": float(w),
                "is_clipped_frac": totals["is_clipped_tokens"] / n,
            }
        if off.mask_threshold is not None:
            out["masked_trajectories"] = totals["masked_trajectories"]
            out["masked_trajectories_frac"] = totals["masked_trajectories"] / max(totals["trajectories"], 1.0)
        return weights, out

    def export(self, out: str, extra_files=(), name_tied_lm_head: bool = False) -> ExportReport:
        """Write the current weights as a sharded HF safetensors folder (all ranks call it); an ExportReport.

        name_tied_lm_head: also name a tied LM head (needed by vLLM's in-place reload; see export_hf).
        """
        return export_hf(
            self.model.module,
            self.model_cfg,
            out,
            self.tp_group,
            self.pp_group,
            self.dp_cp_group,  # one writer per model replica, also with context parallelism
            extra_files=extra_files,
            name_tied_lm_head=name_tied_lm_head,
            wait_group=self.wait_group,
        )

    def save(self, path: str) -> None:
        """Save model, optimiser and step count (see CheckpointManager.save); all ranks call it."""
        self.checkpoint.save(path, self.steps_done)

    def load(self, path: str) -> None:
        """Restore a checkpoint written by `save`, whatever layout it was saved from."""
        self.steps_done = self.checkpoint.load(path)

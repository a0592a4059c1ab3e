"""One unit of work per function: the initial policy, the warm start, an RFT iteration, a DAPO iteration.

Every unit follows design.md's iteration: sample tasks -> rollouts (tasks x G, graded in the sandbox) ->
batch -> trainer update -> export + weight sync -> pool record -> monitor -> checkpoint -> commit. A unit
already committed in the run directory is skipped; an uncommitted one starts from scratch (run_dir.py).

Every trainer rank runs every unit (pipeline/spmd.py): rank 0 alone rolls out and builds the `Batch`
(`ctx.world.lead`), every rank trains on it, exports and saves, then rank 0 records, logs and commits
(`_commit`), and every rank leaves the unit with the committed state.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from swe_megatron.algo import (
    DapoOptions,
    RefreshRule,
    TaskPool,
    build_dapo_batch,
    num_optimizer_steps,
    outcomes,
    rft_select,
    split_optimizer_steps,
    tasks_to_sample,
)
from swe_megatron.algo.staleness import split_stale, staleness, staleness_lr_scale, staleness_metrics
from swe_megatron.config.schema import LrSchedule, RunConfig
from swe_megatron.engine.gate import VersionGate
from swe_megatron.engine.scripted import ScriptedPolicy, turn_fits
from swe_megatron.monitor import KEY_GROUP, Monitor, key_curves, sample_text
from swe_megatron.monitor.console import UnitClock
from swe_megatron.pipeline.ahead import Ahead
from swe_megatron.pipeline.eval import evaluate, model_name
from swe_megatron.pipeline.metrics import rollout_metrics, train_metrics
from swe_megatron.pipeline.rollout_process import RolloutProcess
from swe_megatron.pipeline.run_dir import RunDir
from swe_megatron.pipeline.spmd import World
from swe_megatron.pipeline.topology import NullTopology, Topology
from swe_megatron.pipeline.warm_start import scripts, sft_data
from swe_megatron.rollout.command import render_trajectory
from swe_megatron.rollout.setup import Rollouts
from swe_megatron.tasks.schema import Task
from swe_megatron.train.hf_convert import HFCheckpoint
from swe_megatron.train.optim import LrScheduler
from swe_megatron.train.packing import TrainSample
from swe_megatron.train.step import LossSpec, Trainer
from swe_megatron.train.weight_sync import FileWeightSync, WeightSync
from swe_megatron.trajectory import Trajectory


@dataclass
class Context:
    """What every unit needs: config, run directory, topology, monitor, tasks, the live trainer, the ranks.

    On ranks other than 0, topo and monitor are stand-ins, train_tasks is empty and `run.state` is rank 0's.
    """

    cfg: RunConfig
    """The run's config (an OmegaConf structured config at run time)."""
    run: RunDir
    """The run directory: committed units, checkpoints, logs."""
    topo: Topology | NullTopology
    """Servers and engines (a stand-in off rank 0)."""
    monitor: Monitor
    """TensorBoard (NullMonitor off rank 0)."""
    train_tasks: dict[str, Task]
    """Training tasks by id (empty off rank 0)."""
    tokenizer_files: list[Path]
    """Tokenizer files copied into every HF export."""
    trainer: Trainer | None = None
    """The live trainer, if one is built."""
    trainer_stage: str | None = None
    """The stage `trainer` belongs to (None: the init policy or a finished warm start)."""
    pool: TaskPool | None = field(default=None)
    """The live task pool."""
    world: World = field(default_factory=World)
    """The trainer ranks."""
    weight_sync: WeightSync = field(default_factory=FileWeightSync)
    """How updates reach the engines (pipeline_method(engine.weight_sync).for_run, built at run start)."""
    rollouts: Rollouts | None = None
    """The run's rollout entry point (rank 0, once the servers run)."""
    gate: VersionGate = field(default_factory=VersionGate)
    """The run's engine behind the gate weight updates close (engine/gate.py; rank 0's serves the engines)."""
    ahead: Ahead = field(default_factory=Ahead)
    """Rollouts of later RL iterations while the trainer updates (algo.max_staleness >= 1; rank 0)."""
    clock: UnitClock = field(default_factory=UnitClock)
    """Times the committed units for the console line of each (rank 0)."""

    @property
    def hf_dir(self) -> str:
        """The HF export of the last committed checkpoint (what the engines serve)."""
        return str(self.run.root / self.run.checkpoint["path"] / "hf")


# --- trainer and checkpoints ---------------------------------------------------------------------------
def _new_trainer(
    ctx: Context, stage_name: str, total_steps: int, from_hf: str | None, initialize: bool = True
):
    """A Trainer for stage_name: from the HF folder from_hf (read tensor by tensor, as this rank needs them),
    else randomly initialised, or with initialize=False not initialised (a checkpoint is loaded next)."""
    stage = getattr(ctx.cfg, stage_name) if stage_name != "init" else ctx.cfg.rft
    hf_state = HFCheckpoint(from_hf) if from_hf is not None else None
    return Trainer(ctx.cfg.model, ctx.cfg.parallel, stage.optim, max(total_steps, 1), hf_state=hf_state,
                   wait_group=ctx.world.group, initialize=initialize)  # fmt: skip


def trainer_for(ctx: Context, stage_name: str, total_steps: int):
    """The trainer of a stage: kept while the stage runs, resumed from its checkpoint (weights + optimiser)
    after a restart, or started with a fresh optimiser from the previous stage's weights. The previous
    trainer (model, optimiser, DDP buffers) is freed first: at scale two do not fit at once."""
    if ctx.trainer is not None and ctx.trainer_stage == stage_name:
        return ctx.trainer
    if ctx.trainer is not None:
        ctx.trainer = None
        gc.collect()  # a trainer holds reference cycles (its model config points back at the DDP wrapper)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    ckpt = ctx.run.checkpoint
    if ckpt and ckpt.get("stage") == stage_name:
        ctx.trainer = _new_trainer(ctx, stage_name, total_steps, None, initialize=False)
        ctx.trainer.load(str(ctx.run.root / ckpt["path"] / "dist"))
    else:
        ctx.trainer = _new_trainer(ctx, stage_name, total_steps, ctx.hf_dir)
    ctx.trainer_stage = stage_name
    return ctx.trainer


def initial_policy(ctx: Context) -> None:
    """Unit "init": the starting weights (cfg.model.hf_path, or a seeded random init) as checkpoint 0."""
    if ctx.run.is_done("init"):
        return
    ckpt = ctx.world.lead(ctx.run.checkpoint_dir, "init")
    # Kept in ctx (for no stage) so that the first stage's trainer_for frees it before building its own.
    ctx.trainer, ctx.trainer_stage = _new_trainer(ctx, "init", 1, ctx.cfg.model.hf_path), None
    ctx.trainer.export(str(ckpt / "hf"), extra_files=ctx.tokenizer_files)
    _commit(ctx, "init", {"unit": "init", "path": "checkpoints/init", "stage": None}, train_step=False)


def _commit(ctx: Context, unit: str, ckpt: dict | None, finish=None, train_step: bool = True) -> None:
    """Rank 0 runs finish() (pool record, metrics, logs) and commits; every rank leaves with the committed state
    (so all ranks agree on which units are done; the broadcast is also the barrier after the unit)."""

    def commit() -> dict:
        if ckpt is not None:  # the unit's weight sync (SyncReport.metrics)
            sync = {k.split("/", 1)[1]: v for k, v in ckpt.items() if k.startswith("weight_sync/")}
            ctx.monitor.scalars("weight_sync", sync, ctx.run.step)
        if finish is not None:
            finish()
        ctx.run.commit(unit, ckpt, train_step=train_step)
        print(ctx.clock.line(unit, ctx.run.unit_metrics(unit)), flush=True)
        return ctx.run.state

    ctx.run.state = ctx.world.lead(commit)


def _checkpoint_and_sync(ctx: Context, unit: str, stage_name: str, timings: dict) -> dict:
    """Bring the engines to the new weights, write the unit's checkpoint (its HF export, which resume, the next
    stage's trainer and engines started later use, and the trainer state)."""
    ckpt = ctx.world.lead(ctx.run.checkpoint_dir, unit)  # rank 0 wipes a leftover before anyone writes
    sync, hf = ctx.weight_sync, str(ckpt / "hf")
    t = time.perf_counter()
    # Rank 0 waits for the turns in flight (rollouts ahead) and holds new ones back; the other ranks wait in the
    # driver group (its timeout is long enough for a whole episode with agent.partial_rollouts=false).
    ctx.world.lead(ctx.ahead.pause)
    try:
        report = sync.sync(ctx.trainer, ctx.topo.engine, hf if sync.reads_export else None)
    except BaseException:
        ctx.ahead.resume(None)
        raise
    ctx.ahead.resume(ctx.run.step + 1)  # the version the commit will give these weights
    timings["weight_sync_s"] = time.perf_counter() - t
    t = time.perf_counter()
    # With broadcast the engines never read this export: it is the checkpoint's alone.
    if not sync.reads_export:
        ctx.trainer.export(hf, extra_files=ctx.tokenizer_files, name_tied_lm_head=True)
    ctx.trainer.save(str(ckpt / "dist"))
    timings["checkpoint_s"] = time.perf_counter() - t
    return {
        "unit": unit,
        "path": str(ckpt.relative_to(ctx.run.root)),
        "stage": stage_name,
        **report.metrics(),
    }


# --- samples -------------------------------------------------------------------------------------------
def to_samples(trajs: list[Trajectory], masks: list[list[int]], advantages: list[float]):
    """Trajectories -> TrainSamples: the engine's tokens, the loss mask, the advantage, engine logprobs."""
    out = []
    for t, m, a in zip(trajs, masks, advantages):
        mask = torch.tensor(m, dtype=torch.bool)
        mask[0] = False
        lp = torch.tensor(t.logprobs, dtype=torch.float32)
        lp[~mask] = float("nan")
        out.append(TrainSample(torch.tensor(t.token_ids, dtype=torch.long), mask, float(a), lp))
    return out


def sft_epoch(trainer: Trainer, stage, samples: list[TrainSample], seed: int) -> list[dict]:
    """One pass over samples, split into optimiser steps of at most stage.batch_size (order seeded); metrics per
    step."""
    steps = split_optimizer_steps(list(range(len(samples))), stage.batch_size, stage.min_optimizer_steps,
                                  stage.max_optimizer_steps, seed=seed)  # fmt: skip
    return [m for step in steps for m in trainer.update([samples[i] for i in step], 1, LossSpec("sft"))]


def _sft_steps(ctx: Context, stage, samples, epochs: int, seed: int) -> list[dict]:
    """`epochs` passes over samples (sft_epoch), epoch e seeded with seed + e."""
    return [m for e in range(epochs) for m in sft_epoch(ctx.trainer, stage, samples, seed + e)]


def epoch_loss(steps: list[dict[str, float]]) -> float:
    """Mean loss per action token over an epoch's optimiser steps (each step's loss is its per-token mean)."""
    tokens = sum(s["action_tokens"] for s in steps)
    return sum(s["loss"] * s["action_tokens"] for s in steps) / tokens if tokens else float("nan")


def warm_start_sft(trainer: Trainer, stage, samples: list[TrainSample], seed: int,
                   say: Callable[[str], None] | None = None) -> tuple[list[dict], list[float]]:  # fmt: skip
    """The warm start's SFT: epochs over the scripted demonstrations until an epoch's mean loss per action token is
    at most `stage.warm_start_loss_target`, at most `stage.warm_start_epochs` of them (a fixed count converged for
    some seeds and not for others: issue 38), then `stage.warm_start_anneal_epochs` more with the lr falling to 0
    along a cosine. Epoch e is seeded seed + e. Every rank takes the same decision: the loss is reduced over the
    ranks. `say`: progress lines (rank 0). Returns (metrics per step, loss per epoch, the anneal's included)."""
    lr = stage.warm_start_lr or stage.optim.lr
    if stage.warm_start_lr > 0:  # its own constant lr (RFT proper then starts a fresh optimiser and schedule)
        trainer.set_schedule(LrScheduler(lr, lr, 0, LrSchedule.constant, trainer.schedule.total_steps))
    target, most = stage.warm_start_loss_target, stage.warm_start_epochs
    steps, losses, shown = [], [], time.monotonic()
    for e in range(most):
        done = sft_epoch(trainer, stage, samples, seed + e)
        steps += done
        losses.append(epoch_loss(done))
        reached = losses[-1] <= target
        if say and (reached or e + 1 == most or time.monotonic() - shown >= WARM_START_REPORT_S):
            shown = time.monotonic()
            say(f"epoch {e + 1}/{most}, loss {losses[-1]:.4f} (target {target:g})")
        if reached:
            break
    if say and target > 0 and losses and losses[-1] > target:
        say(f"WARNING: the loss {losses[-1]:.4f} is above rft.warm_start_loss_target={target:g} after {most} epochs: "
            "the warm-started policy may not act well; raise rft.warm_start_epochs")  # fmt: skip
    anneal, first = stage.warm_start_anneal_epochs, len(losses)
    if anneal and losses:
        # One more step than the anneal takes, so its last step still moves (the cosine reaches 0 at total - 1).
        per_epoch = len(steps) // first
        trainer.set_schedule(LrScheduler(lr, 0.0, 0, LrSchedule.cosine, anneal * per_epoch + 1, trainer.steps_done))
        for e in range(first, first + anneal):
            done = sft_epoch(trainer, stage, samples, seed + e)
            steps += done
            losses.append(epoch_loss(done))
        if say:
            say(f"anneal: {anneal} epochs to lr 0, loss {losses[first - 1]:.4f} -> {losses[-1]:.4f}")
    return steps, losses


def _log(ctx: Context, unit: str, trajs, metrics: dict[str, dict], unit_dir: Path) -> None:
    """The unit's metrics to TensorBoard (async/* only when async is on; the key curves again under 0_key/<stage>/;
    a text marker where a stage begins), sample trajectories as text, and to the unit's metrics.json."""
    step, (stage, it) = ctx.run.step, unit.split(":")
    stage = "warm_start" if it == "warm_start" else stage
    shown = {g: v for g, v in metrics.items() if g != "async" or ctx.cfg.algo.max_staleness >= 1}
    for group, values in shown.items():
        ctx.monitor.scalars(group, values, step)
    ctx.monitor.scalars(f"{KEY_GROUP}/{stage}", key_curves(shown), step)
    if it in ("0", "warm_start"):
        ctx.monitor.text("stages", f"**{stage}** begins at iteration {step} (unit {unit})", step)
    ctx.monitor.histogram("episode/steps_hist", [t.num_steps for t in trajs], step)
    ctx.monitor.histogram("episode/tokens_hist", [len(t.token_ids) for t in trajs], step)
    picks = sorted(trajs, key=lambda t: (not t.resolved, t.task_id, t.sample_index))
    for i, t in enumerate(picks[: ctx.cfg.monitor.sample_trajectories]):
        ctx.monitor.text(f"samples/{i}", sample_text(unit, render_trajectory(t)), step)
    ctx.monitor.flush()
    (unit_dir / "metrics.json").write_text(json.dumps(metrics, indent=1, default=float))


def _rollouts(ctx: Context, stage, tasks: list[Task], samples: int, unit_dir: Path, engine=None):
    """tasks x samples episodes at the stage's limits through the run's Rollouts; (trajectories, timings)."""
    r = ctx.rollouts
    trajs, stats = r.run(tasks, samples, r.limits(stage), unit_dir, engine)
    return trajs, stats.time_split()


def _pool(ctx: Context, stage_name: str) -> TaskPool:
    if ctx.pool is None:
        ctx.pool = ctx.run.open_pool(sorted(ctx.train_tasks), ctx.cfg.seed)
    ctx.pool.start_stage(stage_name, RefreshRule.from_stage_config(getattr(ctx.cfg, stage_name)))
    ctx.run.save_pool(ctx.pool)
    return ctx.pool


def _sample(ctx: Context, pool: TaskPool, n: int, it: int) -> list[Task]:
    """n tasks of the pool for iteration it (the pool saved before anything is rolled out)."""
    ids = pool.sample(n, it)
    ctx.run.save_pool(pool)
    return [ctx.train_tasks[k] for k in ids]


def _record(ctx: Context, it: int, trajs: list[Trajectory]) -> None:
    """The iteration's model outcomes into the pool's history (saved; the commit snapshots it)."""
    ctx.pool.record(it, outcomes(trajs))
    ctx.run.save_pool(ctx.pool)


@dataclass
class Batch:
    """A unit's training data, built by rank 0: every rank gets samples and num_steps (`shared`), rank 0 alone
    keeps what it logs."""

    samples: list
    """TrainSamples (every rank)."""
    num_steps: int
    """Optimiser steps per pass over the samples (every rank)."""
    trajs: list[Trajectory] = field(default_factory=list)
    """The unit's trajectories (rank 0)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Timings (rank 0)."""
    info: Any = None
    """The RftReport, DapoBatch or warm-start data metrics behind the samples (rank 0)."""
    counts: dict[str, int] = field(default_factory=dict)
    """DAPO: trajectories dropped as too stale, and redone after an interrupted attempt (rank 0)."""
    lr_scale: float = 1.0
    """DAPO: the factor on the stage's lr for this update, algo.staleness_lr (every rank)."""

    def shared(self) -> Batch:
        """What the other ranks need: the samples, the number of optimiser steps and the lr factor."""
        return Batch(self.samples, self.num_steps, lr_scale=self.lr_scale)


def _sft_batch(stage, kept: list[Trajectory], masks: list[list[int]], trajs: list[Trajectory], seconds: dict,
               info) -> Batch:  # fmt: skip
    """`kept` (with their loss masks) as SFT samples, split into the stage's optimiser steps."""
    n = num_optimizer_steps(len(kept), stage.batch_size, stage.min_optimizer_steps, stage.max_optimizer_steps)
    return Batch(to_samples(kept, masks, [0.0] * len(kept)), n, trajs, seconds, info)


def _rft_batch(stage, trajs: list[Trajectory], seconds: dict) -> Batch:
    """Resolved trajectories (malformed turns masked) as SFT samples."""
    kept, masks, report = rft_select(trajs, stage.max_kept_per_task)
    return _sft_batch(stage, kept, masks, trajs, seconds, report)


WARM_START_REPORT_S = 15.0
"""Seconds between the warm start's progress lines on the console."""


# --- units -----------------------------------------------------------------------------------------------
def _scripted_rollouts(ctx: Context, stage, unit: str) -> Batch:
    d = ctx.run.unit_dir(unit, fresh=True)
    tasks = [ctx.train_tasks[k] for k in sorted(ctx.train_tasks)]
    decoys = stage.warm_start_decoys
    chat, max_tokens = ctx.rollouts.chat, ctx.cfg.sampling.max_tokens_per_turn
    policy = ScriptedPolicy(chat, scripts(tasks, decoys, turn_fits(chat, max_tokens)))
    for key, why in sorted(policy.problems(max_tokens, stage.t_max).items()):
        print(f"{unit}: the scripted solution of {key} cannot play out: {why}", file=sys.stderr)
    trajs, seconds = _rollouts(ctx, stage, tasks, 1 + decoys, d, engine=policy)
    kept, masks, info = sft_data(trajs, stage.max_kept_per_task)
    return _sft_batch(stage, kept, masks, trajs, seconds, info | {"scripted_tasks": float(len(tasks))})


def warm_start(ctx: Context, stage_name: str = "rft") -> None:
    """Unit "rft:warm_start" (labelled, not the paper's): SFT on scripted gold solutions of the training tasks
    (and on scripted give-ups with rft.warm_start_decoys)."""
    stage, unit = getattr(ctx.cfg, stage_name), f"{stage_name}:warm_start"
    if stage.warm_start != "scripted" or ctx.run.is_done(unit):
        return
    b = ctx.world.lead(_scripted_rollouts, ctx, stage, unit, share=Batch.shared)
    epochs_most = stage.warm_start_epochs + stage.warm_start_anneal_epochs
    trainer = trainer_for(ctx, stage_name, max(b.num_steps * epochs_most, 1))
    t = time.perf_counter()
    say = (lambda line: print(f"{unit}: {line}", flush=True)) if ctx.world.driver else None
    steps, epoch_losses = warm_start_sft(trainer, stage, b.samples, ctx.cfg.seed, say)
    b.seconds["train_s"] = time.perf_counter() - t
    epochs = len(epoch_losses)
    ctx.trainer_stage = None  # RFT proper starts a fresh optimiser and schedule from these weights
    ckpt = _checkpoint_and_sync(ctx, unit, "warm_start", b.seconds)

    def finish() -> None:
        # The scripted fake's rollout is no model's: its outcomes go under warm_start/, not reward/ or episode/.
        rolled = rollout_metrics(b.trajs, stage.t_max, stage.l_thr)
        final = {f"final_{k}": v for k, v in (steps[-1] if steps else {}).items()}
        final["final_epoch_loss"] = epoch_losses[-1] if epoch_losses else float("nan")
        final["loss_target_reached"] = float(bool(epoch_losses) and min(epoch_losses) <= stage.warm_start_loss_target)
        metrics = {"warm_start": {**b.info, "epochs": float(epochs), **final,
                                  "resolved_rate": rolled["reward"]["resolved_rate"],
                                  "steps_mean": rolled["episode"]["steps_mean"]},
                   "infra": rolled["infra"]}  # fmt: skip
        metrics["train"] = train_metrics(steps, "sft")
        metrics["time"] = b.seconds
        for e, loss in enumerate(epoch_losses, 1):  # the warm start's own curve: x = epoch, not unit
            ctx.monitor.scalars("warm_start_epoch", {"loss": loss}, e)
        _log(ctx, unit, b.trajs, metrics, ctx.run.unit_dir(unit))

    _commit(ctx, unit, ckpt, finish)


def _sampled_rollouts(ctx: Context, stage_name: str, it: int, unit: str) -> Batch:
    stage = getattr(ctx.cfg, stage_name)
    d = ctx.run.unit_dir(unit, fresh=True)
    tasks = _sample(ctx, _pool(ctx, stage_name), stage.tasks_per_iteration, it)
    return _rft_batch(stage, *_rollouts(ctx, stage, tasks, stage.samples_per_task, d))


def rft_iteration(ctx: Context, it: int, stage_name: str = "rft") -> None:
    """One RFT iteration: sample tasks x G from the model, keep resolved (malformed turns masked), SFT."""
    stage, unit = getattr(ctx.cfg, stage_name), f"{stage_name}:{it}"
    if ctx.run.is_done(unit):
        return
    t0 = time.perf_counter()
    b = ctx.world.lead(_sampled_rollouts, ctx, stage_name, it, unit, share=Batch.shared)
    trainer = trainer_for(ctx, stage_name, b.num_steps * stage.iterations)
    left = b.num_steps * stage.epochs * (stage.iterations - it)
    trainer.set_schedule(trainer.schedule.at_least(trainer.steps_done + left))
    t = time.perf_counter()
    steps = _sft_steps(ctx, stage, b.samples, stage.epochs, ctx.cfg.seed + it)
    b.seconds["train_s"] = time.perf_counter() - t
    ckpt = _checkpoint_and_sync(ctx, unit, stage_name, b.seconds)

    def finish() -> None:
        _record(ctx, it, b.trajs)
        metrics = rollout_metrics(b.trajs, stage.t_max, stage.l_thr)
        metrics["rft"] = b.info.as_metrics("")
        metrics["train"] = train_metrics(steps, "sft")
        metrics["time"] = b.seconds | {"iteration_s": time.perf_counter() - t0}
        _log(ctx, unit, b.trajs, metrics, ctx.run.unit_dir(unit))

    _commit(ctx, unit, ckpt, finish)


@dataclass
class Rolled:
    """One RL unit's rollouts."""

    trajs: list[Trajectory]
    """Its trajectories, in (task, sample) order."""
    seconds: dict[str, float]
    """Rollout timings (RolloutStats.time_split)."""
    redone: int
    """Trajectories an interrupted earlier attempt of the unit had finished (discarded, rolled out again)."""


def _dapo_tasks(ctx: Context, stage_name: str, it: int, unit: str) -> tuple:
    """Rank 0, main thread: (stage name, tasks, the unit's fresh folder, trajectories its interrupted attempt
    left)."""
    cfg, stage = ctx.cfg, getattr(ctx.cfg, stage_name)
    left = ctx.run.unit_dir(unit) / "trajectories.jsonl"
    redone = sum(1 for _ in left.open(encoding="utf-8")) if left.exists() else 0
    d = ctx.run.unit_dir(unit, fresh=True)
    pool = _pool(ctx, stage_name)
    n = tasks_to_sample(stage.tasks_per_iteration, cfg.algo.oversample_factor, len(pool.active))
    return stage_name, _sample(ctx, pool, n, it), d, redone


def _roll(ctx: Context, stage_name: str, tasks: list[Task], unit_dir: Path, redone: int) -> Rolled:
    """tasks x G rollouts of a unit: in the rollout process in async mode (pipeline/rollout_process.py; waited
    for on the main thread, or on the thread ahead of the trainer), else here."""
    if ctx.ahead.process is not None:
        return Rolled(*ctx.ahead.process.roll(stage_name, tasks, unit_dir), redone)
    stage = getattr(ctx.cfg, stage_name)
    return Rolled(*_rollouts(ctx, stage, tasks, stage.samples_per_task, unit_dir), redone)


def _roll_ahead(ctx: Context, stage_name: str, it: int) -> None:
    """Rank 0: start the rollouts of the stage's next algo.max_staleness iterations not started yet."""
    last = min(it + ctx.cfg.algo.max_staleness, getattr(ctx.cfg, stage_name).iterations - 1)
    for j in range(it + 1, last + 1):
        unit = f"{stage_name}:{j}"
        if not ctx.ahead.started(unit):
            ctx.ahead.submit(unit, _roll, ctx, *_dapo_tasks(ctx, stage_name, j, unit))


def _dapo_batch(ctx: Context, stage_name: str, it: int, unit: str) -> Batch:
    """Rank 0: the unit's rollouts (started ahead, or now), the next units' started, the DAPO batch of the
    trajectories at most max_staleness updates behind the trainer."""
    cfg, stage = ctx.cfg, getattr(ctx.cfg, stage_name)
    ctx.ahead.begin(stage_name)
    if cfg.algo.max_staleness >= 1:  # started on the main thread: the child dies with its starting thread
        ctx.ahead.start_process(partial(RolloutProcess.for_run, ctx.rollouts, ctx.gate))
    t = time.perf_counter()
    rolled = ctx.ahead.take(unit) or ctx.ahead.run(_roll, ctx, *_dapo_tasks(ctx, stage_name, it, unit))
    waited = time.perf_counter() - t
    _roll_ahead(ctx, stage_name, it)
    kept, stale = split_stale(rolled.trajs, ctx.run.step, cfg.algo.max_staleness)
    max_groups = stage.tasks_per_iteration if cfg.algo.oversample_factor > 1 else None
    batch = build_dapo_batch(kept, DapoOptions.from_config(cfg.algo, stage), max_groups)
    samples = to_samples(
        batch.trajectories, [t.loss_mask(mask_malformed=False) for t in batch.trajectories],
        batch.advantages.tolist(),
    )  # fmt: skip
    n_steps = num_optimizer_steps(
        len(samples), stage.batch_size, stage.min_optimizer_steps, stage.max_optimizer_steps
    )
    counts = {"dropped_stale": len(stale), "redone_on_resume": rolled.redone}
    scale = staleness_lr_scale(batch.trajectories, ctx.run.step) if cfg.algo.staleness_lr else 1.0
    seconds = rolled.seconds | {"trainer_wait_s": waited}
    return Batch(samples, n_steps, rolled.trajs, seconds, batch, counts, scale)


def dapo_iteration(ctx: Context, stage_name: str, it: int) -> None:
    """One DAPO iteration (stage1/stage2): rollouts, length penalty, group advantages, dynamic sampling, update.
    With algo.max_staleness >= 1 the next iterations' rollouts run during the update (pipeline/ahead.py)."""
    stage, unit = getattr(ctx.cfg, stage_name), f"{stage_name}:{it}"
    if ctx.run.is_done(unit):
        return
    t0 = time.perf_counter()
    b = ctx.world.lead(_dapo_batch, ctx, stage_name, it, unit, share=Batch.shared)
    trainer = trainer_for(ctx, stage_name, stage.iterations * max(stage.max_optimizer_steps, 1))
    t = time.perf_counter()
    loss = LossSpec("dapo", stage.eps_low, stage.eps_high, ctx.cfg.algo.off_policy)
    steps = trainer.update(b.samples, b.num_steps, loss, b.lr_scale) if b.samples else []
    b.seconds["train_s"] = time.perf_counter() - t
    ckpt = _checkpoint_and_sync(ctx, unit, stage_name, b.seconds)

    def finish() -> None:
        _record(ctx, it, b.trajs)
        metrics = rollout_metrics(b.trajs, stage.t_max, stage.l_thr) | b.info.as_metrics()
        metrics["train"] = train_metrics(steps, "dapo")
        metrics["time"] = b.seconds | {"iteration_s": time.perf_counter() - t0}
        metrics["time"] |= ctx.ahead.cycle(b.seconds["trainer_wait_s"])
        metrics["async"] = staleness_metrics(b.trajs, ctx.run.step, b.counts["dropped_stale"]) | {
            "redone_on_resume": float(b.counts["redone_on_resume"]),
            "max_staleness": float(ctx.cfg.algo.max_staleness),
            "lr_scale": b.lr_scale,
        }
        metrics["pool"] = {"active": float(len(ctx.pool.active))}
        if ctx.cfg.algo.max_staleness >= 1:
            ctx.monitor.histogram(
                "async/staleness_hist", [staleness(t, ctx.run.step) for t in b.trajs], ctx.run.step
            )
        _log(ctx, unit, b.trajs, metrics, ctx.run.unit_dir(unit))

    _commit(ctx, unit, ckpt, finish)


def final_eval(ctx: Context, test_tasks: list) -> None:
    """Unit "eval": the final policy on the held-out tasks (Table 1 form), predictions for the harness. Rank 0
    alone rolls out (the engines already serve the final weights); test_tasks matter on rank 0 only."""
    if not ctx.run.is_done("eval") and ctx.world.lead(bool, test_tasks):
        _commit(ctx, "eval", None, partial(_evaluate, ctx, test_tasks), train_step=False)


def _evaluate(ctx: Context, test_tasks: list) -> None:
    ev = ctx.cfg.eval
    tasks = test_tasks[: ev.max_tasks] if ev.max_tasks else test_tasks
    # A plain identifier (SWE-bench log folders): e.g. tiny-qwen2__embedded__stage2-1
    name = model_name(ctx.cfg.model.name, ctx.cfg.name, ctx.run.state["done"][-1])
    report, text = evaluate(ctx.rollouts, tasks, ev.runs, ctx.run.eval_dir, name)
    ctx.monitor.scalars("eval", {k: v for k, v in report.items() if k.startswith("pass@") and k != "pass@1_per_run"},
                        ctx.run.step)  # fmt: skip
    ctx.monitor.text("eval/table", text, ctx.run.step)
    ctx.monitor.flush()

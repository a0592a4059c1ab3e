"""Checks on values that types cannot express; each problem names the key and what is allowed."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from swe_megatron.config.capacity import sandbox_slots
from swe_megatron.config.schema import (
    RL_STAGE_NAMES,
    SCHEDULE_NAMES,
    STAGE_NAMES,
    SandboxBackend,
    SandboxConfig,
    StageConfig,
    max_positions,
)

MAX_STALENESS = 15
"""Largest algo.max_staleness: a resume reruns an iteration and the k sampled ahead of it, and the task pool
remembers its latest algo.curriculum.KEPT_SAMPLES (16) samples to give them their tasks again."""

# Sampling settings that must be "off" in RL: any truncation biases the importance ratio
# (the paper: top-k/min-p silently enabled by an engine upgrade degraded training after 5-10 iterations).
UNTRUNCATED = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}

ROPE_SCALING_TYPES = (None, "yarn")
"""What train/model.py implements (Megatron-Core's "rope" and "yarn" position embeddings)."""


WANDB_PROJECT_FORBIDDEN = "/\\#?%:"
"""Characters W&B refuses in a project name."""


RFT_ONLY = (
    "warm_start",
    "warm_start_epochs",
    "warm_start_lr",
    "warm_start_loss_target",
    "warm_start_anneal_epochs",
    "warm_start_decoys",
    "max_kept_per_task",
    "epochs",
)
"""Stage keys only rejection fine-tuning (rft) reads: the warm start, the cap on kept successes, and the passes
over the batch (a DAPO iteration takes one pass, split into min..max_optimizer_steps steps)."""
DAPO_ONLY = ("eps_low", "eps_high")
"""Stage keys only the DAPO stages (RL_STAGE_NAMES) read: the clip range."""


def _unused_stage_keys(cfg: Any) -> list[str]:
    """Stage keys set on a kind of stage that never reads them (rft is SFT, stage1 and stage2 are DAPO)."""
    default, out = StageConfig(), []
    for name in STAGE_NAMES:
        unused, readers = (RFT_ONLY, "rft") if name in RL_STAGE_NAMES else (DAPO_ONLY, "stage1 and stage2")
        for key in unused:
            if cfg[name][key] != getattr(default, key):
                out.append(
                    f"{name}.{key}={cfg[name][key]} has no effect: only {readers} read it; allowed: leave it "
                    f"unset ({getattr(default, key)})"
                )
    return out


def _stage_problems(name: str, st: Any, model: Any) -> list[str]:
    out = []
    if not 0 < st.eps_low < 1:
        out.append(f"{name}.eps_low={st.eps_low} is invalid; allowed: 0 < eps_low < 1 (the paper: 0.2)")
    if not st.eps_high > 0:
        out.append(f"{name}.eps_high={st.eps_high} is invalid; allowed: eps_high > 0 (the paper: 0.3 / 0.26)")
    if st.t_max < 1:
        out.append(f"{name}.t_max={st.t_max} is invalid; allowed: an integer >= 1 turns")
    if not 0 <= st.l_thr < st.t_max:
        out.append(f"{name}.l_thr={st.l_thr} is invalid; allowed: 0 <= l_thr < t_max ({st.t_max})")
    for key in (
        "iterations",
        "tasks_per_iteration",
        "samples_per_task",
        "batch_size",
        "epochs",
        "max_kept_per_task",
    ):
        if st[key] < 1:
            out.append(f"{name}.{key}={st[key]} is invalid; allowed: an integer >= 1")
    if name in RL_STAGE_NAMES and st.samples_per_task < 2:
        out.append(
            f"{name}.samples_per_task={st.samples_per_task} is invalid for DAPO; allowed: >= 2 (group advantages)"
        )
    if st.min_optimizer_steps < 1 or 0 < st.max_optimizer_steps < st.min_optimizer_steps:
        out.append(
            f"{name}.min_optimizer_steps={st.min_optimizer_steps} / max_optimizer_steps={st.max_optimizer_steps} "
            "are invalid; allowed: 1 <= min_optimizer_steps <= max_optimizer_steps, or max 0 for no cap (the paper: 2, 8)"
        )
    limit = max_positions(model)
    if not 0 < st.context_length <= limit:
        out.append(
            f"{name}.context_length={st.context_length} is invalid; allowed: 1..{limit} for model {model.name} "
            "(max_position_embeddings, or rope_scaling.factor x original_max_position_embeddings with yarn; "
            "set model.rope_scaling for longer context)"
        )
    if not 0 < st.refresh_max_solve_rate <= 1:
        out.append(
            f"{name}.refresh_max_solve_rate={st.refresh_max_solve_rate} is invalid; allowed: 0 < rate <= 1"
        )
    if st.warm_start_lr < 0:
        out.append(f"{name}.warm_start_lr={st.warm_start_lr} is invalid; allowed: >= 0 (0 uses optim.lr)")
    if st.warm_start_epochs < 0:
        out.append(f"{name}.warm_start_epochs={st.warm_start_epochs} is invalid; allowed: >= 0 (the most epochs)")
    if st.warm_start_loss_target < 0:
        out.append(f"{name}.warm_start_loss_target={st.warm_start_loss_target} is invalid; allowed: >= 0 (0: no target)")
    if st.warm_start_anneal_epochs < 0:
        out.append(f"{name}.warm_start_anneal_epochs={st.warm_start_anneal_epochs} is invalid; allowed: >= 0 (0: none)")
    if st.warm_start_decoys < 0:
        out.append(f"{name}.warm_start_decoys={st.warm_start_decoys} is invalid; allowed: >= 0")
    o = st.optim
    if not o.lr > 0 or o.min_lr < 0 or o.min_lr > o.lr:
        out.append(
            f"{name}.optim.lr={o.lr} / min_lr={o.min_lr} are invalid; allowed: lr > 0 and 0 <= min_lr <= lr"
        )
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        out.append(
            f"{name}.optim.betas={list(o.betas)} is invalid; allowed: two values in [0, 1), e.g. [0.9, 0.999]"
        )
    if o.eps <= 0 or o.weight_decay < 0 or o.grad_clip < 0 or o.warmup_steps < 0:
        out.append(f"{name}.optim: eps must be > 0 and weight_decay, grad_clip, warmup_steps >= 0")
    return out


SANDBOX_PATHS = ("workspace_root", "sif_dir")
"""Sandbox settings that are host paths: absolute (a relative one would depend on each process's cwd)."""


def sandbox_problems(sb: Any) -> list[str]:
    """Problems with a SandboxConfig (or its config node): every number (limits, timeouts, caps, counts) is
    finite and > 0 (0 or less silently removed a limit or failed every grading), every path absolute."""
    out = []
    for f in dataclasses.fields(SandboxConfig):
        value = sb[f.name] if not dataclasses.is_dataclass(sb) else getattr(sb, f.name)
        if f.name in SANDBOX_PATHS:
            if not str(value).startswith("/") and (value or f.name == "workspace_root"):
                out.append(f"sandbox.{f.name}={value!r} is invalid; allowed: an absolute path")
        elif isinstance(value, int | float) and not isinstance(value, bool) and not 0 < value < math.inf:
            out.append(f"sandbox.{f.name}={value} is invalid; allowed: a finite number > 0")
    return out


def _schedule_problems(cfg: Any) -> list[str]:
    out = []
    if not cfg.schedule:
        out.append(f"schedule=[] is invalid (nothing to run); allowed: a list of {', '.join(SCHEDULE_NAMES)}")
    for entry in cfg.schedule:
        if entry not in SCHEDULE_NAMES:
            out.append(f"schedule entry {entry!r} is invalid; allowed: {', '.join(SCHEDULE_NAMES)}")
    if len(set(cfg.schedule)) != len(cfg.schedule):
        out.append(
            f"schedule={list(cfg.schedule)} repeats a stage; allowed: each of {', '.join(SCHEDULE_NAMES)} once"
        )
    return out


def _model_problems(m: Any) -> list[str]:
    out = []
    if m.architecture not in ("qwen2", "llama"):
        out.append(f"model.architecture={m.architecture!r} is invalid; allowed: qwen2, llama")
    heads, kv_heads = m.num_attention_heads, m.num_key_value_heads
    if heads < 1 or kv_heads < 1:
        out.append(
            f"model.num_attention_heads={heads} / model.num_key_value_heads={kv_heads} are invalid; "
            "allowed: integers >= 1"
        )
    elif m.hidden_size % heads or heads % kv_heads:
        out.append(
            f"model: hidden_size ({m.hidden_size}) must be divisible by num_attention_heads ({m.num_attention_heads}), "
            f"and that by num_key_value_heads ({m.num_key_value_heads})"
        )
    rs = m.rope_scaling
    if rs.type not in ROPE_SCALING_TYPES:
        out.append(
            f"model.rope_scaling.type={rs.type!r} is not implemented by the trainer; allowed: null, yarn "
            "(the engines would apply a scaling the trainer does not)"
        )
    elif rs.type is None and rs.factor != 1.0:
        out.append(
            f"model.rope_scaling.factor={rs.factor} has no effect without a scaling type; allowed: 1.0, "
            "or set model.rope_scaling.type=yarn"
        )
    elif rs.type == "yarn" and not (rs.factor > 1.0 and rs.original_max_position_embeddings >= 1):
        out.append(
            f"model.rope_scaling.factor={rs.factor} / original_max_position_embeddings="
            f"{rs.original_max_position_embeddings} are invalid for yarn; allowed: factor > 1 (the paper: 4.0), "
            "original_max_position_embeddings >= 1"
        )
    if m.params_dtype not in ("float32", "bfloat16", "float16"):
        out.append(f"model.params_dtype={m.params_dtype!r} is invalid; allowed: float32, bfloat16, float16")
    return out


def _sampling_algo_problems(cfg: Any) -> list[str]:
    out = []
    rl_stages = [n for n in RL_STAGE_NAMES if n in cfg.schedule]
    for key, off in UNTRUNCATED.items():
        if rl_stages and cfg.sampling[key] != off:
            out.append(
                f"sampling.{key}={cfg.sampling[key]} is not allowed with RL stages ({', '.join(rl_stages)}); "
                f"allowed: {off} (untruncated sampling keeps the importance ratio unbiased)"
            )
    if cfg.sampling.temperature <= 0 or cfg.sampling.max_tokens_per_turn < 1:
        out.append("sampling: temperature must be > 0 and max_tokens_per_turn >= 1")
    if cfg.algo.adv_eps < 0 or cfg.algo.oversample_factor < 1:
        out.append(
            f"algo.adv_eps={cfg.algo.adv_eps} / oversample_factor={cfg.algo.oversample_factor} are invalid; "
            "allowed: adv_eps >= 0, oversample_factor >= 1.0"
        )
    if not 0 <= cfg.algo.max_staleness <= MAX_STALENESS:
        out.append(
            f"algo.max_staleness={cfg.algo.max_staleness} is invalid; allowed: 0 (synchronous, the paper) or "
            f"1..{MAX_STALENESS} (rollouts run up to k iterations ahead of the trainer)"
        )
    for key in ("tis_cap", "mask_threshold"):
        value = cfg.algo.off_policy[key]
        if value is not None and not 0 < value < math.inf:
            out.append(
                f"algo.off_policy.{key}={value} is invalid; allowed: null (off) or a finite number > 0"
            )
    return out


def _parallel_problems(p: Any, m: Any) -> list[str]:
    out = []
    degrees = {
        "tensor_parallel": p.tensor_parallel,
        "pipeline_parallel": p.pipeline_parallel,
        "context_parallel": p.context_parallel,
        "world_size": p.world_size,
    }
    for key, value in degrees.items():
        if value < 1:
            out.append(f"parallel.{key}={value} is invalid; allowed: an integer >= 1")
    model_parallel = p.tensor_parallel * p.pipeline_parallel * p.context_parallel
    if model_parallel >= 1 and p.world_size % model_parallel:
        out.append(
            f"parallel.world_size={p.world_size} is invalid; allowed: a multiple of tensor x pipeline x context "
            f"parallel ({model_parallel})"
        )
    if p.sequence_parallel and p.tensor_parallel == 1:
        out.append("parallel.sequence_parallel=true needs tensor_parallel > 1; allowed: false with TP=1")
    if p.tensor_parallel >= 1 and m.num_key_value_heads % p.tensor_parallel:  # TP < 1 is reported above
        # Megatron-Core gives each TP rank whole KV heads (query groups); the HF mapping does not replicate them.
        out.append(
            f"parallel.tensor_parallel={p.tensor_parallel} does not divide model.num_key_value_heads "
            f"({m.num_key_value_heads}); allowed: a divisor of it"
        )
    if p.micro_batch_tokens < 1:
        out.append(f"parallel.micro_batch_tokens={p.micro_batch_tokens} is invalid; allowed: an integer >= 1")
    return out


def _cluster_problems(cfg: Any) -> list[str]:
    out = []
    c, p = cfg.cluster, cfg.parallel
    if c.trainer_nodes + c.engine_nodes > c.nodes or c.trainer_nodes < 1:
        out.append(
            f"cluster.trainer_nodes ({c.trainer_nodes}) + engine_nodes ({c.engine_nodes}) must be between 1 "
            f"and cluster.nodes ({c.nodes})"
        )
    if c.gpus_per_node and p.world_size > c.trainer_nodes * c.gpus_per_node:
        out.append(
            f"parallel.world_size={p.world_size} exceeds the trainer's GPUs "
            f"(cluster.trainer_nodes x gpus_per_node = {c.trainer_nodes * c.gpus_per_node})"
        )
    if c.gpus_per_node and not c.engine_nodes and cfg.engine.weight_sync == "broadcast":
        # The run's own vLLM server would take trainer rank 0's GPU (device 0 of what it sees) and join the sync
        # group beside it: NCCL refuses two ranks of one communicator on one GPU (src/init.cc: "Duplicate GPU
        # detected", ncclInvalidUsage), and the two would share its memory besides.
        out.append(
            "cluster.engine_nodes=0 with GPUs (cluster.gpus_per_node > 0) and engine.weight_sync=broadcast is "
            "invalid: the run's own vLLM server would share trainer rank 0's GPU and sit in its NCCL sync group "
            "twice; allowed: cluster.engine_nodes >= 1 (vLLM on its own nodes) or engine.weight_sync=file"
        )
    return out


def _agent_problems(cfg: Any) -> list[str]:
    out = []
    a = cfg.agent
    if a.concurrency < 1 or a.infra_retries < 0 or a.prewarm_sandboxes < 0:
        out.append(
            f"agent.concurrency={a.concurrency} / infra_retries={a.infra_retries} / prewarm_sandboxes="
            f"{a.prewarm_sandboxes} are invalid; allowed: concurrency >= 1 (0: derived from the cluster), "
            "infra_retries >= 0, prewarm_sandboxes >= 0 (-1: derived from the spare sandbox slots)"
        )
    nodes = max(1, cfg.cluster.nodes)
    slots = sandbox_slots(cfg)
    if a.concurrency > slots:
        out.append(
            f"agent.concurrency={a.concurrency} is invalid; allowed: at most sandbox.max_concurrent x cluster.nodes "
            f"({cfg.sandbox.max_concurrent} x {nodes} = {slots}): each running episode needs a sandbox "
            "slot, and an episode finding none waits, then is refused (an infrastructure failure); "
            "agent.concurrency=0 derives it from the cluster"
        )
    if a.provenance_workers < 0:
        out.append(
            f"agent.provenance_workers={a.provenance_workers} is invalid; allowed: an integer >= 0 (0: the check "
            "runs on each episode's thread)"
        )
    if cfg.engine.episodes_per_server < 0:
        out.append(
            f"engine.episodes_per_server={cfg.engine.episodes_per_server} is invalid; allowed: an integer >= 0 "
            "(0: not stated)"
        )
    for key in ("episode_timeout_s", "rollout_timeout_s"):
        if not getattr(a, key) >= 0:
            out.append(f"agent.{key}={getattr(a, key)} is invalid; allowed: seconds >= 0 (0: no limit)")
    # An episode past its deadline may be excluded (grading/exclusion.py): its own commands must not reach it.
    turns = {name: cfg[name].t_max for name in STAGE_NAMES if name in cfg.schedule and name != "eval"}
    if "eval" in cfg.schedule:
        turns["eval"] = cfg.eval.t_max
    if turns and a.episode_timeout_s > 0:
        stage, t_max = max(turns.items(), key=lambda kv: kv[1])
        own = t_max * cfg.sandbox.command_timeout_s
        if a.episode_timeout_s <= own:
            out.append(
                f"agent.episode_timeout_s={a.episode_timeout_s:g} is invalid; allowed: 0 (no limit) or more than "
                f"the agent's own commands can take, {stage} t_max x sandbox.command_timeout_s = {t_max} x "
                f"{cfg.sandbox.command_timeout_s:g} = {own:g} s, plus time for generation"
            )
    return out


def _sandbox_engine_problems(cfg: Any) -> list[str]:
    out = []
    if cfg.sandbox.backend == SandboxBackend.local and not cfg.sandbox.allow_local:
        out.append(
            "sandbox.backend=local runs agent code unsandboxed; allowed: bwrap or apptainer, "
            "or set sandbox.allow_local=true for development"
        )
    out += sandbox_problems(cfg.sandbox)
    e = cfg.engine
    if e.weight_sync not in ("file", "broadcast"):
        out.append(f"engine.weight_sync={e.weight_sync!r} is invalid; allowed: file, broadcast")
    for key in ("weight_sync_bucket_mb", "weight_sync_timeout_s"):
        if not 0 < getattr(e, key) < math.inf:
            out.append(f"engine.{key}={getattr(e, key)} is invalid; allowed: > 0 (finite)")
    if not 0 <= e.port <= 65536 - max(1, e.num_servers):
        out.append(
            f"engine.port={e.port} is invalid; allowed: 0 (any free port) .. {65536 - max(1, e.num_servers)} "
            f"(server i listens on engine.port + i, engine.num_servers={e.num_servers})"
        )
    if not 0 <= e.weight_sync_port <= 65535:
        out.append(
            f"engine.weight_sync_port={e.weight_sync_port} is invalid; allowed: 0 (any free port) .. 65535"
        )
    return out


def validate(cfg: Any) -> list[str]:
    """All problems with a composed RunConfig, as one-line messages (empty when valid)."""
    out = _schedule_problems(cfg) + _model_problems(cfg.model)
    for name in STAGE_NAMES:
        if name in cfg.schedule:
            out += _stage_problems(name, cfg[name], cfg.model)
    out += _unused_stage_keys(cfg)
    out += _sampling_algo_problems(cfg) + _parallel_problems(cfg.parallel, cfg.model)
    out += _sandbox_engine_problems(cfg) + _cluster_problems(cfg) + _agent_problems(cfg)
    if cfg.checkpoint.keep_last < 1:
        out.append(
            f"checkpoint.keep_last={cfg.checkpoint.keep_last} is invalid; allowed: an integer >= 1 (the last "
            "checkpoint is what a resume starts from)"
        )
    if not cfg.monitor.wandb.project or set(cfg.monitor.wandb.project) & set(WANDB_PROJECT_FORBIDDEN):
        out.append(
            f"monitor.wandb.project={cfg.monitor.wandb.project!r} is invalid; allowed: a non-empty name without "
            f"any of {WANDB_PROJECT_FORBIDDEN}"
        )
    if cfg.eval.runs < 1 or any(k < 1 or k > cfg.eval.runs for k in cfg.eval.k):
        out.append(f"eval.k={list(cfg.eval.k)} is invalid; allowed: 1 <= k <= eval.runs ({cfg.eval.runs})")
    return out

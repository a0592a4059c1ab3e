"""Trainer layouts (TP x PP x CP x DP) for a model, context length and GPU count, with memory per GPU.

`plan_layouts` lists every valid layout with an estimate of the peak memory of its most loaded GPU and
whether it fits; `swe-megatron plan` prints them (swe_megatron/train/command.py), with `estimate_sync`'s
seconds per weight update by file and by broadcast (its assumptions are in its docstring).

What the estimate assumes (Megatron-Core as `train/model.py` and `train/step.py` configure it):
- Valid layouts: TP divides the GPUs of one node, the query heads and the KV heads (Megatron splits whole
  KV groups); PP divides the layers (equal stages); the context is divisible by 2 x CP (CP's
  load-balanced split); DP = GPUs / (TP x PP x CP) is a whole number. Sequence parallelism is on when
  TP > 1.
- Parameters per GPU: the most loaded pipeline stage (its L / PP layers, plus the embedding on the
  first stage and the untied output layer on the last), divided by TP (norms are replicated).
- Weights: `params_dtype` bytes (2 for bf16). Gradients: 4 bytes (Megatron's fp32 grad buffer,
  `grad_reduce_in_fp32`). Optimizer (Adam): fp32 master copy (only when params are not fp32) + two
  fp32 moments = 12 bytes (bf16) or 8 (fp32); divided by DP with the distributed optimizer (weights and
  grad buffer are not sharded by it).
- Activations: one micro-batch is one sequence of `context` tokens (long trajectories are packed alone).
  A rank holds context / CP tokens of it, and with sequence parallelism 1 / TP of the stored tensors.
  Per layer and token the forward keeps about 10h + 4 kv_heads * head_dim + 8 ffn bytes in bf16
  (norm outputs, q/k/v, attention output, gate/up/SiLU/product; flash attention keeps no s x s scores;
  no dropout masks). Full recomputation stores only each layer's input (2h bytes per token) and
  rebuilds one layer at a time in the backward (that layer's activations and their gradients: x2);
  selective recomputation keeps everything except the attention core (here: the q/k/v/attention-output
  share); none keeps all of it for every layer. With 1F1B pipelining the first stage holds PP
  micro-batches in flight. Action-only logprobs add one chunk of logits (1024 x vocab / TP fp32) and
  the final hidden states, and the gradient of the row gather (train/logprobs.py): index_select's backward
  adds the rows' gradients into a zero [context / CP, h] tensor and sequence parallelism's reduce-scatter
  takes a contiguous copy of it, 2 x (context / CP) x h x 2 bytes, full length (not / TP).
- The weight sync (`sync_working_bytes`), after the step has freed the activations and the cache was emptied
  (train/weight_sync.py): trainer rank 0 holds the largest HF tensor gathered whole over TP, and with
  broadcast a bucket and its torch.cat source plus the sync group's NCCL buffers (SYNC_NCCL_GIB); the peak
  holds the largest of activations, the optimizer step's temporaries and this.
- The optimizer step: a fused Adam (Transformer Engine's or Apex's: what Megatron-Core picks when either is
  installed, as in the GPU image) updates in place. Without them Megatron falls back to torch's AdamW, whose
  foreach kernels hold one fp32 temporary per parameter it updates (its shard with the distributed
  optimizer): `fused_adam=False`. The step runs after the backward has freed the activations, so the peak
  holds the larger of the two.
- Overhead: a fixed `overhead_gib` per GPU (CUDA context, NCCL and Transformer Engine workspaces,
  allocator fragmentation). A layout fits when its total is at most `usable_fraction` of the GPU memory.
- Recommended: the first layout that fits in this order: smallest model-parallel group TP x PP x CP
  (the most data parallelism: DP's gradient reduction is once per step and overlaps, TP/CP/PP
  communication is on every layer or stage), then fewer pipeline stages (bubbles, uneven end stages),
  then less context parallelism, then the larger TP (intra-node NVLink).
"""

from __future__ import annotations

from dataclasses import dataclass

from swe_megatron.config.schema import ModelConfig, Recompute

GIB = 2**30
LOGIT_CHUNK = 1024
"""Action rows per logits chunk (train/logprobs.py DEFAULT_CHUNK)."""
SYNC_NCCL_GIB = 1.0
"""Assumed (not measured) GPU memory of the fresh NCCL communicator a broadcast sync builds on trainer rank 0:
per channel (up to 32 between nodes) one send and one receive connection, each with NCCL_BUFFSIZE (4 MiB,
the Simple protocol) plus the LL and LL128 buffers, about 0.6 GiB, rounded up."""


@dataclass
class Layout:
    """One trainer layout and its estimated peak memory per GPU (GiB, most loaded GPU)."""

    tp: int
    """Tensor parallel."""
    pp: int
    """Pipeline parallel."""
    cp: int
    """Context parallel."""
    dp: int
    """Data parallel."""
    params_b: float
    """Parameters on the most loaded GPU, in billions."""
    weights: float
    """Weights."""
    grads: float
    """Gradient buffer (fp32)."""
    optimizer: float
    """Adam state (fp32 master + moments), with the distributed optimizer when `distributed_optimizer`."""
    optimizer_unsharded: float
    """Adam state without the distributed optimizer."""
    activations: float
    """Activations of the micro-batches in flight plus the recomputed layer and the logits chunk."""
    step_temp: float
    """The optimizer step's temporaries (0 with a fused Adam)."""
    sync: float
    """Trainer rank 0's weight-sync working set (`sync_working_bytes`), held after the step."""
    overhead: float
    """Fixed per-GPU overhead."""
    distributed_optimizer: bool
    """Whether `optimizer` (and `total`) assume the distributed optimizer."""
    budget: float
    """Usable GiB per GPU (usable_fraction x GPU memory)."""

    @property
    def total(self) -> float:
        """Estimated peak GiB on the most loaded GPU (activations, the step's temporaries and the weight sync's
        working set are never held together)."""
        transient = max(self.activations, self.step_temp, self.sync)
        return self.weights + self.grads + self.optimizer + transient + self.overhead

    @property
    def fits(self) -> bool:
        """Whether `total` is within the budget."""
        return self.total <= self.budget

    @property
    def model_parallel(self) -> int:
        """GPUs that share one model replica (TP x PP x CP)."""
        return self.tp * self.pp * self.cp


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def params_per_layer(m: ModelConfig) -> int:
    """Parameters of one decoder layer (attention with GQA and optional q/k/v bias, SwiGLU MLP, 2 norms)."""
    d = m.hidden_size // m.num_attention_heads
    kv = m.num_key_value_heads * d
    attn = m.hidden_size * (m.hidden_size + 2 * kv) + m.hidden_size * m.hidden_size
    if m.qkv_bias:
        attn += m.hidden_size + 2 * kv
    return attn + 3 * m.hidden_size * m.intermediate_size + 2 * m.hidden_size


def total_params(m: ModelConfig) -> int:
    """Parameters of the whole model."""
    embed = m.vocab_size * m.hidden_size
    return m.num_layers * params_per_layer(m) + embed * (1 if m.tie_word_embeddings else 2) + m.hidden_size


def activation_bytes_per_token_layer(m: ModelConfig) -> int:
    """Forward activations one layer keeps per token without recomputation (bf16, before TP/SP)."""
    d = m.hidden_size // m.num_attention_heads
    return 10 * m.hidden_size + 4 * m.num_key_value_heads * d + 8 * m.intermediate_size


def sync_working_bytes(m: ModelConfig, method: str = "broadcast", bucket_mib: float = 512.0) -> float:
    """Bytes trainer rank 0 holds during one weight sync (train/weight_sync.py): the largest HF tensor gathered
    whole over TP (the embedding or output layer, vocab x hidden, or the fused gate/up projection); with
    "broadcast" also one flat bucket and the tensors torch.cat packs into it (2 x bucket_mib) and the sync
    group's NCCL buffers (SYNC_NCCL_GIB)."""
    wbytes = 4 if m.params_dtype == "float32" else 2
    largest = max(m.vocab_size, 2 * m.intermediate_size) * m.hidden_size * wbytes
    if method != "broadcast":
        return float(largest)
    return largest + 2 * bucket_mib * 2**20 + SYNC_NCCL_GIB * GIB


def estimate(
    m: ModelConfig,
    context: int,
    tp: int,
    pp: int,
    cp: int,
    dp: int,
    gpu_gib: float = 140.0,
    recompute: Recompute = Recompute.full,
    distributed_optimizer: bool = True,
    overhead_gib: float = 8.0,
    usable_fraction: float = 0.9,
    fused_adam: bool = True,
    sync_bytes: float = 0.0,
) -> Layout:
    """Memory estimate (GiB) of one layout; see the module docstring for the assumptions."""
    h, v = m.hidden_size, m.vocab_size
    per_layer = params_per_layer(m)
    layers = m.num_layers // pp
    first = layers * per_layer + v * h
    last = layers * per_layer + h + (0 if m.tie_word_embeddings else v * h)
    if pp == 1:
        first = m.num_layers * per_layer + v * h + h + (0 if m.tie_word_embeddings else v * h)
    params = max(first, last) / tp
    wbytes = 4 if m.params_dtype == "float32" else 2
    opt_bytes = 8 if m.params_dtype == "float32" else 12
    optimizer_full = params * opt_bytes

    tokens = context / cp  # this rank's share of the sequence
    sp = tp  # sequence parallel (TP > 1) splits the stored activations too; TP = 1 divides by 1
    full_layer = tokens * activation_bytes_per_token_layer(m) / sp
    stored_input = tokens * 2 * h / sp
    if recompute == Recompute.full:
        kept = layers * stored_input
        working = 2 * full_layer
    elif recompute == Recompute.selective:
        d = h // m.num_attention_heads
        attn_core = tokens * (4 * h + 4 * m.num_key_value_heads * d) / sp
        kept = layers * (full_layer - attn_core)
        working = 2 * attn_core
    else:
        kept = layers * full_layer
        working = 0.0
    in_flight = pp  # 1F1B: the first stage holds up to PP micro-batches' activations
    logits = LOGIT_CHUNK * (v / tp) * 4 * 2 + tokens * h * 2
    row_gather_grad = 2 * tokens * h * 2  # not / TP: the head works on the gathered sequence
    activations = kept * in_flight + working + logits + row_gather_grad
    return Layout(
        tp=tp,
        pp=pp,
        cp=cp,
        dp=dp,
        params_b=params / 1e9,
        weights=params * wbytes / GIB,
        grads=params * 4 / GIB,
        optimizer=(optimizer_full / dp if distributed_optimizer else optimizer_full) / GIB,
        optimizer_unsharded=optimizer_full / GIB,
        activations=activations / GIB,
        step_temp=0.0 if fused_adam else params * 4 / (dp if distributed_optimizer else 1) / GIB,
        sync=sync_bytes / GIB,
        overhead=overhead_gib,
        distributed_optimizer=distributed_optimizer,
        budget=usable_fraction * gpu_gib,
    )


def valid_layouts(
    m: ModelConfig, context: int, gpus: int, gpus_per_node: int = 8
) -> list[tuple[int, int, int, int]]:
    """(TP, PP, CP, DP) combinations Megatron-Core can run for this model, context and GPU count."""
    out = []
    for tp in _divisors(min(gpus_per_node, gpus)):
        if m.num_attention_heads % tp or m.num_key_value_heads % tp or gpus % tp:
            continue
        for pp in _divisors(m.num_layers):
            for cp in _divisors(gpus // tp):
                if gpus % (tp * pp * cp) or context % (2 * cp if cp > 1 else 1):
                    continue
                out.append((tp, pp, cp, gpus // (tp * pp * cp)))
    return out


def plan_layouts(
    m: ModelConfig,
    context: int,
    gpus: int,
    gpus_per_node: int = 8,
    gpu_gib: float = 140.0,
    recompute: Recompute = Recompute.full,
    distributed_optimizer: bool = True,
    overhead_gib: float = 8.0,
    usable_fraction: float = 0.9,
    sync_bytes: float = 0.0,
) -> list[Layout]:
    """Every valid layout with its estimate, in recommendation order (fitting ones first; see docstring);
    sync_bytes: trainer rank 0's weight-sync working set (`sync_working_bytes`; 0: not counted)."""
    if gpus < 1 or context < 1:
        raise ValueError(f"gpus ({gpus}) and context ({context}) must be positive")
    layouts = [
        estimate(
            m,
            context,
            tp,
            pp,
            cp,
            dp,
            gpu_gib,
            recompute,
            distributed_optimizer,
            overhead_gib,
            usable_fraction,
            sync_bytes=sync_bytes,
        )
        for tp, pp, cp, dp in valid_layouts(m, context, gpus, gpus_per_node)
    ]
    return sorted(layouts, key=lambda x: (not x.fits, x.model_parallel, x.pp, x.cp, -x.tp))


def format_table(layouts: list[Layout], marked: Layout | None = None) -> str:
    """The layouts as an aligned text table, GiB per GPU; the `marked` row (a run preset's own) ends in a mark."""
    head = (
        f"{'TP':>3} {'PP':>3} {'CP':>3} {'DP':>3} {'params/GPU':>10} {'weights':>8} {'grads':>7} "
        f"{'optim':>7} {'optim(no DO)':>12} {'activ':>7} {'sync':>5} {'other':>6} {'total':>7}  fits"
    )
    rows = [head]
    for x in layouts:
        rows.append(
            f"{x.tp:>3} {x.pp:>3} {x.cp:>3} {x.dp:>3} {x.params_b:>9.2f}B {x.weights:>8.1f} {x.grads:>7.1f} "
            f"{x.optimizer:>7.1f} {x.optimizer_unsharded:>12.1f} {x.activations:>7.1f} {x.sync:>5.1f} "
            f"{x.overhead:>6.1f} "
            f"{x.total:>7.1f}  {'yes' if x.fits else 'NO (over ' + format(x.budget, '.0f') + ' GiB)'}"
            + ("  <- the preset's" if x is marked else "")
        )
    return "\n".join(rows)


@dataclass
class SyncEstimate:
    """Seconds of one weight update from the trainer to every engine, by method (see `estimate_sync`)."""

    bytes: float
    """Bytes of one version of the weights (params x bytes of params_dtype: 2 for bf16)."""
    servers: int
    """vLLM servers that receive each version."""
    file_write_s: float
    """file: the trainer writes the HF export once to the shared filesystem."""
    file_read_s: float
    """file: every server reads the export, all at once, sharing the filesystem's read bandwidth."""
    gather_s: float
    """broadcast: the later pipeline stages send their tensors to trainer rank 0."""
    broadcast_s: float
    """broadcast: rank 0 streams each byte once through its NIC (NCCL's pipelined broadcast)."""

    @property
    def file_s(self) -> float:
        """The file method: write + read."""
        return self.file_write_s + self.file_read_s

    @property
    def total_broadcast_s(self) -> float:
        """The broadcast method: gather + broadcast."""
        return self.gather_s + self.broadcast_s


def estimate_sync(
    m: ModelConfig, servers: int, pp: int, fs_write_gbps: float, fs_read_gbps: float, nic_gbps: float
) -> SyncEstimate:
    """Per-update weight-sync time of both methods (GB/s = 1e9 bytes/s), assuming:
    - one version is params x 2 bytes (bf16; 4 for fp32), each tensor sent or written once;
    - file: the trainer's export writes it to the shared filesystem at fs_write_gbps (all writers together),
      then all `servers` read it at once, sharing fs_read_gbps (aggregate): servers x bytes / fs_read_gbps;
    - broadcast: stages 2..PP send their (PP - 1) / PP share to rank 0, and rank 0's broadcast sends each
      byte once through its NIC (NCCL pipelines the buckets through a ring/tree, so the time does not grow
      with the receivers), both at nic_gbps (one InfiniBand NIC per GPU); TP gathers inside a node (NVLink),
      the engines' in-place load and bucket packing are not counted.
    """
    nbytes = total_params(m) * (4 if m.params_dtype == "float32" else 2)
    return SyncEstimate(
        bytes=nbytes,
        servers=servers,
        file_write_s=nbytes / (fs_write_gbps * 1e9),
        file_read_s=servers * nbytes / (fs_read_gbps * 1e9),
        gather_s=nbytes * (pp - 1) / pp / (nic_gbps * 1e9),
        broadcast_s=nbytes / (nic_gbps * 1e9),
    )


@dataclass
class CheckpointEstimate:
    """One committed unit's checkpoint on the shared filesystem (RUN/checkpoints/UNIT: dist/ and hf/), in bytes."""

    weights: float
    """dist/: the model's weights (params x bytes of params_dtype), each shard written once."""
    optimizer: float
    """dist/: Adam's fp32 master copy and two moments (12 bytes per parameter in bf16, 8 in fp32), each
    distributed-optimizer shard written once."""
    hf: float
    """hf/: the HF export the engines and the next stage load (params x bytes of params_dtype)."""
    write_s: float
    """Seconds to write all of it at the assumed filesystem bandwidth (`swe-megatron plan --fs-write-gbps`)."""
    keep_last: int
    """checkpoint.keep_last: complete checkpoints kept after each commit."""

    @property
    def total(self) -> float:
        """Bytes of one unit's checkpoint."""
        return self.weights + self.optimizer + self.hf

    @property
    def live(self) -> float:
        """Peak bytes on the filesystem: keep_last checkpoints plus the one being written (older ones are deleted
        only after the new unit commits: train/checkpoint.py, pipeline/run_dir.py)."""
        return (self.keep_last + 1) * self.total


def estimate_checkpoint(m: ModelConfig, fs_write_gbps: float, keep_last: int) -> CheckpointEstimate:
    """Size and write time of one unit's checkpoint (every committed unit saves one; train/checkpoint.py saves
    the model and the optimizer through dist_checkpointing, the pipeline adds the HF export); GB/s = 1e9 B/s."""
    n = total_params(m)
    wbytes, opt_bytes = (4, 8) if m.params_dtype == "float32" else (2, 12)
    weights, optimizer, hf = n * wbytes, n * opt_bytes, n * wbytes
    return CheckpointEstimate(
        weights, optimizer, hf, (weights + optimizer + hf) / (fs_write_gbps * 1e9), keep_last
    )

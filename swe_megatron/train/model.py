"""The policy as a Megatron-Core GPTModel, built from a ModelConfig (Qwen2 / Qwen2.5 / Llama families).

Covers RMSNorm, SwiGLU, grouped-query attention, optional q/k/v bias, RoPE (plain or YaRN) and tied
or untied embeddings. YaRN uses Hugging Face's defaults (beta_fast 32, beta_slow 1, truncated
correction range, attention factor 0.1 ln(s) + 1, which Megatron-Core 0.19 applies to q and k).

The layer spec is Megatron's local (pure PyTorch) one on CPU and Transformer Engine's on GPU, chosen
by `ParallelConfig.transformer_impl` and availability. No process groups are created here (see
`parallel.py`); the TP/PP sizes only shape the parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from swe_megatron.config.schema import (
    ModelConfig,
    ParallelConfig,
    Recompute,
    TransformerImpl,
    max_positions,
)
from swe_megatron.train.hf_convert import load_hf_state

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def use_transformer_engine(parallel: ParallelConfig) -> bool:
    """Whether the Transformer Engine layer spec is used: by config, and only with CUDA and TE installed."""
    if parallel.transformer_impl == TransformerImpl.local:
        return False
    have = torch.cuda.is_available()
    if have:
        try:
            import transformer_engine  # noqa: F401
        except ImportError:
            have = False
    if parallel.transformer_impl == TransformerImpl.transformer_engine and not have:
        raise ValueError(
            "parallel.transformer_impl=transformer_engine needs CUDA and transformer-engine installed; "
            "use transformer_impl=auto or local here."
        )
    return have


def _have_fused_softmax() -> bool:
    """Whether the CUDA softmax kernels of `megatron.core.fusions.fused_softmax` are importable."""
    import importlib.util

    return all(
        importlib.util.find_spec(m) is not None
        for m in ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda")
    )


def transformer_config(model: ModelConfig, parallel: ParallelConfig, initialize: bool = True):
    """Megatron-Core TransformerConfig for `model` laid out as `parallel`.

    initialize=False: parameters are allocated but not initialised (weights will be loaded), on the GPU
    directly when there is one (no host copy of the stage, no full fp32 master weight per rank).
    """
    from megatron.core.transformer import TransformerConfig

    if model.architecture not in ("qwen2", "llama"):
        raise ValueError(f"model.architecture={model.architecture!r}: use qwen2 or llama.")
    dtype = _DTYPES[model.params_dtype]
    head_dim = model.hidden_size // model.num_attention_heads
    on_gpu = torch.cuda.is_available()
    cfg = TransformerConfig(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.intermediate_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_key_value_heads,
        kv_channels=head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=model.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=model.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        tensor_model_parallel_size=parallel.tensor_parallel,
        pipeline_model_parallel_size=parallel.pipeline_parallel,
        context_parallel_size=parallel.context_parallel,
        sequence_parallel=parallel.sequence_parallel,
        # Random init: same seed -> same full weights for every TP size, which makes layouts comparable (each
        # rank builds every full weight in fp32 on the host and keeps its slice). Weights to be loaded skip
        # that: at 72B it is a host copy of each rank's stage plus full fp32 masters, thrown away by the load.
        perform_initialization=initialize,
        use_cpu_initialization=initialize or not on_gpu,
        gradient_accumulation_fusion=False,
        # Local-spec attention's fused softmax imports Megatron's legacy kernels, which neither the
        # megatron-core wheel nor Transformer Engine ships: fuse only where they are installed.
        masked_softmax_fusion=on_gpu and _have_fused_softmax(),
        bias_activation_fusion=False,
        bias_dropout_fusion=on_gpu,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        pipeline_dtype=dtype,
        **_recompute_settings(parallel.recompute),
    )
    if model.rope_scaling.type == "yarn":
        _set_yarn(cfg, model)
    return cfg


def _recompute_settings(recompute: Recompute) -> dict:
    """TransformerConfig's activation-recomputation arguments for parallel.recompute."""
    if recompute == Recompute.full:
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    if recompute == Recompute.selective:
        return {"recompute_granularity": "selective"}
    return {}


def _set_yarn(cfg, model: ModelConfig) -> None:
    """GPTModel reads YaRN settings off the config; set them with HF's defaults (beta 32/1, truncated range)."""
    cfg.yarn_rotary_scaling_factor = model.rope_scaling.factor
    cfg.yarn_original_max_position_embeddings = model.rope_scaling.original_max_position_embeddings
    cfg.yarn_beta_fast = 32.0
    cfg.yarn_beta_slow = 1.0
    cfg.yarn_mscale = 1.0
    cfg.yarn_mscale_all_dim = 0.0
    cfg.yarn_correction_range_round_to_int = True


def layer_spec(parallel: ParallelConfig):
    """Transformer layer spec: Transformer Engine on GPU when chosen and available, local otherwise."""
    from megatron.core.models.gpt import gpt_layer_specs

    if use_transformer_engine(parallel):
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    return gpt_layer_specs.get_gpt_layer_local_spec(normalization="RMSNorm")


def build_model(
    model: ModelConfig,
    parallel: ParallelConfig,
    pre_process: bool = True,
    post_process: bool = True,
    initialize: bool = True,
):
    """A GPTModel for this rank's pipeline stage (pre/post_process: first/last stage).

    initialize=False leaves the parameters uninitialised, for a caller that loads weights next.

    Model-parallel state must be initialised (`parallel.init_model_parallel`) so TP/PP shard shapes and
    the RNG tracker are known. On a CUDA machine the model ends up on the current device.
    """
    from megatron.core.models.gpt import GPTModel

    cfg = transformer_config(model, parallel, initialize)
    yarn = model.rope_scaling.type == "yarn"
    module = GPTModel(
        config=cfg,
        transformer_layer_spec=layer_spec(parallel),
        vocab_size=model.vocab_size,
        max_sequence_length=max_positions(model),
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=model.tie_word_embeddings,
        position_embedding_type="yarn" if yarn else "rope",
        rotary_base=model.rope_theta,
    )
    if torch.cuda.is_available():
        # A random init is built on the CPU (same weights for any TP); train on the GPU.
        module.cuda(torch.cuda.current_device())
    return module


def _finalize_grads(model, num_tokens, **kwargs):
    # Losses already carry the global token denominator: reduce gradients without rescaling.
    from megatron.core.distributed import finalize_model_grads

    return finalize_model_grads(model, None, **kwargs)


def build_policy(
    model: ModelConfig,
    parallel: ParallelConfig,
    hf_state: Mapping[str, torch.Tensor] | None = None,
    initialize: bool = True,
):
    """This rank's stage of the policy, wrapped in Megatron's DDP for per-token losses.

    hf_state: HF-named weights to start from (e.g. `hf_convert.HFCheckpoint(folder)`, read on demand); None: a
    random init, or with initialize=False none at all (a checkpoint is loaded next).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    initialize = initialize and hf_state is None  # weights about to be loaded need no random init
    module = build_model(
        model, parallel, ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage(), initialize
    )
    if hf_state is not None:
        load_hf_state(module, hf_state, model, ps.get_tensor_model_parallel_rank(), parallel.tensor_parallel)
    cfg = module.config
    cfg.calculate_per_token_loss = True
    cfg.variable_seq_lengths = parallel.pipeline_parallel > 1
    cfg.finalize_model_grads_func = _finalize_grads
    ddp = DistributedDataParallel(
        config=cfg,
        ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=parallel.use_distributed_optimizer,
        ),
        module=module,
    )
    cfg.no_sync_func = ddp.no_sync
    return ddp

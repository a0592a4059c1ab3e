"""The policy as a Megatron-Core GPTModel, built from a ModelConfig (Qwen2 / Qwen2.5 / Llama families).

Covers RMSNorm, SwiGLU, grouped-query attention, optional q/k/v bias, RoPE (plain or YaRN) and tied
or untied embeddings. YaRN uses Hugging Face's defaults (beta_fast 32, beta_slow 1, truncated
correction range, attention factor 0.1 ln(s) + 1, which Megatron-Core 0.19 applies to q and k).

The layer spec is Megatron's local (pure PyTorch) one on CPU and Transformer Engine's on GPU, chosen
by `ParallelConfig.transformer_impl` and availability. No process groups are created here (see
`parallel.py`); the TP/PP sizes only shape the parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from swe_megatron.config.schema import (
    ModelConfig,
    ParallelConfig,
    Recompute,
    RopeScalingConfig,
    TransformerImpl,
    max_positions,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_config_from_hf(hf_config, name: str = "hf") -> ModelConfig:
    """A ModelConfig from a transformers config object of the Qwen2 or Llama family."""
    arch = hf_config.model_type
    if arch not in ("qwen2", "llama"):
        raise ValueError(f"model_type {arch!r} is not supported: use a Qwen2/Qwen2.5 or Llama checkpoint.")
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type"))
    scaling = RopeScalingConfig()
    if rope_type == "yarn":
        scaling = RopeScalingConfig(
            type="yarn",
            factor=float(rope["factor"]),
            original_max_position_embeddings=int(
                rope.get("original_max_position_embeddings", hf_config.max_position_embeddings)
            ),
        )
    elif rope_type not in (None, "default"):
        raise ValueError(f"rope type {rope_type!r} is not supported: use none or yarn.")
    # Llama's attention_bias also biases o_proj, mlp_bias the MLP: neither has a place in the GPTModel built here
    unsupported = {
        "attention_bias": arch == "llama" and bool(getattr(hf_config, "attention_bias", False)),
        "mlp_bias": bool(getattr(hf_config, "mlp_bias", False)),
        "head_dim": getattr(hf_config, "head_dim", None)
        not in (None, hf_config.hidden_size // hf_config.num_attention_heads),
    }
    if any(unsupported.values()):
        raise ValueError(
            f"{name}: {', '.join(k for k, v in unsupported.items() if v)} not supported (the weights would be "
            "dropped or misshaped): use a checkpoint without biases outside q/k/v and head_dim = hidden/heads."
        )
    theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    return ModelConfig(
        name=name,
        architecture=arch,
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_layers=hf_config.num_hidden_layers,
        num_attention_heads=hf_config.num_attention_heads,
        num_key_value_heads=hf_config.num_key_value_heads,
        # With YaRN a HF config's max_position_embeddings is the scaled length; ModelConfig keeps the native one.
        max_position_embeddings=scaling.original_max_position_embeddings
        if scaling.type == "yarn"
        else hf_config.max_position_embeddings,
        rope_theta=float(theta),
        rope_scaling=scaling,
        rms_norm_eps=hf_config.rms_norm_eps,
        qkv_bias=arch == "qwen2",
        tie_word_embeddings=bool(hf_config.tie_word_embeddings),
        params_dtype=str(getattr(hf_config, "dtype", None) or "float32").replace("torch.", ""),
    )


_SHAPE_KEYS = ("architecture", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
               "num_attention_heads", "num_key_value_heads", "rope_theta", "rms_norm_eps", "qkv_bias",
               "tie_word_embeddings")  # fmt: skip


def check_matches_hf(model: ModelConfig, folder) -> None:
    """Refuse a `model` config whose architecture differs from the config.json of the weights it starts from.

    The trainer builds its model from `model` and engines serve the trainer's own config.json, so a preset
    that disagreed with the checkpoint (rope theta, norm eps, tied head) would train and serve a model the
    weights were never trained as, silently. Rope scaling and context length are the run's choice, not checked.
    """
    from transformers import AutoConfig

    from swe_megatron.errors import UsageError
    from swe_megatron.model.hub import resolve_model_path

    hf = model_config_from_hf(AutoConfig.from_pretrained(resolve_model_path(folder)), name=str(folder))
    wrong = []
    for key in _SHAPE_KEYS:
        ours, theirs = getattr(model, key), getattr(hf, key)
        same = abs(ours - theirs) <= 1e-6 * abs(theirs) if isinstance(theirs, float) else ours == theirs
        if not same:
            wrong.append(f"model.{key}={ours!r} (config.json: {theirs!r})")
    if wrong:
        raise UsageError(
            f"model config does not match the weights in {folder}: {'; '.join(wrong)}. Set these keys to the "
            "checkpoint's values (or point model.hf_path at the checkpoint the preset describes)."
        )


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
    recompute = {}
    if parallel.recompute == Recompute.full:
        recompute = {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    elif parallel.recompute == Recompute.selective:
        recompute = {"recompute_granularity": "selective"}
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
        **recompute,
    )
    if model.rope_scaling.type == "yarn":
        # GPTModel reads YaRN settings off the config; HF defaults (beta 32/1, truncated range).
        cfg.yarn_rotary_scaling_factor = model.rope_scaling.factor
        cfg.yarn_original_max_position_embeddings = model.rope_scaling.original_max_position_embeddings
        cfg.yarn_beta_fast = 32.0
        cfg.yarn_beta_slow = 1.0
        cfg.yarn_mscale = 1.0
        cfg.yarn_mscale_all_dim = 0.0
        cfg.yarn_correction_range_round_to_int = True
    return cfg


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

"""The model description's Hugging Face side: a ModelConfig from a transformers config, the config.json a
ModelConfig is served and exported with, and the check that a preset matches the checkpoint it starts from.

The trainer (train/) and the engines (engine/) both read these; neither imports the other for them.
"""

from __future__ import annotations

import json
from pathlib import Path

import transformers
from transformers import AutoConfig

from swe_megatron.config.schema import ModelConfig, RopeScalingConfig, max_positions
from swe_megatron.errors import UsageError
from swe_megatron.model.hub import resolve_model_path

_HF_DTYPE = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def special_token_ids(folder: str | Path) -> dict:
    """{"bos_token_id", "eos_token_id"} of the tokenizer saved in `folder`: from its generation_config.json (which
    model/tokenizer.save_tokenizer writes from the tokenizer itself), else from its config.json; a tokenizer
    without a BOS token (Qwen2.5's) gives None for it. {} when the folder holds neither file with an eos id."""
    for name in ("generation_config.json", "config.json"):
        try:
            found = json.loads((Path(folder) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(found, dict) and found.get("eos_token_id") is not None:
            return {key: found.get(key) for key in ("bos_token_id", "eos_token_id")}
    return {}


def hf_config_dict(cfg: ModelConfig, token_ids: dict | None = None) -> dict:
    """The config.json of `cfg` as a transformers Qwen2/Llama config (what every engine starts from), written as
    transformers itself writes one (`dtype`, not the deprecated `torch_dtype`); token_ids: the tokenizer's
    `special_token_ids`, so that config.json and tokenizer agree on BOS and EOS."""
    qwen = cfg.architecture == "qwen2"
    out = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": cfg.architecture,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.hidden_size // cfg.num_attention_heads,
        "max_position_embeddings": max_positions(cfg),  # scaled with YaRN, as vLLM and transformers read it
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "dtype": _HF_DTYPE[cfg.params_dtype],
        "use_cache": True,
        # As the hub's config.json has it; without it transformers 5 takes the tokenizer next to it for an old
        # Mistral one and warns that its regex is wrong (in every engine log).
        "transformers_version": transformers.__version__,
        **(token_ids or {}),
    }
    if not qwen:
        out["attention_bias"] = cfg.qkv_bias
        out["mlp_bias"] = False
    if cfg.rope_scaling.type == "yarn":
        out["rope_scaling"] = {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": cfg.rope_scaling.factor,
            "original_max_position_embeddings": cfg.rope_scaling.original_max_position_embeddings,
        }
    return out


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

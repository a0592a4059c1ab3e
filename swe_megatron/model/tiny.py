"""Tiny random checkpoints of a ModelConfig's shape: what engines serve when model.hf_path is null (the
tiny presets, `engine_model_dir`), and the small models the tests compare trainer and engines on."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from swe_megatron.config.schema import ModelConfig
from swe_megatron.model.hf_config import hf_config_dict
from swe_megatron.model.tokenizer import save_tokenizer


def tiny_qwen2(cfg: ModelConfig, seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM of cfg's shape (real vocabulary size)."""
    torch.manual_seed(seed)
    fields = {k: v for k, v in hf_config_dict(cfg).items() if k not in ("model_type", "transformers_version")}
    hf_cfg = Qwen2Config(**fields, bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
    return Qwen2ForCausalLM(hf_cfg).float().eval()


def save_tiny_checkpoint(cfg: ModelConfig, out_dir: str | Path, seed: int = 0) -> Path:
    """A tiny random checkpoint folder vLLM can serve: weights (safetensors), config and tokenizer."""
    out = Path(out_dir)
    tiny_qwen2(cfg, seed).save_pretrained(str(out))
    save_tokenizer(cfg.tokenizer, out)
    return out

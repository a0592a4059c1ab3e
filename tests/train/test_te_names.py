"""HF <-> Megatron mapping under the Transformer Engine layer spec's parameter names (runs on CPU).

Megatron-Core 0.19.2's `get_gpt_layer_with_transformer_engine_submodules` builds linear_qkv and
linear_fc1 as TELayerNormColumnParallelLinear and leaves input_layernorm / pre_mlp_layernorm as
IdentityOp, so the two RMSNorm weights live in `linear_qkv.layer_norm_weight` and
`linear_fc1.layer_norm_weight` (TE 2.20.2's LayerNormLinear registers no layer_norm_bias for RMSNorm).
TE is not installable here, so these are the names of that spec; tests/train/test_gpu.py checks them
against a real TE model.
"""

from __future__ import annotations

import pytest
import torch

from swe_megatron.model.hf_config import model_config_from_hf
from swe_megatron.train import hf_convert

from ._workers import tiny_hf

TE_LAYER_PARAMS = [
    "self_attention.linear_qkv.layer_norm_weight",
    "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv.bias",
    "self_attention.linear_proj.weight",
    "mlp.linear_fc1.layer_norm_weight",
    "mlp.linear_fc1.weight",
    "mlp.linear_fc2.weight",
]
"""Parameters of one decoder layer of the TE spec (Qwen2: q/k/v bias, no other bias)."""
GLOBAL_PARAMS = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight"]


@pytest.mark.parametrize("tp", [1, 2])
def test_te_named_parameters_cover_and_round_trip_every_hf_tensor(tp):
    hf = tiny_hf()
    cfg = model_config_from_hf(hf.config)
    state = hf.state_dict()
    back = {}
    for layer in [None, *range(cfg.num_layers)]:
        for name in GLOBAL_PARAMS if layer is None else TE_LAYER_PARAMS:
            shards = [
                hf_convert.megatron_shard_from_hf(name, state.__getitem__, cfg, layer, r, tp)
                for r in range(tp)
            ]
            if name.endswith("layer_norm_weight") or name == "decoder.final_layernorm.weight":
                shards = shards[:1] * tp  # replicated over TP: every rank holds the same tensor
            back.update(hf_convert.hf_from_megatron_shards(name, shards, cfg, layer))
    assert back.keys() == state.keys()
    for key, tensor in state.items():
        assert torch.equal(back[key], tensor), key
    norm = hf_convert.megatron_shard_from_hf(
        "self_attention.linear_qkv.layer_norm_weight", state.__getitem__, cfg, 1, 0, tp
    )
    assert torch.equal(norm, state["model.layers.1.input_layernorm.weight"])

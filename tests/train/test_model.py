"""HF <-> Megatron-Core: logits equal transformers', round trips bit-exact, action-only logprobs exact."""

from __future__ import annotations

import pytest
import torch

from swe_megatron.config.schema import ParallelConfig
from swe_megatron.model.hf_config import model_config_from_hf
from swe_megatron.train import hf_convert, parallel
from swe_megatron.train.logprobs import action_logprobs, full_logprobs_reference
from swe_megatron.train.model import build_model

from ._workers import VOCAB, tiny_hf

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0}
CASES = {
    "qwen2": {},
    "qwen2-tied": {"tie": True},
    "qwen2-yarn": {"rope": YARN},
    "llama": {"arch": "llama"},
}


def megatron_from(hf):
    cfg = model_config_from_hf(hf.config)
    parallel.init_model_parallel(ParallelConfig(), seed=1)
    model = build_model(cfg, ParallelConfig()).eval()
    hf_convert.load_hf_state(model, hf.state_dict(), cfg, tp_rank=0, tp_size=1)
    return model, cfg


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers_and_round_trip_is_exact(megatron_world, case):
    hf = tiny_hf(**CASES[case])
    model, cfg = megatron_from(hf)
    ids = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(ids, torch.arange(48).expand(2, 48), None)
        theirs = hf(ids).logits
    diff = (ours - theirs).abs().max().item()
    print(f"{case}: max |logits - transformers| = {diff:.3g}")
    assert diff < 2e-5
    back = hf_convert.hf_state_of_stage(model, cfg)
    expected = {
        k: v for k, v in hf.state_dict().items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")
    }
    assert back.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(back[name], tensor), name


def test_yarn_config_is_read():
    cfg = model_config_from_hf(tiny_hf(rope=YARN).config)
    assert (
        cfg.rope_scaling.type,
        cfg.rope_scaling.factor,
        cfg.rope_scaling.original_max_position_embeddings,
    ) == (
        "yarn",
        4.0,
        32,
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_shards_reassemble_bit_exactly(tp):
    hf = tiny_hf()
    cfg = model_config_from_hf(hf.config)
    sd = hf.state_dict()
    names = [
        ("embedding.word_embeddings.weight", None),
        ("output_layer.weight", None),
        ("self_attention.linear_qkv.weight", 1),
        ("self_attention.linear_qkv.bias", 1),
        ("self_attention.linear_proj.weight", 1),
        ("mlp.linear_fc1.weight", 0),
        ("mlp.linear_fc2.weight", 0),
    ]
    if tp == 4:  # 2 KV heads cannot be split 4 ways: Megatron requires num_query_groups % TP == 0
        names = [n for n in names if "qkv" not in n[0]]
    for name, layer in names:
        shards = [
            hf_convert.megatron_shard_from_hf(name, sd.__getitem__, cfg, layer, r, tp) for r in range(tp)
        ]
        assert len({s.shape for s in shards}) == 1
        for key, tensor in hf_convert.hf_from_megatron_shards(name, shards, cfg, layer).items():
            assert torch.equal(tensor, sd[key]), key


def test_action_logprobs_equal_full_logits_reference(megatron_world):
    torch.manual_seed(0)
    s, b, h, v = 12, 3, 16, 50
    hidden = torch.randn(s, b, h, requires_grad=True)
    weight = torch.randn(v, h, requires_grad=True)
    rows = torch.tensor([0, 5, 11, 12, 20, 35])
    targets = torch.tensor([3, 7, 49, 0, 22, 8])
    ours = action_logprobs(hidden, weight, rows, targets, chunk=4)
    flat = hidden.transpose(0, 1).reshape(-1, h)
    ref = full_logprobs_reference(flat[rows] @ weight.t(), targets)
    assert torch.allclose(ours, ref, atol=1e-6, rtol=0)
    g_ours = torch.autograd.grad(ours.sum(), [hidden, weight])
    g_ref = torch.autograd.grad(ref.sum(), [hidden, weight])
    for a, r in zip(g_ours, g_ref):
        assert torch.allclose(a, r, atol=1e-6, rtol=0)


def test_a_preset_that_disagrees_with_its_checkpoint_is_refused(tmp_path):
    """The trainer builds from the preset, the engine serves the trainer's config.json: a preset whose shape or
    rope theta differs from the weights' own config.json must stop the run, not train a silently different model."""
    import dataclasses

    from swe_megatron.config.schema import ModelConfig
    from swe_megatron.errors import UsageError
    from swe_megatron.model.hf_config import check_matches_hf
    from swe_megatron.model.tiny import tiny_qwen2

    cfg = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=1,  # real vocabulary: tiny_qwen2 pads
                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    tiny_qwen2(cfg).save_pretrained(str(tmp_path))
    check_matches_hf(cfg, tmp_path)  # the same shape passes
    for key, value in [("rope_theta", 10000.0), ("tie_word_embeddings", True), ("rms_norm_eps", 1e-5),
                       ("num_key_value_heads", 4)]:  # fmt: skip
        with pytest.raises(UsageError, match=rf"model\.{key}=.*config\.json") as err:
            check_matches_hf(dataclasses.replace(cfg, **{key: value}), tmp_path)
        assert "\n" not in str(err.value)

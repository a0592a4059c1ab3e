"""Host memory at scale, measured on CPU: what the export holds on each rank (issue 13 item 5).

At 72B a full host copy of the weights is 145 GB; every rank of an 8-GPU node holding one is 1.16 TB. The
export must build full tensors only on the writing rank, and even there one shard at a time.
"""

from __future__ import annotations

import pytest
import torch

from swe_megatron.config.schema import ModelConfig, ParallelConfig

from ._workers import build_memory, export_memory, export_with_context_parallel, run_ranks

# ~136 MB of fp32 weights in many mid-sized tensors: a full copy stands out against one shard.
BIG = ModelConfig(name="mem", vocab_size=4096, hidden_size=512, intermediate_size=2048, num_layers=8,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128)  # fmt: skip


@pytest.mark.dist
def test_tp2_export_builds_full_tensors_only_on_the_writer_one_shard_at_a_time(tmp_path, monkeypatch):
    # A fixed mmap threshold makes glibc return freed blocks, so the peak shows what the export holds, not
    # what the allocator keeps cached (with its dynamic threshold the writer's peak is ~3x higher).
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    shard = 8 << 20
    par = ParallelConfig(tensor_parallel=2)
    results = run_ranks(export_memory, 2, tmp_path / "out", BIG, par, str(tmp_path / "hf"), shard)
    full = results[0]["report"].bytes
    for r in results:
        print(
            f"TP rank {r['tp_rank']}: export peak {r['peak'] / 2**20:.1f} MiB (model {full / 2**20:.1f} MiB)"
        )
    writer, other = sorted(results, key=lambda r: r["tp_rank"])
    assert full > 120 << 20
    assert other["peak"] < 0.1 * full, "a non-writing rank built a copy of the weights"
    assert writer["peak"] < 0.3 * full, "the writer held more than about one shard"


@pytest.mark.dist
def test_with_context_parallel_one_rank_writes_and_bytes_count_once(tmp_path):
    from safetensors.torch import load_file

    cfg = ModelConfig(name="cp", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    results = run_ranks(export_with_context_parallel, 2, tmp_path / "out", cfg, str(tmp_path / "hf"))
    assert sorted(r["cp_rank"] for r in results) == [0, 1]
    on_disk = sum(
        t.numel() * t.element_size()
        for f in (tmp_path / "hf").glob("*.safetensors")
        for t in load_file(str(f)).values()
    )
    for r in results:
        assert r["report"].bytes == on_disk, "weight_sync/gib counts each context-parallel rank's copy"


# Embedding and output layer dominate: each is 64 MiB in full, 32 MiB per TP rank.
WIDE = ModelConfig(name="wide", vocab_size=65536, hidden_size=256, intermediate_size=256, num_layers=1,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip


@pytest.mark.dist
def test_a_model_whose_weights_will_be_loaded_builds_no_full_master_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    par = ParallelConfig(tensor_parallel=2)
    loaded = run_ranks(build_memory, 2, tmp_path / "a", WIDE, par, False)
    random = run_ranks(build_memory, 2, tmp_path / "b", WIDE, par, True)
    full = 2 * loaded[0]["own"]
    for a, b in zip(loaded, random):
        print(f"build peak: {a['peak'] / 2**20:.1f} MiB to be loaded, {b['peak'] / 2**20:.1f} MiB random "
              f"(own shards {a['own'] / 2**20:.1f} MiB)")  # fmt: skip
        assert not a["perform_initialization"] and b["perform_initialization"]
        assert b["peak"] > full  # the random init: full fp32 masters on every rank, then its slice
        assert a["peak"] < 0.1 * full  # to be loaded: allocated, not initialised


@pytest.mark.dist
def test_trainer_skips_the_random_init_when_weights_are_loaded(megatron_world):
    from swe_megatron.model.hf_config import model_config_from_hf
    from swe_megatron.train import parallel
    from swe_megatron.train.step import Trainer

    from ._workers import OPTIM, tiny_hf

    hf = tiny_hf()
    cfg, par = model_config_from_hf(hf.config), ParallelConfig()
    parallel.init_model_parallel(par, seed=1)
    for kwargs, want in (({}, True), ({"hf_state": hf.state_dict()}, False), ({"initialize": False}, False)):
        trainer = Trainer(cfg, par, OPTIM, total_steps=1, **kwargs)
        assert trainer.model.module.config.perform_initialization is want, kwargs


def test_a_bf16_trainer_resumed_from_a_weights_only_checkpoint_trains_from_those_weights(
    tmp_path, megatron_world
):
    """A checkpoint saved before the first optimiser step holds no optimiser state. Loading it into a trainer
    built without an init must also refresh the optimiser's fp32 main weights (bf16 keeps them apart), or the
    first step writes the uninitialised memory back into the model."""
    import dataclasses

    from swe_megatron.model.hf_config import model_config_from_hf
    from swe_megatron.train import parallel
    from swe_megatron.train.step import LossSpec, Trainer

    from ._workers import OPTIM, batch, tiny_hf

    hf = tiny_hf()
    cfg = dataclasses.replace(model_config_from_hf(hf.config), params_dtype="bfloat16")
    par = ParallelConfig(micro_batch_tokens=64)
    parallel.init_model_parallel(par, seed=1)
    straight = Trainer(cfg, par, OPTIM, total_steps=4, hf_state=hf.state_dict())
    straight.save(str(tmp_path / "ckpt"))
    resumed = Trainer(cfg, par, OPTIM, total_steps=4, initialize=False)
    resumed.load(str(tmp_path / "ckpt"))
    for t in (straight, resumed):
        t.update(batch(4), 1, LossSpec("sft"))
    pairs = zip(straight.model.module.named_parameters(), resumed.model.module.named_parameters())
    for (name, a), (_, b) in pairs:
        assert torch.equal(a, b), name

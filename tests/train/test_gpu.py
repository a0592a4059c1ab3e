"""GPU wiring, each against a reference run on the same machine (CUDA + NCCL; skipped without CUDA).

Transformer Engine layer spec, bf16, YaRN, activation recomputation, the distributed optimizer, sequence
parallelism and context parallelism are switched on through ParallelConfig / ModelConfig exactly as the
presets do, and one DAPO update must give the same losses, gradients and weights as the plain layout
(within each feature's numerical tolerance). Multi-GPU cases skip when fewer GPUs are visible, TE cases
when transformer_engine is not importable. Each run is a fresh process per rank (`run_ranks`), so no
NCCL state leaks between tests. Also: a TE-spec export reloaded by transformers gives the trainer's
logprobs, and one optimiser step of a ~3B Qwen2.5 shape stays within train/memory_plan.py's estimate.
`tools/gpu_check.sh` runs this file on one GPU machine.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from swe_megatron.config.schema import ParallelConfig, Recompute, TransformerImpl
from swe_megatron.model.hf_config import model_config_from_hf

from ._workers import OPTIM, batch, run_ranks, tiny_hf, train_and_capture

pytestmark = pytest.mark.gpu

HF = tiny_hf()
CFG = model_config_from_hf(HF.config)
BF16 = dataclasses.replace(CFG, params_dtype="bfloat16")
SAMPLES = batch(8)
STEPS = 2


def need(gpus: int = 1, te: bool = False) -> None:
    """Skip unless this many GPUs (and Transformer Engine, if asked) are present."""
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs, {torch.cuda.device_count()} visible")
    if te:
        pytest.importorskip("transformer_engine")


def run(tmp_path, name: str, world: int, cfg, par: ParallelConfig, hf=HF) -> dict:
    """Rank 0's result of one update of SAMPLES under `par` on `world` GPUs, starting from `hf`'s weights."""
    return run_ranks(train_and_capture, world, tmp_path / name, cfg, par, hf.state_dict(), SAMPLES, STEPS)[0]


def close(run_: dict, ref: dict, label: str, loss_rtol: float, grad_rtol: float, grads: bool = True) -> None:
    """Losses of every step within loss_rtol; last-step gradients within grad_rtol of the largest one."""
    losses = [m["loss"] for m in run_["metrics"]]
    ref_losses = [m["loss"] for m in ref["metrics"]]
    scale = max(t.abs().max().item() for t in ref["grads"].values())
    dg = max((run_["grads"][k].float() - ref["grads"][k].float()).abs().max().item() for k in ref["grads"])
    print(f"{label}: losses {losses} vs {ref_losses}; max grad diff {dg:.3g} (max grad {scale:.3g})")
    assert [m["action_tokens"] for m in run_["metrics"]] == [m["action_tokens"] for m in ref["metrics"]]
    assert losses == pytest.approx(ref_losses, rel=loss_rtol, abs=loss_rtol)
    if grads:
        assert dg <= grad_rtol * scale


def par(**kw) -> ParallelConfig:
    """A ParallelConfig with small micro-batches (several per step) and the given changes."""
    return ParallelConfig(micro_batch_tokens=64, **kw)


LOCAL = par(transformer_impl=TransformerImpl.local)
TE = par(transformer_impl=TransformerImpl.transformer_engine)


def test_transformer_engine_spec_equals_local_spec(tmp_path):
    need(1, te=True)
    ref = run(tmp_path, "local", 1, CFG, LOCAL)
    close(run(tmp_path, "te", 1, CFG, TE), ref, "TE vs local spec (fp32)", 1e-4, 1e-3)


def test_bf16_tracks_fp32(tmp_path):
    need(1)
    ref = run(tmp_path, "fp32", 1, CFG, par())
    close(run(tmp_path, "bf16", 1, BF16, par()), ref, "bf16 vs fp32", 3e-2, 1e-1)


@pytest.mark.parametrize("recompute", [Recompute.full, Recompute.selective])
def test_recomputation_changes_nothing(tmp_path, recompute):
    need(1)
    impl = TransformerImpl.auto
    ref = run(tmp_path, "none", 1, CFG, par(transformer_impl=impl))
    got = run(tmp_path, recompute.value, 1, CFG, par(transformer_impl=impl, recompute=recompute))
    close(got, ref, f"recompute={recompute.value} vs none", 1e-6, 1e-5)


def test_distributed_optimizer_bf16_on_two_gpus(tmp_path):
    need(2)
    ref = run(tmp_path, "dp1", 1, BF16, par())
    got = run(tmp_path, "dp2-do", 2, BF16, par(use_distributed_optimizer=True))
    # main_grad is only complete on each rank's own shard after the reduce-scatter: compare losses.
    close(got, ref, "bf16 DP2 distributed optimizer vs DP1", 3e-2, 0, grads=False)


def test_sequence_parallel_tp2_equals_tp1(tmp_path):
    need(2, te=True)
    ref = run(tmp_path, "tp1", 1, CFG, TE)
    got = run(
        tmp_path,
        "tp2-sp",
        2,
        CFG,
        par(transformer_impl="transformer_engine", tensor_parallel=2, sequence_parallel=True),
    )
    close(got, ref, "TP2 + sequence parallel vs TP1 (fp32, TE)", 1e-4, 1e-3)


def test_context_parallel_cp2_equals_cp1(tmp_path):
    # TE's context-parallel attention runs in the fused/flash kernels, which take bf16 only.
    need(2, te=True)
    ref = run(tmp_path, "cp1", 1, BF16, TE)
    got = run(tmp_path, "cp2", 2, BF16, par(transformer_impl="transformer_engine", context_parallel=2))
    close(got, ref, "CP2 vs CP1 (bf16, TE)", 3e-2, 1e-1)


def test_context_and_sequence_parallel_with_tp2_cp2_on_four_gpus(tmp_path):
    need(4, te=True)
    ref = run(tmp_path, "ref", 1, BF16, TE)
    layout = par(
        transformer_impl="transformer_engine", tensor_parallel=2, context_parallel=2, sequence_parallel=True
    )
    close(run(tmp_path, "tp2cp2", 4, BF16, layout), ref, "TP2 SP CP2 vs one GPU (bf16, TE)", 3e-2, 1e-1)


# Positions past original_max_position_embeddings (SAMPLES go up to 40 tokens) use YaRN's scaled
# frequencies and attention factor; max_position_embeddings (128) = factor x original, as HF expects.
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0}
HF_YARN = tiny_hf(rope=YARN)
CFG_YARN = model_config_from_hf(HF_YARN.config)
BF16_YARN = dataclasses.replace(CFG_YARN, params_dtype="bfloat16")


def test_te_bf16_yarn_tracks_local_fp32(tmp_path):
    need(1, te=True)
    assert CFG_YARN.rope_scaling.type == "yarn"
    ref = run(tmp_path, "local-fp32", 1, CFG_YARN, LOCAL, HF_YARN)
    got = run(tmp_path, "te-bf16", 1, BF16_YARN, TE, HF_YARN)
    close(got, ref, "TE bf16 YaRN vs local fp32 YaRN", 3e-2, 1e-1)


def test_te_bf16_yarn_cp2_tracks_local_fp32(tmp_path):
    need(2, te=True)
    ref = run(tmp_path, "local-fp32", 1, CFG_YARN, LOCAL, HF_YARN)
    cp2 = par(transformer_impl=TransformerImpl.transformer_engine, context_parallel=2)
    close(
        run(tmp_path, "te-bf16-cp2", 2, BF16_YARN, cp2, HF_YARN),
        ref,
        "TE bf16 YaRN CP2 vs local fp32",
        3e-2,
        1e-1,
    )


def export_and_score(rank, model_cfg, par_: ParallelConfig, hf_state, samples, out):
    """Worker: one SFT update, export to `out`, then the trainer's logprobs of `samples` and its parameter names."""
    from swe_megatron.train import parallel
    from swe_megatron.train.step import LossSpec, Trainer

    parallel.init_model_parallel(par_, seed=1)
    trainer = Trainer(model_cfg, par_, OPTIM, total_steps=4, hf_state=hf_state)
    trainer.update(samples, 1, LossSpec("sft"))
    trainer.export(out)
    mbs = trainer._my_microbatches(samples, list(range(len(samples))))
    trainer.logprobs(mbs)
    scored = [(mb.tokens.cpu(), mb.rows.cpu(), mb.targets.cpu(), mb.old_logprobs.cpu()) for mb in mbs]
    return {"names": [n for n, _ in trainer.model.module.named_parameters()], "scored": scored}


def test_te_spec_export_reloads_in_transformers_with_equal_logprobs(tmp_path):
    need(1, te=True)
    from transformers import AutoModelForCausalLM

    from swe_megatron.train.logprobs import full_logprobs_reference

    from .test_te_names import TE_LAYER_PARAMS

    out = tmp_path / "hf"
    res = run_ranks(
        export_and_score, 1, tmp_path / "run", CFG_YARN, TE, HF_YARN.state_dict(), SAMPLES, str(out)
    )[0]
    layer0 = sorted(
        n.removeprefix("decoder.layers.0.") for n in res["names"] if n.startswith("decoder.layers.0.")
    )
    assert layer0 == sorted(TE_LAYER_PARAMS), "the TE spec's parameter names changed: update hf_convert"
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).cuda().eval()
    worst = 0.0
    with torch.no_grad():
        for tokens, rows, targets, ours in res["scored"]:
            logits = loaded(tokens.cuda()).logits.float()
            theirs = full_logprobs_reference(
                logits.reshape(-1, logits.shape[-1])[rows.cuda()], targets.cuda()
            )
            worst = max(worst, (theirs.cpu() - ours).abs().max().item())
    print(f"TE-spec export (fp32, YaRN) vs trainer: max |logprob diff| = {worst:.3g}")
    assert worst < 1e-3


# A Qwen2.5-3B shape (3.09B parameters, tied embeddings): bf16 weights + fp32 grads + Adam = 18 B/param,
# ~52 GiB, fits one 80 GB H100 without the distributed optimizer.
SHAPE_3B = dict(
    hidden_size=2048,
    intermediate_size=11008,
    num_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    tie_word_embeddings=True,
    params_dtype="bfloat16",
)
LENGTH_3B = 4096


def one_step_memory(rank, model_cfg, par_: ParallelConfig, length: int):
    """Worker: random-init Trainer, one SFT step on one `length`-token trajectory; peak CUDA memory and time."""
    import time

    # The Adam class Megatron picked: TE's or Apex's fused one, or torch's AdamW.
    from megatron.core.optimizer import Adam

    from swe_megatron.train import parallel
    from swe_megatron.train.packing import TrainSample
    from swe_megatron.train.step import LossSpec, Trainer

    parallel.init_model_parallel(par_, seed=0)
    start = time.perf_counter()
    trainer = Trainer(model_cfg, par_, OPTIM, total_steps=2)
    built = time.perf_counter() - start
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(length, generator=g) < 0.5
    mask[0] = False
    sample = TrainSample(torch.randint(0, model_cfg.vocab_size, (length,), generator=g), mask)
    start = time.perf_counter()
    metrics = trainer.update([sample], 1, LossSpec("sft"))
    torch.cuda.synchronize()
    return {
        "peak": torch.cuda.max_memory_allocated(),
        "params": sum(p.numel() for p in trainer.model.module.parameters()),
        "build_s": built,
        "step_s": time.perf_counter() - start,
        "loss": metrics[0]["loss"],
        "te": any("layer_norm_weight" in n for n, _ in trainer.model.module.named_parameters()),
        "gpu_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
        "adam": f"{Adam.__module__}.{Adam.__name__}",
    }


def test_3b_one_step_within_memory_plan(tmp_path):
    need(1)
    from swe_megatron.config.schema import ModelConfig
    from swe_megatron.train.memory_plan import GIB, estimate, total_params

    if torch.cuda.get_device_properties(0).total_memory < 75 * GIB:
        pytest.skip("the 3B step needs an 80 GB GPU")
    cfg = dataclasses.replace(ModelConfig(), **SHAPE_3B)
    layout_par = ParallelConfig(recompute=Recompute.full, micro_batch_tokens=LENGTH_3B)
    res = run_ranks(one_step_memory, 1, tmp_path / "3b", cfg, layout_par, LENGTH_3B)[0]
    fused = not res["adam"].startswith("torch.")
    plan = estimate(
        cfg, LENGTH_3B, 1, 1, 1, 1, gpu_gib=res["gpu_gib"], distributed_optimizer=False, fused_adam=fused
    )
    peak = res["peak"] / GIB
    print(
        f"3B ({res['params'] / 1e9:.2f}B params, {'TE' if res['te'] else 'local'} spec, bf16, full recompute, "
        f"{LENGTH_3B} tokens): measured peak {peak:.2f} GiB (torch.cuda.max_memory_allocated); plan "
        f"{plan.total:.2f} GiB = weights {plan.weights:.2f} + grads {plan.grads:.2f} + Adam {plan.optimizer:.2f}"
        f" + max(activations {plan.activations:.2f}, {res['adam']}'s step {plan.step_temp:.2f})"
        f" + overhead {plan.overhead:.2f}; build {res['build_s']:.0f} s, "
        f"step {res['step_s']:.1f} s, loss {res['loss']:.3f}"
    )
    assert res["params"] == total_params(cfg)
    assert torch.isfinite(torch.tensor(res["loss"]))
    # The plan must not under-estimate (its fixed overhead covers allocator slack) nor be far above.
    assert peak <= plan.total
    assert peak >= 0.8 * (plan.total - plan.overhead)

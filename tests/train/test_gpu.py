"""GPU wiring, each against a reference run on the same machine (CUDA + NCCL; skipped without CUDA).

Transformer Engine layer spec, bf16, activation recomputation, the distributed optimizer, sequence
parallelism and context parallelism are switched on through ParallelConfig / ModelConfig exactly as the
presets do, and one DAPO update must give the same losses, gradients and weights as the plain layout
(within each feature's numerical tolerance). Multi-GPU cases skip when fewer GPUs are visible. Each run
is a fresh process per rank (`run_ranks`), so no NCCL state leaks between tests.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from swe_megatron.config.schema import ParallelConfig, Recompute, TransformerImpl
from swe_megatron.train.model import model_config_from_hf

from ._workers import batch, run_ranks, tiny_hf, train_and_capture

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


def run(tmp_path, name: str, world: int, cfg, par: ParallelConfig) -> dict:
    """Rank 0's result of one update of SAMPLES under `par` on `world` GPUs."""
    return run_ranks(train_and_capture, world, tmp_path / name, cfg, par, HF.state_dict(), SAMPLES, STEPS)[0]


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

"""Layout invariance on real Megatron-Core over gloo: TP=2, PP=2, DP=2 and micro-batch size change nothing.

The reference is one rank running the whole batch. Each comparison checks the reported loss of every
optimiser step, the gradients of the last step (HF names, gathered over TP and stages) and the weights
after the update. A checkpoint saved at TP=2 is resumed at TP=1 and must continue like an
uninterrupted TP=1 run.
"""

from __future__ import annotations

import json

import pytest
import torch

from swe_megatron.config.schema import ParallelConfig
from swe_megatron.model.hf_config import model_config_from_hf
from swe_megatron.train.step import LossSpec, Trainer

from ._workers import OPTIM, batch, capture, layouts, run_ranks, tiny_hf, train_and_capture

STEPS = 2
HF = tiny_hf()
CFG = model_config_from_hf(HF.config)
SAMPLES = batch(8)
LATER = batch(6, seed=11)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def assert_same_run(run: dict, ref: dict, label: str) -> None:
    losses = [m["loss"] for m in run["metrics"]]
    ref_losses = [m["loss"] for m in ref["metrics"]]
    # The distributed optimizer reduce-scatters: each rank's main_grad is only right on its own shard.
    dg = max_diff(run["grads"], ref["grads"]) if "grads" in run else 0.0
    dw = max_diff(run["weights"], ref["weights"])
    scale = max(t.abs().max().item() for t in ref["grads"].values())
    print(
        f"{label}: losses {losses} vs {ref_losses}; max grad diff {dg:.3g} (max grad {scale:.3g}); weights {dw:.3g}"
    )
    assert [m["action_tokens"] for m in run["metrics"]] == [m["action_tokens"] for m in ref["metrics"]]
    assert losses == pytest.approx(ref_losses, abs=1e-6, rel=1e-6)
    # Last step's grads: taken at weights that already carry the first step's rounding (see below).
    assert dg <= 2e-6 * scale
    # Adam's first steps move each weight by about lr whatever the gradient's size, so weights agree to a
    # fraction of lr (near-zero gradients may differ in rounding); the gradients above are the tight check.
    assert dw < 5e-2 * OPTIM.lr


@pytest.fixture(scope="module")
def reference(megatron_world):
    return train_and_capture(0, CFG, ParallelConfig(micro_batch_tokens=64), HF.state_dict(), SAMPLES, STEPS)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layouts")
    results = run_ranks(layouts, 2, tmp / "out", CFG, HF.state_dict(), SAMPLES, STEPS, str(tmp / "ckpt"))
    return results, tmp / "ckpt" / "ckpt"


def test_micro_batch_size_does_not_change_the_step(reference):
    one_each = train_and_capture(
        0, CFG, ParallelConfig(micro_batch_tokens=1), HF.state_dict(), SAMPLES, STEPS
    )
    assert_same_run(one_each, reference, "micro_batch_tokens 1 vs 64")


def test_sft_step_is_micro_batch_invariant_too(megatron_world):
    runs = [
        train_and_capture(
            0, CFG, ParallelConfig(micro_batch_tokens=t), HF.state_dict(), SAMPLES, 1, kind="sft"
        )
        for t in (1, 4096)
    ]
    assert_same_run(runs[0], runs[1], "sft micro_batch_tokens 1 vs 4096")


@pytest.mark.dist
@pytest.mark.parametrize("layout", ["tp2", "pp2", "dp2"])
def test_two_rank_layout_equals_one_rank(two_ranks, reference, layout):
    results, _ = two_ranks
    for rank in (0, 1):
        assert_same_run(results[rank][layout], reference, f"{layout} rank {rank}")


@pytest.mark.dist
def test_distributed_optimizer_equals_one_rank(two_ranks, reference):
    results, _ = two_ranks
    for rank in (0, 1):
        run = {k: v for k, v in results[rank]["dp2-distopt"].items() if k != "grads"}
        assert_same_run(run, reference, f"dp2 distributed optimizer rank {rank}")


@pytest.mark.dist
@pytest.mark.parametrize("layout", ["tp2", "pp2", "dp2"])
def test_export_from_two_ranks_is_the_gathered_model(two_ranks, layout):
    from safetensors.torch import load_file

    results, ckpt = two_ranks
    folder = ckpt.parent / f"export-{layout}"
    # several shards have an index; one is model.safetensors alone, as HF writes it
    index, one = folder / "model.safetensors.index.json", {"model.safetensors"}
    files = set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else one
    exported = {k: v for f in files for k, v in load_file(str(folder / f)).items()}
    assert not list(ckpt.parent.glob("*.tmp"))
    assert exported.keys() == results[0][layout]["weights"].keys()
    for name, tensor in results[0][layout]["weights"].items():
        assert torch.equal(exported[name], tensor), name
    report = results[0][layout]["export"]
    print(f"{layout} export: {report.files} files, {report.bytes} bytes, {report.seconds * 1e3:.1f} ms")
    if layout == "pp2":
        assert report.files == 2 and index.exists()  # one shard per pipeline stage, written by that stage
    else:
        assert files == one and not index.exists()


@pytest.mark.dist
def test_checkpoint_saved_at_tp2_resumes_at_tp1_like_an_uninterrupted_run(two_ranks, megatron_world):
    from swe_megatron.train import parallel

    _, ckpt = two_ranks
    par = ParallelConfig(micro_batch_tokens=64)
    parallel.init_model_parallel(par, seed=1)
    straight = Trainer(CFG, par, OPTIM, total_steps=10, hf_state=HF.state_dict())
    straight.update(SAMPLES, STEPS, LossSpec())
    want = straight.update(LATER, STEPS, LossSpec())
    want_state = capture(straight)

    parallel.init_model_parallel(par, seed=1)
    resumed = Trainer(
        CFG, par, OPTIM, total_steps=10
    )  # random init: everything must come from the checkpoint
    resumed.load(str(ckpt))
    assert resumed.steps_done == STEPS
    got = resumed.update(LATER, STEPS, LossSpec())
    got_state = capture(resumed)
    assert_same_run({"metrics": got, **got_state}, {"metrics": want, **want_state}, "resume at TP1 from TP2")
    assert [m["lr"] for m in got] == [m["lr"] for m in want]


@pytest.mark.dist
def test_a_data_parallel_rank_without_samples_still_joins_the_step(tmp_path, megatron_world):
    """3 samples in 2 optimiser steps over DP=2: the second step has one sample, so one rank gets none. That
    rank must still run forward/backward (a zero-weight micro-batch) and join the gradient reduction; the
    update equals one rank training on the same samples."""
    samples = batch(3, seed=5)
    par = ParallelConfig(micro_batch_tokens=64)
    ref = train_and_capture(0, CFG, par, HF.state_dict(), samples, 2)
    results = run_ranks(train_and_capture, 2, tmp_path, CFG, par, HF.state_dict(), samples, 2, timeout_s=240)
    for rank in (0, 1):
        assert_same_run(results[rank], ref, f"dp2 with an empty rank, rank {rank}")


@pytest.mark.dist
def test_ranks_wait_for_rank_zeros_engine_reload_on_the_driver_group(tmp_path):
    """Rank 0 reloads the engines (minutes at 72B) while the others wait: on the driver's gloo group with its
    long timeout, not on the default group, whose timeout (NCCL's watchdog on GPUs) is shorter."""
    from swe_megatron.train import parallel

    from ._workers import sync_with_slow_reload

    out = str(tmp_path / "hf")
    r0, r1 = run_ranks(sync_with_slow_reload, 2, tmp_path / "ranks", CFG, out, parallel.free_port(), 5.0, 12.0,
                       timeout_s=300)  # fmt: skip
    assert r0["reloaded"] == [out] and r1["reloaded"] is None
    assert r0["reload_s"] >= 12.0

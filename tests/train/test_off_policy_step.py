"""algo.off_policy in a real Megatron-Core DAPO update on CPU: the weights reach the loss, masking removes whole
trajectories, the metrics come back, and with the correction off nothing changes."""

from __future__ import annotations

import pytest
import torch

from swe_megatron.algo.off_policy import off_policy_weights
from swe_megatron.config.schema import OffPolicyConfig, ParallelConfig
from swe_megatron.model.hf_config import model_config_from_hf
from swe_megatron.train import parallel
from swe_megatron.train.step import LossSpec, Trainer

from ._workers import OPTIM, batch, tiny_hf

NEW_KEYS = {
    "is_weight_mean",
    "is_weight_max",
    "is_clipped_frac",
    "masked_trajectories",
    "masked_trajectories_frac",
}


@pytest.fixture(scope="module")
def make_trainer(megatron_world):
    hf = tiny_hf()
    cfg = model_config_from_hf(hf.config)
    par = ParallelConfig(micro_batch_tokens=64)
    parallel.init_model_parallel(par, seed=1)
    return lambda: Trainer(cfg, par, OPTIM, total_steps=2, hf_state=hf.state_dict())


def _update(make_trainer, **off) -> dict[str, float]:
    (metrics,) = make_trainer().update(batch(4), 1, LossSpec("dapo", off_policy=OffPolicyConfig(**off)))
    return metrics


def test_truncated_weights_reach_the_loss(make_trainer):
    samples = batch(4)
    # Expected from the trainer's own old logprobs: at the step's first (only) forward the ratio is 1, so the loss
    # is -sum_t A_t w_t / N with w_t = min(exp(old_t - engine_t), 1).
    t = make_trainer()
    mbs = t._my_microbatches(samples, list(range(len(samples))))
    t.logprobs(mbs)
    weighted, plain, n, ws = 0.0, 0.0, 0, []
    for mb in mbs:
        w, _ = off_policy_weights(mb.old_logprobs, mb.engine_logprobs, torch.ones_like(mb.targets, dtype=bool), 1.0,
                                  None, mb.rows // mb.tokens.shape[1])  # fmt: skip
        weighted += float((mb.advantages.double() * w.double()).sum())
        plain += float(mb.advantages.double().sum())
        n += mb.num_action_tokens
        ws.append(w)
    ws = torch.cat(ws)
    on = _update(make_trainer, tis_cap=1.0)
    off = _update(make_trainer)
    assert on["loss"] == pytest.approx(-weighted / n, rel=1e-5)
    assert off["loss"] == pytest.approx(-plain / n, rel=1e-5)
    assert 0.0 < on["is_clipped_frac"] < 1.0 and on["is_clipped_frac"] == pytest.approx(
        float((ws == 1.0).double().mean())
    )
    assert on["is_weight_mean"] == pytest.approx(float(ws.double().mean()), rel=1e-6)
    assert on["is_weight_max"] == 1.0
    assert not NEW_KEYS & off.keys()  # off: no tag at all, and the paper's loss
    assert {"is_weight_mean", "is_weight_max", "is_clipped_frac"} <= on.keys()
    assert not {"masked_trajectories", "masked_trajectories_frac"} & on.keys()


def test_masked_trajectories_take_no_part_in_the_update(make_trainer):
    every = _update(make_trainer, mask_threshold=1e-9)  # every trajectory's mean log ratio is above it
    assert every["masked_trajectories"] == 4 and every["masked_trajectories_frac"] == 1.0
    assert every["loss"] == 0.0 and every["grad_norm"] == 0.0
    none = _update(make_trainer, mask_threshold=100.0)
    assert none["masked_trajectories"] == 0 and none["masked_trajectories_frac"] == 0.0
    assert none["loss"] == _update(make_trainer)["loss"] and none["grad_norm"] > 0


def test_packing_does_not_change_the_corrected_step(megatron_world):
    # One trajectory per micro-batch vs several packed in one: the masking must find each packed row's tokens.
    hf = tiny_hf()
    cfg = model_config_from_hf(hf.config)
    off = OffPolicyConfig(tis_cap=1.0, mask_threshold=0.05)
    runs = []
    for tokens in (1, 4096):
        par = ParallelConfig(micro_batch_tokens=tokens)
        parallel.init_model_parallel(par, seed=1)
        trainer = Trainer(cfg, par, OPTIM, total_steps=2, hf_state=hf.state_dict())
        runs.append(trainer.update(batch(8), 2, LossSpec("dapo", off_policy=off)))
    for a, b in zip(*runs):
        assert a.keys() == b.keys() and a == pytest.approx(b, rel=1e-6, abs=1e-9)
    assert 0 < runs[0][0]["masked_trajectories"] < 8


@pytest.mark.dist
def test_context_parallel_ranks_mask_whole_trajectories(tmp_path):
    from swe_megatron.algo.off_policy import segment_log_ratios
    from swe_megatron.train.packing import pack

    from ._workers import off_policy_with_context_parallel, run_ranks

    hf = tiny_hf()
    samples, off = batch(8), OffPolicyConfig(tis_cap=1.2, mask_threshold=0.1)
    results = run_ranks(
        off_policy_with_context_parallel, 2, tmp_path, model_config_from_hf(hf.config), samples, off
    )
    # The one-rank reference over the same made-up logprobs (same generator, same packing).
    g = torch.Generator().manual_seed(0)
    masked, total, w_sum, n = 0, 0, 0.0, 0
    for mb in pack(samples, 64, pad_multiple=4):
        old = mb.engine_logprobs + 0.3 * torch.randn(mb.num_action_tokens, generator=g)
        seg = mb.rows // mb.tokens.shape[1]
        sums = segment_log_ratios(
            old, mb.engine_logprobs, torch.ones_like(seg, dtype=bool), seg, mb.tokens.shape[0]
        )
        masked += int(((sums[:, 0] / sums[:, 1]).abs() > 0.1).sum())
        total += int((sums[:, 2] > 0).sum())
        w_sum += float(torch.exp(old - mb.engine_logprobs).clamp(max=1.2).sum())
        n += mb.num_action_tokens
    assert 0 < masked < total
    for r in results:
        for w, ref in zip(r["weights"], r["reference"]):
            torch.testing.assert_close(w, ref, rtol=0, atol=0)  # each rank decides on whole trajectories
        assert r["metrics"]["masked_trajectories"] == masked  # counted once, not once per CP rank
        assert r["metrics"]["masked_trajectories_frac"] == pytest.approx(masked / total)
        assert r["metrics"]["is_weight_mean"] == pytest.approx(w_sum / n, rel=1e-6)


@pytest.mark.dist
def test_pipeline_and_data_parallel_ranks_train_like_one(tmp_path, megatron_world):
    from ._workers import corrected_layouts, run_ranks, train_and_capture

    hf, samples = tiny_hf(), batch(8)
    cfg, off = model_config_from_hf(hf.config), OffPolicyConfig(tis_cap=1.0, mask_threshold=0.05)
    ref = train_and_capture(
        0, cfg, ParallelConfig(micro_batch_tokens=64), hf.state_dict(), samples, 2, off_policy=off
    )
    assert 0 < ref["metrics"][0]["masked_trajectories"] < 8 and 0 < ref["metrics"][0]["is_clipped_frac"] < 1
    results = run_ranks(corrected_layouts, 2, tmp_path, cfg, hf.state_dict(), samples, 2, off)
    for rank, res in enumerate(results):
        for layout, run in res.items():
            for got, want in zip(run["metrics"], ref["metrics"]):
                assert got.keys() == want.keys(), (layout, rank)
                assert got == pytest.approx(want, rel=1e-5, abs=1e-7), (layout, rank)

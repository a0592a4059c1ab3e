"""Off-policy correction (algo.off_policy): truncated IS weights, trajectory masking, their metrics, the loss
with them, and the config checks. Numbers are worked out by hand in the comments."""

import math

import pytest
import torch

from swe_megatron.algo.losses import dapo_loss
from swe_megatron.algo.off_policy import off_policy_weights, segment_log_ratios, truncated_is_weights
from swe_megatron.config import load_config

F64 = torch.float64
NAN = float("nan")

# Two trajectories, padded [B=2, T=4]. Row 0: action tokens 1..3, log ratios old - engine 0.5, 0.5 and unknown
# (no engine logprob: NaN). Row 1: action tokens 0..2, log ratios 0.2, -0.4, 0.0; token 3 is not an action.
OLD = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-1.0, -1.0, -3.0, -2.0]], dtype=F64)
ENGINE = torch.tensor([[-1.0, -2.5, -1.0, NAN], [-1.2, -0.6, -3.0, -2.0]], dtype=F64)
MASK = torch.tensor([[False, True, True, True], [True, True, True, False]])
E02, EM04 = math.exp(0.2), math.exp(-0.4)  # 1.2214, 0.6703


def _packed():
    """The same two trajectories as the action tokens of one packed micro-batch, in interleaved order."""
    order = [(1, 0), (0, 1), (1, 1), (0, 2), (0, 3), (1, 2)]
    pick = lambda t: torch.stack([t[b, i] for b, i in order])  # noqa: E731
    return pick(OLD), pick(ENGINE), torch.ones(6, dtype=torch.bool), torch.tensor([b for b, _ in order])


def test_truncated_weights_by_hand():
    w = truncated_is_weights(OLD, ENGINE, MASK, cap=1.5)
    # exp(0.5) = 1.65 -> capped at 1.5; unknown engine logprob -> 1; off the mask -> 0
    expected = torch.tensor([[0.0, 1.5, 1.5, 1.0], [E02, EM04, 1.0, 0.0]], dtype=F64)
    torch.testing.assert_close(w, expected, rtol=0, atol=1e-12)
    assert not w.requires_grad


def test_segment_log_ratios_by_hand():
    sums = segment_log_ratios(OLD, ENGINE, MASK)
    # (sum of log ratios, tokens with an engine logprob, action tokens) per row: row 0: 0.5 + 0.5 over 2 known of
    # 3 action tokens (the NaN one is left out); row 1: 0.2 - 0.4 + 0 over 3 of 3
    expected = torch.tensor([[1.0, 2.0, 3.0], [-0.2, 3.0, 3.0]], dtype=F64)
    torch.testing.assert_close(sums, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_weights_and_metrics_by_hand(layout):
    if layout == "padded":
        old, eng, mask, seg = OLD, ENGINE, MASK, None
    else:
        old, eng, mask, seg = _packed()
    # |mean log ratio|: row 0 0.5 > 0.1 (masked), row 1 |-0.2/3| = 0.067 (kept)
    w, m = off_policy_weights(old, eng, mask, tis_cap=1.5, mask_threshold=0.1, segments=seg)
    weights_by_row = {0: [0.0, 0.0, 0.0], 1: [E02, EM04, 1.0]}
    if layout == "padded":
        torch.testing.assert_close(w[0], torch.zeros(4, dtype=F64))
        torch.testing.assert_close(w[1], torch.tensor(weights_by_row[1] + [0.0], dtype=F64))
    else:
        for b in (0, 1):
            torch.testing.assert_close(w[seg == b], torch.tensor(weights_by_row[b], dtype=F64))
    # weight stats over the 5 action tokens with an engine logprob, before masking: 1.5, 1.5, e^.2, e^-.4, 1
    assert m["is_tokens"].item() == 5
    assert m["is_weight_sum"].item() == pytest.approx(3.0 + E02 + EM04 + 1.0)
    assert m["is_weight_max"].item() == 1.5
    assert m["is_clipped_tokens"].item() == 2
    assert m["masked_trajectories"].item() == 1 and m["trajectories"].item() == 2


def test_each_part_alone():
    w, m = off_policy_weights(OLD, ENGINE, MASK, tis_cap=None, mask_threshold=0.1)
    expected = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]], dtype=F64)
    torch.testing.assert_close(w, expected, rtol=0, atol=0)
    assert m["masked_trajectories"].item() == 1
    w, _ = off_policy_weights(OLD, ENGINE, MASK, tis_cap=1.5, mask_threshold=None)
    torch.testing.assert_close(w, truncated_is_weights(OLD, ENGINE, MASK, 1.5), rtol=0, atol=0)


def test_trajectories_without_engine_logprobs_get_weight_one_and_are_never_masked():
    eng = torch.full_like(OLD, NAN)
    w, m = off_policy_weights(OLD, eng, MASK, tis_cap=0.5, mask_threshold=1e-9)
    torch.testing.assert_close(w, MASK.to(F64), rtol=0, atol=0)
    assert m["masked_trajectories"].item() == 0 and m["is_tokens"].item() == 0 and m["trajectories"] == 2


def test_the_segment_reduction_sees_every_rank_s_part():
    # A context-parallel rank holding only row 1's first token would keep row 1 alone (|0.2| > 0.1 masks it);
    # with the other rank's sums added (the all-reduce) it sees the whole row: -0.2 / 3, kept.
    old, eng, mask = OLD[1:, :1], ENGINE[1:, :1], MASK[1:, :1]
    _, alone = off_policy_weights(old, eng, mask, None, 0.1)
    assert alone["masked_trajectories"].item() == 1
    other = torch.tensor([[-0.4, 2.0, 2.0]], dtype=F64)
    _, joined = off_policy_weights(old, eng, mask, None, 0.1, reduce_segments=lambda s: s.add_(other))
    assert joined["masked_trajectories"].item() == 0


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="segments"):
        off_policy_weights(OLD[0], ENGINE[0], MASK[0], 2.0, 0.1)
    with pytest.raises(ValueError, match="same shape"):
        truncated_is_weights(OLD, ENGINE[:, :2], MASK, 2.0)


# --- the loss -------------------------------------------------------------------------------------------


def _loss(is_weights=None, old=None):
    lp = torch.tensor([-1.0, -1.0, -1.0, -0.5], dtype=F64, requires_grad=True)
    old = lp.detach().clone() if old is None else old  # ratio 1 on every token: nothing clipped
    adv = torch.tensor([1.0, -2.0, 0.5, 1.0], dtype=F64)
    mask = torch.tensor([True, True, True, False])
    loss, _ = dapo_loss(lp, old, adv, mask, 0.2, 0.3, 3, is_weights=is_weights)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.item(), grad.tolist()


def test_loss_multiplies_each_token_by_its_weight_by_hand():
    loss, grad = _loss(torch.tensor([1.5, 0.5, 0.0, 0.0], dtype=F64))
    # -(1.5 * 1 + 0.5 * -2 + 0 * 0.5) / 3 (the normaliser stays the 3 action tokens); d/dlogp (r A w) = A w at r=1
    assert loss == pytest.approx(-0.5 / 3)
    assert grad == pytest.approx([-1.5 / 3, 1.0 / 3, 0.0, 0.0])
    assert grad[2] == 0.0  # a masked trajectory's token: exactly no gradient


def test_loss_without_weights_is_the_paper_loss_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    lp = (-torch.rand(3, 17, generator=g, dtype=F64) * 4).requires_grad_()
    old = lp.detach() + 0.3 * torch.randn(3, 17, generator=g, dtype=F64)
    adv = torch.randn(3, generator=g, dtype=F64)
    mask = torch.rand(3, 17, generator=g) > 0.3
    n = int(mask.sum())
    # today's formula, written out
    r = torch.exp(torch.where(mask, lp - old, 0.0))
    obj = torch.minimum(r * adv[:, None], r.clamp(0.8, 1.3) * adv[:, None])
    ref = -torch.where(mask, obj, 0.0).sum() / n
    (ref_grad,) = torch.autograd.grad(ref, lp)
    for w in (None, torch.ones_like(old)):
        loss, _ = dapo_loss(lp, old, adv, mask, 0.2, 0.3, n, is_weights=w)
        (grad,) = torch.autograd.grad(loss, lp)
        assert torch.equal(loss, ref) and torch.equal(grad, ref_grad)


# --- config ---------------------------------------------------------------------------------------------


def test_off_by_default_and_settable():
    cfg = load_config("embedded")
    assert cfg.algo.off_policy.tis_cap is None and cfg.algo.off_policy.mask_threshold is None
    cfg = load_config("embedded", ["algo.off_policy.tis_cap=2.0", "algo.off_policy.mask_threshold=0.05"])
    assert cfg.algo.off_policy.tis_cap == 2.0 and cfg.algo.off_policy.mask_threshold == 0.05


# Bad algo.off_policy values: tests/config/test_config.py::test_bad_values_fail_with_one_message.


def test_the_masking_mean_is_over_the_tokens_with_an_engine_logprob():
    # Row 0: log ratios 0.5, 0.5 and one action token without an engine logprob: the mean is 1.0 / 2 = 0.5, not
    # 1.0 / 3 = 0.33 (the unknown token is no evidence of agreement). Row 1: |-0.2 / 3| = 0.067.
    for threshold, masked in ((0.4, 1.0), (0.49, 1.0), (0.51, 0.0)):
        w, m = off_policy_weights(OLD, ENGINE, MASK, None, threshold)
        assert m["masked_trajectories"].item() == masked, threshold
        assert bool((w[0] == 0).all()) == bool(masked)


def test_a_weight_exactly_at_the_cap_is_not_counted_as_clipped():
    # tis_cap=1: exp(0.5), exp(0.5), exp(0.2) are over it (clipped); row 1's third token has ratio exp(0) = 1,
    # at the cap, its weight unchanged: not clipped. exp(-0.4) is under it.
    w, m = off_policy_weights(OLD, ENGINE, MASK, tis_cap=1.0, mask_threshold=None)
    assert m["is_clipped_tokens"].item() == 3 and m["is_tokens"].item() == 5
    assert w[1, 2].item() == 1.0


def test_edges_mutation_testing_found():
    # |mean| exactly at the threshold is not over it: row 0's mean is exactly 0.5.
    assert off_policy_weights(OLD, ENGINE, MASK, None, 0.5)[1]["masked_trajectories"].item() == 0
    # With every weight below 1 (cap 0.5), the max is over tokens with an engine logprob only (row 0's unknown
    # token, weight 1, is not one).
    assert off_policy_weights(OLD, ENGINE, MASK, 0.5, None)[1]["is_weight_max"].item() == 0.5
    # bf16 inputs are compared in float32 (bf16's 8 bits would round 0.2 - 0.4 + 0 visibly).
    sums = segment_log_ratios(OLD.bfloat16(), ENGINE.bfloat16(), MASK)
    assert sums.dtype == torch.float32


def test_packed_segments_keep_the_callers_count():
    old, eng, mask, seg = _packed()
    assert segment_log_ratios(old, eng, mask, seg).shape == (2, 3)  # inferred: max id + 1
    # Four trajectories in the step, this micro-batch holds tokens of two: every rank's sums have 4 rows (the
    # all-reduce adds them row by row); trajectory 2 has one action token, trajectory 3 none here.
    seg4 = torch.cat([seg, torch.tensor([2])])
    old4, eng4, mask4 = torch.cat([old, old[:1]]), torch.cat([eng, eng[:1]]), torch.cat([mask, mask[:1]])
    assert segment_log_ratios(old4, eng4, mask4, seg4, num_segments=4).shape == (4, 3)
    shapes = []
    w, m = off_policy_weights(
        old4, eng4, mask4, None, 0.1, seg4, 4, reduce_segments=lambda s: shapes.append(s.shape)
    )
    assert shapes == [(4, 3)] and m["trajectories"].item() == 3 and w.shape == old4.shape


def test_an_empty_micro_batch_gives_zero_metrics():
    empty = torch.zeros(0, dtype=F64)
    seg = torch.zeros(0, dtype=torch.long)
    assert segment_log_ratios(empty, empty, empty.bool(), seg).shape == (0, 3)
    w, m = off_policy_weights(empty, empty, empty.bool(), 2.0, 0.1, seg)
    assert w.numel() == 0 and m["is_weight_max"].item() == 0 and m["trajectories"].item() == 0


def test_tensors_on_another_device_stay_there():
    # "meta" stands for a GPU: the weights, sums and metrics are made on the inputs' device, and the segment
    # ids (made on the CPU for [B, T] inputs, or passed from the CPU) follow them; a packed micro-batch with its
    # count given never reads a device value back (int() of a meta tensor raises, as a sync would cost).
    meta = dict(device="meta", dtype=F64)
    old, eng, mask = torch.empty(2, 4, **meta), torch.empty(2, 4, **meta), torch.ones(2, 4, dtype=torch.bool)
    for seg, n in ((None, None), (torch.tensor([[0, 1, 0, 1], [1, 1, 0, 2]]), 3)):
        w, m = off_policy_weights(old, eng, mask.to("meta"), 2.0, 0.1, seg, n)
        assert w.device.type == "meta" and w.shape == (2, 4)
        assert {v.device.type for v in m.values()} == {"meta"}
        assert segment_log_ratios(old, eng, mask.to("meta"), seg, n).device.type == "meta"


def test_metrics_are_floats_of_the_compute_dtype():
    # Float sums, so that they add over micro-batches and ranks with the weight sums (one all-reduce).
    _, m = off_policy_weights(OLD, ENGINE, MASK, 1.5, 0.1)
    assert {k: v.dtype for k, v in m.items()} == dict.fromkeys(m, F64) and len(m) == 6


def test_float32_trainer_logprobs_are_compared_in_float32():
    # dtype = promote(old, float32): float64 engine logprobs are cast down to it, not the ratio up.
    assert segment_log_ratios(OLD.float(), ENGINE, MASK).dtype == torch.float32
    assert off_policy_weights(OLD.float(), ENGINE, MASK, 1.5, None)[0].dtype == torch.float32


def test_a_trajectory_without_engine_logprobs_is_never_masked_whatever_the_threshold():
    # Row 1's action tokens all lack an engine logprob: no evidence, kept even at a threshold every row exceeds.
    eng = ENGINE.clone()
    eng[1] = NAN
    w, m = off_policy_weights(OLD, eng, MASK, None, -1.0)
    assert m["masked_trajectories"].item() == 1 and m["trajectories"].item() == 2
    torch.testing.assert_close(w[1], MASK[1].to(F64), rtol=0, atol=0)


def test_segments_of_another_shape_are_refused_naming_both_shapes():
    with pytest.raises(ValueError, match=r"segments \(3,\) must have the inputs' shape \(2, 4\)"):
        off_policy_weights(OLD, ENGINE, MASK, 2.0, 0.1, segments=torch.tensor([0, 1, 1]))

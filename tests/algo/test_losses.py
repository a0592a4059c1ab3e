"""DAPO and SFT losses: hand-computed values, and properties of their gradients (float64 throughout)."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from swe_megatron.algo import dapo_loss, sft_loss, token_entropy, token_logprobs

F64 = torch.float64
LN = math.log


def _hand_case(adv_sign: float):
    # position 0 is an observation token; ratios 1.5, 0.5 and 1.0 on the three action tokens
    old = torch.full((1, 4), LN(0.5), dtype=F64)
    lp = torch.tensor([[LN(0.9), LN(0.75), LN(0.25), LN(0.5)]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 1]])
    adv = torch.tensor([adv_sign], dtype=F64)  # one per sequence, broadcast over tokens
    loss, metrics = dapo_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.3, num_action_tokens=3)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.item(), grad[0].tolist(), metrics


def test_dapo_loss_positive_advantage_by_hand():
    loss, grad, m = _hand_case(+1.0)
    # min(r A, clip(r) A): r=1.5 -> 1.3 (clipped high), r=0.5 -> 0.5 (unclipped), r=1 -> 1
    assert loss == pytest.approx(-(1.3 + 0.5 + 1.0) / 3)
    # d/dlogp of -r A / N is -r A / N where unclipped; 0 where clipped and on the observation
    assert grad == pytest.approx([0.0, 0.0, -0.5 / 3, -1.0 / 3])
    assert m["clip_frac_high"].item() == pytest.approx(1 / 3)
    assert m["clip_frac_low"].item() == 0.0
    assert m["ratio_mean"].item() == pytest.approx(1.0)
    assert m["ratio_max"].item() == pytest.approx(1.5)
    # k3 = (r - 1) - log r, averaged over the three action tokens
    k3 = (0.5 - LN(1.5)) + (-0.5 - LN(0.5)) + 0.0
    assert m["approx_kl"].item() == pytest.approx(k3 / 3)
    assert m["action_tokens"].item() == 3
    assert "entropy" not in m


def test_approx_kl_is_the_k3_estimator_of_kl_old_to_new():
    # one action token at ratio 2, one at ratio 1/4: k3 = (r - 1) - log r each (k1 = -log r would give 0 here)
    lp = torch.tensor([LN(0.5), LN(0.125)], dtype=F64)
    old = torch.tensor([LN(0.25), LN(0.5)], dtype=F64)
    _, m = dapo_loss(lp, old, torch.ones(2, dtype=F64), torch.ones(2), 0.2, 0.3, 2)
    assert m["approx_kl"].item() == pytest.approx(((1 - LN(2)) + (-0.75 + LN(4))) / 2)


def test_dapo_loss_negative_advantage_by_hand():
    loss, grad, m = _hand_case(-1.0)
    # min(-r, -clip(r)): r=1.5 -> -1.5 (unclipped), r=0.5 -> -0.8 (clipped low), r=1 -> -1
    assert loss == pytest.approx((1.5 + 0.8 + 1.0) / 3)
    assert grad == pytest.approx([0.0, 1.5 / 3, 0.0, 1.0 / 3])
    assert m["clip_frac_low"].item() == pytest.approx(1 / 3)
    assert m["clip_frac_high"].item() == 0.0


def test_dapo_loss_divides_by_the_given_global_count_not_the_local_one():
    loss3, _, _ = _hand_case(+1.0)
    old = torch.full((1, 4), LN(0.5), dtype=F64)
    lp = torch.tensor([[LN(0.9), LN(0.75), LN(0.25), LN(0.5)]], dtype=F64)
    loss, _ = dapo_loss(lp, old, torch.ones(1, dtype=F64), torch.tensor([[0, 1, 1, 1]]), 0.2, 0.3, 12)
    assert loss.item() == pytest.approx(loss3 * 3 / 12)


def test_per_token_and_per_sequence_advantages_agree():
    g = torch.Generator().manual_seed(0)
    lp, old = -torch.rand(3, 5, generator=g, dtype=F64), -torch.rand(3, 5, generator=g, dtype=F64)
    mask = torch.rand(3, 5, generator=g) > 0.3
    adv = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    a, _ = dapo_loss(lp, old, adv, mask, 0.2, 0.3, 7)
    b, _ = dapo_loss(lp, old, adv[:, None].expand(3, 5), mask, 0.2, 0.3, 7)
    assert a.item() == b.item()
    with pytest.raises(ValueError, match="advantages"):
        dapo_loss(lp, old, adv[:2], mask, 0.2, 0.3, 7)
    with pytest.raises(ValueError, match="same shape"):
        dapo_loss(lp, old[:, :4], adv, mask, 0.2, 0.3, 7)


def test_entropy_metric_counts_action_tokens_only():
    v = 4
    logits = torch.zeros(1, 3, v, dtype=F64)
    logits[0, 0] = torch.tensor([50.0, 0.0, 0.0, 0.0])  # near-zero entropy, but an observation token
    lp = torch.zeros(1, 3, dtype=F64)
    _, m = dapo_loss(lp, lp, torch.ones(1, dtype=F64), torch.tensor([[0, 1, 1]]), 0.2, 0.3, 2, logits=logits)
    assert m["entropy"].item() == pytest.approx(LN(v))


def test_no_action_tokens_gives_zero_loss_not_nan():
    lp = torch.zeros(2, 3, dtype=F64, requires_grad=True)
    loss, m = dapo_loss(lp, lp.detach(), torch.ones(2, dtype=F64), torch.zeros(2, 3), 0.2, 0.3, 0)
    assert loss.item() == 0.0 and m["ratio_mean"].item() == 0.0
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad.abs().sum().item() == 0.0


def test_low_precision_inputs_are_computed_in_float32():
    lp = torch.tensor([-1.25, -0.5], dtype=torch.bfloat16)
    loss, m = dapo_loss(lp, lp, torch.tensor([1.0, 1.0]), torch.tensor([1, 1]), 0.2, 0.3, 2)
    assert loss.dtype == torch.float32 and loss.item() == -1.0 and m["ratio_max"].item() == 1.0


# ---------------------------------------------------------------------------------------------
# A tiny log-linear policy: logits = features @ W, so gradients are taken w.r.t. real parameters.


def _batch(seed: int, b: int, t: int, d: int = 3, v: int = 5):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d, v, generator=g, dtype=F64)
    x = torch.randn(b, t, d, generator=g, dtype=F64)
    tokens = torch.randint(0, v, (b, t), generator=g)
    with torch.no_grad():
        # the "engine" policy differs a little from the trainer's, so some ratios leave the clip range
        old = token_logprobs(x @ (w + 0.3 * torch.randn(d, v, generator=g, dtype=F64)), tokens)
    mask = torch.rand(b, t, generator=g) < 0.6
    mask[0, 0] = True  # at least one action token
    adv = torch.randn(b, generator=g, dtype=F64)
    return w, x, tokens, old, mask, adv


def _dapo_grad(w, x, tokens, old, mask, adv, rows, n, el=0.2, eh=0.3):
    """Loss and dL/dW of the given rows, with a fresh copy of W (as on a separate rank)."""
    w = w.clone().requires_grad_(True)
    if not rows:
        return 0.0, torch.zeros_like(w)
    r = torch.tensor(rows)
    loss, _ = dapo_loss(token_logprobs(x[r] @ w, tokens[r]), old[r], adv[r], mask[r], el, eh, n)
    (grad,) = torch.autograd.grad(loss, w)
    return loss.item(), grad


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), b=st.integers(1, 6), t=st.integers(1, 7), data=st.data())
def test_micro_batches_and_dp_ranks_reproduce_the_whole_batch(seed, b, t, data):
    w, x, tokens, old, mask, adv = _batch(seed, b, t)
    n = int(mask.sum())
    whole_loss, whole_grad = _dapo_grad(w, x, tokens, old, mask, adv, list(range(b)), n)
    # split into ranks (any assignment of sequences), and each rank into micro-batches
    ranks = data.draw(st.integers(1, 4))
    owner = data.draw(st.lists(st.integers(0, ranks - 1), min_size=b, max_size=b))
    total_loss, total_grad = 0.0, torch.zeros_like(w)
    for rank in range(ranks):
        rows = [i for i in range(b) if owner[i] == rank]
        cut = data.draw(st.integers(0, len(rows)))
        for micro in (rows[:cut], rows[cut:]):
            loss, grad = _dapo_grad(w, x, tokens, old, mask, adv, micro, n)
            total_loss += loss
            total_grad += grad  # all-reduce SUM over ranks, accumulation over micro-batches
    assert total_loss == pytest.approx(whole_loss, abs=1e-12)
    torch.testing.assert_close(total_grad, whole_grad, atol=1e-12, rtol=1e-10)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), b=st.integers(1, 5), t=st.integers(1, 6))
def test_packed_and_padded_layouts_agree(seed, b, t):
    w, x, tokens, old, mask, adv = _batch(seed, b, t)
    n = int(mask.sum())
    _, padded = _dapo_grad(w, x, tokens, old, mask, adv, list(range(b)), n)
    w2 = w.clone().requires_grad_(True)
    # packed: one flat sequence, per-token advantages
    lp = token_logprobs(x.reshape(b * t, -1) @ w2, tokens.reshape(-1))
    loss, _ = dapo_loss(
        lp, old.reshape(-1), adv[:, None].expand(b, t).reshape(-1), mask.reshape(-1), 0.2, 0.3, n
    )
    (packed,) = torch.autograd.grad(loss, w2)
    torch.testing.assert_close(packed, padded, atol=1e-12, rtol=1e-10)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), b=st.integers(1, 5), t=st.integers(1, 6))
def test_ratio_one_gives_the_plain_policy_gradient(seed, b, t):
    w, x, tokens, _, mask, adv = _batch(seed, b, t)
    n = int(mask.sum())
    with torch.no_grad():
        old = token_logprobs(x @ w, tokens)  # on-policy: every ratio is exactly 1
    _, dapo_grad = _dapo_grad(w, x, tokens, old, mask, adv, list(range(b)), n)
    w2 = w.clone().requires_grad_(True)
    lp = token_logprobs(x @ w2, tokens)
    pg_loss = -(adv[:, None] * lp * mask).sum() / n  # REINFORCE with the same normalisation
    (pg_grad,) = torch.autograd.grad(pg_loss, w2)
    torch.testing.assert_close(dapo_grad, pg_grad, atol=1e-12, rtol=1e-10)


@settings(max_examples=60, deadline=None)
@given(
    ratios=st.lists(st.floats(0.3, 2.0), min_size=1, max_size=10),
    signs=st.lists(st.sampled_from([-1.0, 1.0]), min_size=10, max_size=10),
    mags=st.lists(st.floats(0.01, 3.0), min_size=10, max_size=10),
    eps_low=st.floats(0.05, 0.4),
    eps_high=st.floats(0.05, 0.5),
)
def test_clipping_removes_the_gradient_exactly_outside_the_bound_on_the_advantages_side(
    ratios, signs, mags, eps_low, eps_high
):
    k = len(ratios)
    r = torch.tensor(ratios, dtype=F64)
    assume(bool(((r - (1 - eps_low)).abs() > 1e-9).all() and ((r - (1 + eps_high)).abs() > 1e-9).all()))
    adv = torch.tensor(signs[:k], dtype=F64) * torch.tensor(mags[:k], dtype=F64)
    lp = torch.full((k,), -1.0, dtype=F64, requires_grad=True)
    old = lp.detach() - torch.log(r)
    loss, m = dapo_loss(lp, old, adv, torch.ones(k), eps_low, eps_high, k)
    (grad,) = torch.autograd.grad(loss, lp)
    clipped = ((adv > 0) & (r > 1 + eps_high)) | ((adv < 0) & (r < 1 - eps_low))
    # inside the bound, or outside it on the side that makes the objective worse: the PG gradient r A
    expected = torch.where(clipped, 0.0, -adv * r / k)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=1e-10)
    assert m["clip_frac_low"].item() == pytest.approx(((adv < 0) & (r < 1 - eps_low)).double().mean().item())
    assert m["clip_frac_high"].item() == pytest.approx(
        ((adv > 0) & (r > 1 + eps_high)).double().mean().item()
    )


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), b=st.integers(1, 5), t=st.integers(2, 6))
def test_observation_tokens_never_receive_gradient_whatever_their_values(seed, b, t):
    w, x, tokens, old, mask, adv = _batch(seed, b, t)
    n = int(mask.sum())
    g = torch.Generator().manual_seed(seed + 1)
    lp = token_logprobs(x @ w, tokens).detach().requires_grad_(True)
    loss, _ = dapo_loss(lp, old, adv, mask, 0.2, 0.3, n)
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad[~mask].abs().sum().item() == 0.0
    # garbage at observation positions (-inf logprobs, huge ratios, NaN advantages) changes nothing
    lp2 = torch.where(mask, lp.detach(), torch.full_like(lp, -math.inf)).requires_grad_(True)
    old2 = torch.where(mask, old, 50 * torch.randn(b, t, generator=g, dtype=F64))
    adv2 = torch.where(mask, adv[:, None], math.nan)
    loss2, m2 = dapo_loss(lp2, old2, adv2, mask, 0.2, 0.3, n)
    (grad2,) = torch.autograd.grad(loss2, lp2)
    assert loss2.item() == loss.item()
    assert torch.equal(grad2, grad)
    assert all(math.isfinite(v.item()) for v in m2.values())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), b=st.integers(2, 6), t=st.integers(1, 6), cut=st.integers(1, 5))
def test_metrics_combine_over_micro_batches_by_token_weights(seed, b, t, cut):
    w, x, tokens, old, mask, adv = _batch(seed, b, t)
    cut = min(cut, b - 1)
    lp = token_logprobs(x @ w, tokens).detach()
    n = int(mask.sum())
    logits = x @ w
    _, whole = dapo_loss(lp, old, adv, mask, 0.2, 0.3, n, logits=logits)
    parts = [
        dapo_loss(lp[s], old[s], adv[s], mask[s], 0.2, 0.3, n, logits=logits[s])[1]
        for s in (slice(0, cut), slice(cut, b))
    ]
    weights = [p["action_tokens"].item() for p in parts]
    for key in ("clip_frac_low", "clip_frac_high", "ratio_mean", "approx_kl", "entropy"):
        combined = sum(p[key].item() * wt for p, wt in zip(parts, weights)) / sum(weights)
        assert combined == pytest.approx(whole[key].item(), abs=1e-12)
    assert max(p["ratio_max"].item() for p in parts) == whole["ratio_max"].item()
    assert whole["approx_kl"].item() >= 0.0


# ---------------------------------------------------------------------------------------------


def test_sft_loss_by_hand():
    lp = torch.tensor([-1.0, -2.0, -3.0, -4.0], dtype=F64, requires_grad=True)
    mask = torch.tensor([0, 1, 1, 0])
    loss, m = sft_loss(lp, mask, 2)
    assert loss.item() == pytest.approx(2.5)
    assert m["nll"].item() == pytest.approx(2.5) and m["loss_tokens"].item() == 2
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad.tolist() == [0.0, -0.5, -0.5, 0.0]
    assert sft_loss(lp, mask, 5)[0].item() == pytest.approx(1.0)  # global count of 5 tokens
    with pytest.raises(ValueError):
        sft_loss(lp, mask[:3], 2)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), b=st.integers(1, 6), t=st.integers(1, 6), data=st.data())
def test_sft_loss_is_split_invariant_and_ignores_masked_tokens(seed, b, t, data):
    w, x, tokens, _, mask, _ = _batch(seed, b, t)
    n = int(mask.sum())

    def grad_of(rows, poison=False):
        w2 = w.clone().requires_grad_(True)
        r = torch.tensor(rows)
        lp = token_logprobs(x[r] @ w2, tokens[r])
        if poison:
            lp = torch.where(mask[r], lp, -math.inf)
        loss, _ = sft_loss(lp, mask[r], n)
        return torch.autograd.grad(loss, w2)[0]

    whole = grad_of(list(range(b)))
    cut = data.draw(st.integers(1, b)) if b > 1 else 1
    split = grad_of(list(range(cut))) + (grad_of(list(range(cut, b))) if cut < b else 0)
    torch.testing.assert_close(split, whole, atol=1e-12, rtol=1e-10)
    assert torch.equal(grad_of(list(range(b)), poison=True), whole)


def test_token_logprobs_and_entropy_by_hand():
    logits = torch.tensor([[0.0, LN(3.0)], [0.0, 0.0]], dtype=F64)  # p = [1/4, 3/4] and [1/2, 1/2]
    got = token_logprobs(logits, torch.tensor([1, 0]))
    assert got.tolist() == pytest.approx([LN(0.75), LN(0.5)])
    ent = token_entropy(logits)
    assert ent.tolist() == pytest.approx([-(0.25 * LN(0.25) + 0.75 * LN(0.75)), LN(2.0)])

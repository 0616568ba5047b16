"""algos.policy_loss: clipped surrogate by hand, clip-higher, dual clip, sequence ratios (GSPO), invariances."""

import math

import pytest
import torch

from objbench import algos
from objbench.algos.policy import sequence_log_ratio, sequence_token_log_ratio, token_log_ratio

F64 = torch.float64
MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
LEVELS = ["token", "sequence", "sequence_token"]


def t(x):
    return torch.tensor(x, dtype=F64)


def _hand_batch():
    # one response, 4 tokens, ratios r = [1.5, 0.5, 1.1, 0.9] (lp - old = log r), advantages [+1, -1, +1, -1]
    old = t([[-1.0, -2.0, -0.5, -1.5]])
    lp = (old + torch.log(t([[1.5, 0.5, 1.1, 0.9]]))).requires_grad_()
    adv = t([[1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    return lp, old, adv, mask


def test_clipped_surrogate_by_hand():
    # eps 0.2/0.2, l = max(-A r, -A clip(r, 0.8, 1.2)):
    #   r=1.5, A=+1: max(-1.5, -1.2) = -1.2  (high clip active)
    #   r=0.5, A=-1: max( 0.5,  0.8) =  0.8  (low clip active)
    #   r=1.1, A=+1: max(-1.1, -1.1) = -1.1
    #   r=0.9, A=-1: max( 0.9,  0.9) =  0.9
    # token_mean = (-1.2 + 0.8 - 1.1 + 0.9) / 4 = -0.15
    # grads d l / d lp = -A r on unclipped tokens, 0 on clipped ones, / 4: [0, 0, -0.275, 0.225]
    lp, old, adv, mask = _hand_batch()
    loss, m = algos.policy_loss(lp, old, adv, mask)
    assert loss.item() == pytest.approx(-0.15, abs=1e-12)
    loss.backward()
    assert torch.allclose(lp.grad, t([[0.0, 0.0, -0.275, 0.225]]), atol=1e-12)
    assert m["clipfrac_low"].item() == 0.25 and m["clipfrac_high"].item() == 0.25
    assert m["ratio_mean"].item() == pytest.approx(1.0)  # (1.5 + 0.5 + 1.1 + 0.9) / 4
    assert m["ratio_max"].item() == pytest.approx(1.5) and m["ratio_min"].item() == pytest.approx(0.5)
    assert m["dual_clip_frac"].item() == 0.0
    # approx_kl = mean of k3 with x = old - lp = -log r: 1/r - 1 + log r
    #   = (0.07213177 + 0.30685282 + 0.00440109 + 0.00575060) / 4 = 0.09728407
    assert m["approx_kl"].item() == pytest.approx(0.09728407, abs=1e-8)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())


def test_clip_higher_by_hand():
    # DAPO eps_high 0.28: token 1 becomes max(-1.5, -1.28) = -1.28; loss = (-1.28 + 0.8 - 1.1 + 0.9) / 4 = -0.17
    lp, old, adv, mask = _hand_batch()
    loss, _ = algos.policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(-0.17, abs=1e-12)


def test_dual_clip_by_hand():
    # A = -1: r = 4 -> clipped loss max(4, 1.2) = 4; dual clip c = 3 caps it: min(3, 4) = 3 (gradient 0)
    #         r = 2 -> max(2, 1.2) = 2 < 3: dual clip inactive (gradient -A r = 2)
    # A = +1: r = 4 -> max(-4, -1.2) = -1.2: dual clip never applies to A > 0
    old = t([[0.0, 0.0, 0.0]])
    lp = torch.log(t([[4.0, 2.0, 4.0]])).requires_grad_()
    adv = t([[-1.0, -1.0, 1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, m = algos.policy_loss(lp, old, adv, mask, dual_clip=3.0, agg="seq_mean_token_sum")
    assert loss.item() == pytest.approx(3.0 + 2.0 - 1.2, abs=1e-12)
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 3)
    loss.backward()
    assert torch.allclose(lp.grad, t([[0.0, 2.0, 0.0]]), atol=1e-12)
    # off (None): 4 + 2 - 1.2
    loss_off, m_off = algos.policy_loss(lp, old, adv, mask, agg="seq_mean_token_sum")
    assert loss_off.item() == pytest.approx(4.8) and m_off["dual_clip_frac"].item() == 0.0


def test_dual_clip_none_matches_formula_and_huge_c():
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(4, 6, generator=g, dtype=F64)
    old = lp + 0.5 * torch.randn(4, 6, generator=g, dtype=F64)
    adv = torch.randn(4, 6, generator=g, dtype=F64)
    mask = torch.rand(4, 6, generator=g) > 0.3
    r = torch.exp(lp - old)
    manual = torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.2))
    expected = manual[mask].mean()
    a, _ = algos.policy_loss(lp, old, adv, mask)
    b, _ = algos.policy_loss(lp, old, adv, mask, dual_clip=1e12)
    assert torch.allclose(a, expected, atol=1e-14) and torch.allclose(a, b, atol=1e-14)


def test_sequence_ratio_by_hand():
    # row 0: lp - old = [log 2, 0] -> log s = log(2)/2 -> s = sqrt(2) = 1.41421356
    # row 1: one valid token, lp - old = log 0.5 -> s = 0.5 (the third column is padding)
    old = t([[0.0, 0.0], [0.0, 0.0]])
    lp = t([[math.log(2.0), 0.0], [math.log(0.5), float("nan")]]).requires_grad_()
    mask = torch.tensor([[True, True], [True, False]])
    assert torch.allclose(sequence_log_ratio(lp, old, mask).exp(), t([1.41421356, 0.5]), atol=1e-8)
    adv = t([1.0, -1.0])
    # eps 0.2: row 0: -min(1.414 * 1, 1.2 * 1) = -1.2 (high clip); row 1: -min(-0.5, -0.8) = 0.8 (low clip)
    #   seq_mean_token_mean = (-1.2 + 0.8) / 2 = -0.2   (the mean over sequences: GSPO's objective)
    #   token_mean = (2 * -1.2 + 1 * 0.8) / 3 = -0.53333333   (each token carries its sequence's loss)
    loss, m = algos.policy_loss(lp, old, adv, mask, ratio="sequence", agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx(-0.2, abs=1e-12)
    assert m["clipfrac_high"].item() == 0.5 and m["clipfrac_low"].item() == 0.5  # fractions of sequences
    assert m["ratio_mean"].item() == pytest.approx((math.sqrt(2) + 0.5) / 2)
    loss_tm, _ = algos.policy_loss(lp, old, adv, mask, ratio="sequence", agg="token_mean")
    assert loss_tm.item() == pytest.approx(-0.53333333, abs=1e-8)
    # wide clip range (unclipped): (-1.41421356 + 0.5) / 2 = -0.45710678
    loss_u, _ = algos.policy_loss(lp, old, adv, mask, ratio="sequence", eps_low=0.9, eps_high=1.0,
                                  agg="seq_mean_token_mean")
    assert loss_u.item() == pytest.approx(-0.45710678, abs=1e-8)
    loss_u.backward()
    # d/d lp_0t of -A s / 2 = -s / (2 |y_0|) = -1.41421356 / 4 on row 0; row 1: +0.5 / 2
    assert torch.allclose(lp.grad, t([[-0.35355339, -0.35355339], [0.25, 0.0]]), atol=1e-8)


def _random_batch(seed, B=6, T=7, spread=0.3, per_seq_adv=True):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3
    lp = old + spread * torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.rand(B, T, generator=g) > 0.25
    mask[:, 0] = True
    adv = torch.randn(B, generator=g, dtype=F64) if per_seq_adv else torch.randn(B, T, generator=g, dtype=F64)
    return lp, old, adv, mask


def _loss_and_grad(lp, *args, **kw):
    lp = lp.detach().clone().requires_grad_()
    loss, m = algos.policy_loss(lp, *args, **kw)
    loss.backward()
    return loss.detach(), lp.grad, m


@pytest.mark.parametrize("agg", MODES)
def test_sequence_ratio_equals_token_ratio_for_length_one(agg):
    lp, old, adv, _ = _random_batch(1, spread=0.5)
    mask = torch.zeros_like(lp, dtype=torch.bool)
    mask[:, 3] = True  # every response has exactly one token
    lt, gt, mt = _loss_and_grad(lp, old, adv, mask, ratio="token", agg=agg, max_len=7)
    ls, gs, ms = _loss_and_grad(lp, old, adv, mask, ratio="sequence", agg=agg, max_len=7)
    assert torch.allclose(lt, ls, atol=1e-14) and torch.allclose(gt, gs, atol=1e-14)
    assert torch.allclose(mt["clipfrac_high"], ms["clipfrac_high"]) and torch.allclose(mt["ratio_mean"], ms["ratio_mean"])


@pytest.mark.parametrize("agg", MODES)
def test_gspo_token_equals_gspo_for_per_sequence_advantages(agg):
    # off-policy enough that some sequences are clipped (eps 0.05)
    lp, old, adv, mask = _random_batch(2, spread=0.3)
    kw = dict(eps_low=0.05, eps_high=0.05, agg=agg, max_len=7)
    ls, gs, ms = _loss_and_grad(lp, old, adv, mask, ratio="sequence", **kw)
    lst, gst, _ = _loss_and_grad(lp, old, adv, mask, ratio="sequence_token", **kw)
    assert 0 < ms["clipfrac_high"] + ms["clipfrac_low"] < 1  # both branches exercised
    assert torch.allclose(ls, lst, atol=1e-14)
    assert torch.allclose(gs, gst, atol=1e-14)


def test_sequence_token_log_ratio_value_and_gradient():
    # value: log s_i on every valid token; gradient of sum_t log s_it w.r.t. lp_it: 1 on valid tokens
    lp, old, _, mask = _random_batch(3)
    lp.requires_grad_()
    out = sequence_token_log_ratio(lp, old, mask)
    expected = sequence_log_ratio(lp, old, mask)[:, None].expand_as(out)
    assert torch.allclose(out[mask], expected[mask].detach(), atol=1e-14)
    out.sum().backward()
    assert torch.equal(lp.grad, mask.to(F64))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("agg", MODES)
def test_gspo_equals_grpo_on_policy(seed, agg):
    # on-policy (old = lp): every ratio is 1 and nothing is clipped. Under seq_mean_token_mean, GSPO's
    # d/d lp_it [ -(1/B) sum_i A_i s_i ] = -A_i / (B |y_i|) equals GRPO's -(1/B) A_i (1/|y_i|) d r_it / d lp_it.
    # Because the sequence loss is broadcast to the sequence's tokens before aggregation, the per-token
    # weights match under every mode (e.g. token_mean: |y_i| l_i / N -> -A_i / N for both), so the
    # equality holds for all four modes -- provided both arms use the same one.
    lp, _, adv, mask = _random_batch(seed)
    old = lp.detach().clone()
    kw = dict(agg=agg, max_len=7)
    lg, gg, mg = _loss_and_grad(lp, old, adv, mask, ratio="token", **kw)
    for level in ("sequence", "sequence_token"):
        ls, gs, ms = _loss_and_grad(lp, old, adv, mask, ratio=level, eps_low=3e-4, eps_high=4e-4, **kw)
        assert torch.allclose(lg, ls, atol=1e-14) and torch.allclose(gg, gs, atol=1e-14)
        assert ms["ratio_mean"].item() == pytest.approx(1.0) and ms["clipfrac_high"].item() == 0.0


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("agg", MODES)
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_garbage_under_mask_changes_nothing(level, agg, dual_clip):
    lp, old, adv, mask = _random_batch(4, spread=0.4, per_seq_adv=False)
    mask[2] = False  # plus a fully masked row
    nan, inf = float("nan"), float("inf")
    lp_d = torch.where(mask, lp, torch.full_like(lp, nan))
    old_d = torch.where(mask, old, torch.full_like(old, -inf))
    adv_d = torch.where(mask, adv, torch.full_like(adv, inf))
    kw = dict(ratio=level, agg=agg, max_len=7, dual_clip=dual_clip, eps_low=0.1, eps_high=0.1)
    l1, g1, m1 = _loss_and_grad(lp, old, adv, mask, **kw)
    l2, g2, m2 = _loss_and_grad(lp_d, old_d, adv_d, mask, **kw)
    assert torch.equal(l1, l2)
    assert torch.equal(torch.where(mask, g1, 0.0), g2)  # and exactly 0 (finite) under the mask
    for k in m1:
        assert torch.equal(m1[k], m2[k]), k


def test_all_masked_batch_is_finite():
    lp, old, adv, mask = _random_batch(5)
    mask[:] = False
    loss, grad, m = _loss_and_grad(lp, old, adv, mask)
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    assert all(torch.isfinite(v) for v in m.values())


def test_dtype_preserved_and_log_ratio_clamped():
    lp, old, adv, mask = _random_batch(6)
    for dtype in (torch.float32, F64):
        loss, m = algos.policy_loss(lp.to(dtype), old.to(dtype), adv.to(dtype), mask, ratio="sequence")
        assert loss.dtype == dtype and all(v.dtype == dtype for v in m.values())
    huge = token_log_ratio(t([[100.0, -100.0]]), t([[0.0, 0.0]]), torch.ones(1, 2, dtype=torch.bool))
    assert torch.equal(huge, t([[20.0, -20.0]]))


def test_errors_name_the_argument():
    lp, old, adv, mask = _random_batch(7)
    cases = [
        (dict(ratio="seq"), "ratio"),
        (dict(agg="mean"), "agg"),
        (dict(eps_low=1.0), "eps_low"),
        (dict(eps_low=-0.1), "eps_low"),
        (dict(eps_high=-0.1), "eps_high"),
        (dict(dual_clip=1.0), "dual_clip"),
        (dict(agg="seq_mean_token_sum_norm"), "max_len"),
    ]
    for kw, name in cases:
        with pytest.raises(ValueError, match=name):
            algos.policy_loss(lp, old, adv, mask, **kw)
    with pytest.raises(ValueError, match="advantages"):
        algos.policy_loss(lp, old, adv[:3], mask)
    with pytest.raises(ValueError, match="old_logp"):
        algos.policy_loss(lp, old[:, :3], adv, mask)
    with pytest.raises(ValueError, match="mask"):
        algos.policy_loss(lp, old, adv, mask.to(torch.uint8) * 2)  # 0/2: not a mask (0/1 would be accepted)

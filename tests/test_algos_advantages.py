"""algos.advantages: GAE, whitening, value loss, group-relative, RLOO, group stats.

Hand-computed values with their derivation, loop references vs the vectorised code, invariances."""

import math
import statistics

import pytest
import torch

from objbench import algos
from objbench.algos.advantages import gae, group_relative, group_stats, rloo, value_loss, whiten, zero_variance_groups

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


# ------------------------------------------------------------------------------------------ group_relative
def test_group_std_G2_by_hand():
    # groups [1, 0] and [0, 1]: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.70710678
    # A = +-0.5 / (0.70710678 + 1e-6) = +-0.70710578
    out = group_relative(t([1.0, 0.0, 0.0, 1.0]), 2)
    assert torch.allclose(out, t([0.70710578, -0.70710578, -0.70710578, 0.70710578]), atol=1e-8)
    # eps = 0: exactly +-1/sqrt(2)
    out0 = group_relative(t([1.0, 0.0, 0.0, 1.0]), 2, eps=0.0)
    assert torch.allclose(out0, t([0.70710678, -0.70710678, -0.70710678, 0.70710678]), atol=1e-8)


def test_group_std_G4_by_hand():
    # one group [1, 0, 0, 1]: mean 0.5, unbiased var (4 * 0.25) / 3 = 1/3, std 0.57735027
    # A = +-0.5 / 0.57735027 = +-0.8660254 (= sqrt(3)/2); a ddof=0 std (0.5) would give +-1
    out = group_relative(t([1.0, 0.0, 0.0, 1.0]), 4, eps=0.0)
    assert torch.allclose(out, t([0.8660254, -0.8660254, -0.8660254, 0.8660254]), atol=1e-7)


def test_group_scale_none_is_dr_grpo():
    # A = R - mean_g R = [0.5, -0.5, -0.5, 0.5]
    assert torch.equal(group_relative(t([1.0, 0.0, 0.0, 1.0]), 4, scale="none"), t([0.5, -0.5, -0.5, 0.5]))


def test_group_vs_batch_scale_by_hand():
    r = t([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    # group means 0.25 and 0.75 -> centred [.75, -.25, -.25, -.25, .25, .25, .25, -.75]
    # per-group unbiased std: [1,0,0,0]: var = (0.5625 + 3 * 0.0625) / 3 = 0.25, std 0.5 (same for the other)
    #   -> A = [1.5, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -1.5]
    assert torch.allclose(group_relative(r, 4, eps=0.0), t([1.5, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -1.5]))
    # batch std: mean 0.5, all deviations +-0.5, unbiased var 8 * 0.25 / 7 = 2/7, std 0.53452248
    #   -> 0.75 / 0.53452248 = 1.40312152, 0.25 / 0.53452248 = 0.46770717
    exp = t([1.40312152, -0.46770717, -0.46770717, -0.46770717, 0.46770717, 0.46770717, 0.46770717, -1.40312152])
    assert torch.allclose(group_relative(r, 4, scale="batch", eps=0.0), exp, atol=1e-8)


def test_rloo_by_hand():
    # [1, 0, 0, 1], G = 4: A_1 = 1 - (0 + 0 + 1)/3 = 2/3; A_2 = 0 - (1 + 0 + 1)/3 = -2/3
    assert torch.allclose(rloo(t([1.0, 0.0, 0.0, 1.0]), 4), t([2 / 3, -2 / 3, -2 / 3, 2 / 3]), atol=1e-15)
    # = G/(G-1) (R - mean) for random rewards
    g = torch.Generator().manual_seed(1)
    r = torch.rand(12, generator=g, dtype=F64)
    assert torch.allclose(rloo(r, 3), 1.5 * group_relative(r, 3, scale="none"), atol=1e-14)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_all_equal_group_is_exactly_zero(scale, eps):
    # 0.1 + 0.1 + 0.1 = 0.30000000000000004, so r - mean(r) is not 0 in floating point without the explicit rule
    r = t([0.1, 0.1, 0.1, 1.0, 0.0, 1.0, 0.7, 0.7, 0.7])
    out = group_relative(r, 3, scale=scale, eps=eps)
    assert torch.equal(out[:3], torch.zeros(3, dtype=F64))
    assert torch.equal(out[6:], torch.zeros(3, dtype=F64))
    assert torch.isfinite(out).all()
    assert torch.equal(rloo(r, 3)[:3], torch.zeros(3, dtype=F64))
    # a whole batch of identical rewards (batch std 0) with eps 0: zeros, not NaN
    assert torch.equal(group_relative(torch.full((6,), 0.3, dtype=F64), 3, scale=scale, eps=eps), torch.zeros(6, dtype=F64))


def _loop_group_relative(rewards, G, scale, eps):
    # plain-Python reference with the statistics module (stdev is the ddof=1 estimate)
    rs = rewards.tolist()
    batch_std = statistics.stdev(rs)
    out = []
    for g in range(len(rs) // G):
        grp = rs[g * G:(g + 1) * G]
        mean = sum(grp) / G
        if max(grp) == min(grp):
            out += [0.0] * G
            continue
        denom = {"group": statistics.stdev(grp) + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        out += [(x - mean) / denom for x in grp]
    return torch.tensor(out, dtype=F64)


def _loop_rloo(rewards, G):
    rs = rewards.tolist()
    out = []
    for g in range(len(rs) // G):
        grp = rs[g * G:(g + 1) * G]
        for i, x in enumerate(grp):
            others = grp[:i] + grp[i + 1:]
            out.append(0.0 if max(grp) == min(grp) else x - sum(others) / (G - 1))
    return torch.tensor(out, dtype=F64)


@pytest.mark.parametrize("G", [2, 3, 5])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_relative_matches_loop_reference(G, scale):
    g = torch.Generator().manual_seed(G)
    r = (torch.rand(G * 7, generator=g, dtype=F64) > 0.5).to(F64) + 0.1 * torch.rand(G * 7, generator=g, dtype=F64)
    r[:G] = 0.25  # one all-equal group
    assert torch.allclose(group_relative(r, G, scale=scale, eps=1e-6), _loop_group_relative(r, G, scale, 1e-6), atol=1e-12)
    assert torch.allclose(rloo(r, G), _loop_rloo(r, G), atol=1e-12)


def test_group_errors_name_the_argument():
    r = t([1.0, 0.0, 0.0, 1.0])
    for G in (1, 0):
        with pytest.raises(ValueError, match="group_size"):
            group_relative(r, G)
        with pytest.raises(ValueError, match="group_size"):
            rloo(r, G)
    with pytest.raises(ValueError, match="group_size"):
        group_relative(r, 3)  # 4 % 3 != 0
    with pytest.raises(ValueError, match="eps"):
        group_relative(r, 2, eps=-1e-3)
    with pytest.raises(ValueError, match="scale"):
        group_relative(r, 2, scale="std")
    with pytest.raises(ValueError, match="rewards"):
        group_relative(r[None], 2)
    with pytest.raises(ValueError, match="rewards"):
        group_relative(torch.tensor([1, 0, 0, 1]), 2)


def test_group_stats_by_hand():
    # group 0 [1, 0, 0, 1]: mean 0.5, std sqrt(1/3) = 0.57735027, pass 0.5; group 1 all 1: std 0, pass 1, zero-var
    s = group_stats(t([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]), 4)
    assert torch.allclose(s.mean, t([0.5, 1.0]))
    assert torch.allclose(s.std, t([0.57735027, 0.0]), atol=1e-8)
    assert torch.equal(s.pass_rate, t([0.5, 1.0]))
    assert s.zero_var.tolist() == [False, True]
    # singleton groups are allowed here: std 0, zero-variance
    s1 = group_stats(t([1.0, 0.0]), 1)
    assert torch.equal(s1.std, t([0.0, 0.0])) and s1.zero_var.tolist() == [True, True]


def test_zero_variance_groups_by_hand():
    # equal groups of 4: [1, 0, 0, 1] mixed, [1, 1, 1, 1] all equal; unequal sizes [1], [0, 0], [1, 0, 1]
    r = t([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert zero_variance_groups(r, 4).tolist() == [False, True]
    assert zero_variance_groups(r, 4).tolist() == group_stats(r, 4).zero_var.tolist()
    u = t([1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    assert zero_variance_groups(u, [1, 2, 3]).tolist() == [True, True, False]
    assert zero_variance_groups(u, [1, 2, 3]).tolist() == group_stats(u, [1, 2, 3]).zero_var.tolist()
    with pytest.raises(ValueError):
        zero_variance_groups(r, 3)  # 3 does not divide 8


# --------------------------------------------------------------------------------------------------- GAE
def test_gae_gamma_lam_one_by_hand():
    # rewards [0, 0, 1], V = [0.5, 0.6, 0.7], gamma = lam = 1:
    # t=2: delta = 1 + 0 - 0.7 = 0.3, A = 0.3; t=1: delta = 0.7 - 0.6 = 0.1, A = 0.4; t=0: delta = 0.1, A = 0.5
    # (A_t = R - V_t); returns = A + V = [1, 1, 1]
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv, ret = gae(t([[0.0, 0.0, 1.0]]), t([[0.5, 0.6, 0.7]]), mask, 1.0, 1.0)
    assert torch.allclose(adv, t([[0.5, 0.4, 0.3]]), atol=1e-15)
    assert torch.allclose(ret, t([[1.0, 1.0, 1.0]]), atol=1e-15)


def test_gae_discounted_by_hand():
    # gamma = 0.9, lam = 0.8 (gamma lam = 0.72), rewards [0, 0, 1], V = [0.5, 0.6, 0.7]:
    # t=2: delta = 1 - 0.7 = 0.3,            A2 = 0.3
    # t=1: delta = 0.9 * 0.7 - 0.6 = 0.03,   A1 = 0.03 + 0.72 * 0.3   = 0.246
    # t=0: delta = 0.9 * 0.6 - 0.5 = 0.04,   A0 = 0.04 + 0.72 * 0.246 = 0.21712
    # returns = A + V = [0.71712, 0.846, 1.0]
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv, ret = gae(t([[0.0, 0.0, 1.0]]), t([[0.5, 0.6, 0.7]]), mask, 0.9, 0.8)
    assert torch.allclose(adv, t([[0.21712, 0.246, 0.3]]), atol=1e-12)
    assert torch.allclose(ret, t([[0.71712, 0.846, 1.0]]), atol=1e-12)


def test_gae_skips_masked_tokens():
    # a hole at t=1 and padding at t=4, holding garbage: the recursion runs over the valid tokens only,
    # so the result equals the compact case above at the valid positions and 0 elsewhere
    mask = torch.tensor([[True, False, True, True, False]])
    rew = t([[0.0, 5.0, 0.0, 1.0, float("nan")]])
    val = t([[0.5, 99.0, 0.6, 0.7, float("inf")]])
    adv, ret = gae(rew, val, mask, 0.9, 0.8)
    assert torch.allclose(adv, t([[0.21712, 0.0, 0.246, 0.3, 0.0]]), atol=1e-12)
    assert torch.allclose(ret, t([[0.71712, 0.0, 0.846, 1.0, 0.0]]), atol=1e-12)


def _loop_gae(rew, val, mask, gamma, lam):
    B, T = mask.shape
    adv = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        idx = [i for i in range(T) if mask[b, i]]
        a_next, v_next = 0.0, 0.0
        for i in reversed(idx):
            delta = float(rew[b, i]) + gamma * v_next - float(val[b, i])
            a_next = delta + gamma * lam * a_next
            v_next = float(val[b, i])
            adv[b, i] = a_next
    return adv, torch.where(mask, adv + val, torch.zeros_like(val))


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0)])
def test_gae_matches_loop_reference(gamma, lam):
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(5, 8, generator=g) > 0.3
    mask[0] = False  # an empty row
    rew = torch.randn(5, 8, generator=g, dtype=F64)
    val = torch.randn(5, 8, generator=g, dtype=F64)
    adv, ret = gae(rew, val, mask, gamma, lam)
    adv_ref, ret_ref = _loop_gae(rew, val, mask, gamma, lam)
    assert torch.allclose(adv, adv_ref, atol=1e-12) and torch.allclose(ret, ret_ref, atol=1e-12)


def test_gae_errors():
    mask = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="gamma"):
        gae(t([[0.0, 0, 1]]), t([[0.0, 0, 0]]), mask, 1.5, 1.0)
    with pytest.raises(ValueError, match="lam"):
        gae(t([[0.0, 0, 1]]), t([[0.0, 0, 0]]), mask, 1.0, -0.1)
    with pytest.raises(ValueError, match="values"):
        gae(t([[0.0, 0, 1]]), t([[0.0, 0]]), mask, 1.0, 1.0)
    with pytest.raises(ValueError, match="mask"):
        gae(t([[0.0, 0, 1]]), t([[0.0, 0, 0]]), mask.long() + 1, 1.0, 1.0)  # 2s: not a mask


def test_whiten_by_hand():
    # valid values 1, 2, 3: mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> [-1, 0, 1] / sqrt(1 + 1e-8)
    x = t([[1.0, 2.0], [3.0, float("nan")]])
    mask = torch.tensor([[True, True], [True, False]])
    w = whiten(x, mask)
    assert torch.allclose(w, t([[-1.0, 0.0], [1.0, 0.0]]), atol=1e-7)
    # shift_mean=False only rescales: (x - 2) / 1 + 2 = x
    assert torch.allclose(whiten(x, mask, shift_mean=False), t([[1.0, 2.0], [3.0, 0.0]]), atol=1e-7)


# ------------------------------------------------------------------------------------------- value loss
def test_value_loss_by_hand():
    # c = 0.5, token_mean over 3 tokens:
    # tok 1: V=1, V_old=0, R=0.5: V_clip = 0.5; (V-R)^2 = 0.25, (V_clip-R)^2 = 0    -> 0.5 * 0.25 = 0.125
    # tok 2: V=2, V_old=2, R=3:   V_clip = 2;   both 1                              -> 0.5
    # tok 3: V=1, V_old=0, R=2:   V_clip = 0.5; (V-R)^2 = 1, (V_clip-R)^2 = 2.25 (clip active) -> 1.125
    # loss = (0.125 + 0.5 + 1.125) / 3 = 0.58333333, clipfrac = 1/3
    # grads: tok 1 (unclipped branch) (V-R)/3 = 1/6; tok 2 (tie, both branches V-R) -1/3; tok 3 (clip saturated) 0
    v = t([[1.0, 2.0, 1.0]]).requires_grad_()
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, m = value_loss(v, t([[0.0, 2.0, 0.0]]), t([[0.5, 3.0, 2.0]]), mask, 0.5, "token_mean")
    assert loss.item() == pytest.approx(0.58333333, abs=1e-8)
    assert m["value_clipfrac"].item() == pytest.approx(1 / 3)
    loss.backward()
    assert torch.allclose(v.grad, t([[1 / 6, -1 / 3, 0.0]]), atol=1e-12)
    # unclipped: 0.5 * (0.25 + 1 + 1) / 3 = 0.375
    loss_u, m_u = value_loss(v, t([[0.0, 2.0, 0.0]]), t([[0.5, 3.0, 2.0]]), mask, None, "token_mean")
    assert loss_u.item() == pytest.approx(0.375) and m_u["value_clipfrac"].item() == 0.0


def test_value_loss_garbage_and_dtype():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(3, 5, generator=g) > 0.4
    v, vo, r = (torch.randn(3, 5, generator=g, dtype=F64) for _ in range(3))
    clean = v.clone().requires_grad_()
    dirty = torch.where(mask, v, torch.full_like(v, float("nan"))).requires_grad_()
    vo_d = torch.where(mask, vo, torch.full_like(vo, float("inf")))
    l1, _ = value_loss(clean, vo, r, mask, 0.2, "seq_mean_token_mean")
    l2, m2 = value_loss(dirty, vo_d, r, mask, 0.2, "seq_mean_token_mean")
    l1.backward()
    l2.backward()
    assert l1.dtype == F64 and torch.equal(l1, l2)
    assert torch.equal(torch.where(mask, clean.grad, 0.0), dirty.grad)
    assert all(x.dim() == 0 and not x.requires_grad for x in m2.values())


def test_broadcast_and_float32_preserved():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    out = algos.advantages.broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert torch.equal(out, torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))
    assert group_relative(torch.tensor([1.0, 0.0]), 2).dtype == torch.float32
    assert group_relative(t([1.0, 0.0]), 2).dtype == F64
    assert math.isfinite(rloo(torch.tensor([1.0, 0.0]), 2)[0].item())

"""algos.kl: estimator values by hand, Schulman's Gaussian table, sample means vs exact KL, gradients
(exact enumeration on a small categorical), exact_kl, clamps and errors.

Convention check (REFERENCE.md): Schulman's post estimates KL[q, p] with samples x ~ q, r = p(x)/q(x).
In algos' notation the sampling policy is pi = q, the reference is p, and x = ref - lp = log r, so the
samples must come from q = N(0, 1) -- which is what REFERENCE.md says. ``test_samples_from_p_estimate_minus_kl``
shows that the other choice would make k1's mean -KL.
"""

import math

import pytest
import torch

from objbench import algos
from objbench.algos.kl import estimate, exact_kl, exact_kl_both

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


# --------------------------------------------------------------------------------------------- by hand
def test_values_by_hand():
    # token 0: pi = 0.5, pi_ref = 0.25: x = log(0.25/0.5) = -0.69314718
    #   k1 = -x = 0.69314718; k2 = x^2/2 = 0.24022651; k3 = e^x - 1 - x = 0.5 - 1 + 0.69314718 = 0.19314718
    # token 1: pi = 0.25, pi_ref = 0.5: x = +0.69314718
    #   k1 = -0.69314718 (negative!); k2 = 0.24022651; k3 = 2 - 1 - 0.69314718 = 0.30685282
    lp = torch.log(t([0.5, 0.25]))
    ref = torch.log(t([0.25, 0.5]))
    assert torch.allclose(estimate(lp, ref, "k1"), t([0.69314718, -0.69314718]), atol=1e-8)
    assert torch.allclose(estimate(lp, ref, "k2"), t([0.24022651, 0.24022651]), atol=1e-8)
    assert torch.allclose(estimate(lp, ref, "k3"), t([0.19314718, 0.30685282]), atol=1e-8)
    # straight-through keeps k3's value; k3_ratio on-policy (old = lp) equals k3
    assert torch.equal(estimate(lp, ref, "k3_k2grad"), estimate(lp, ref, "k3"))
    assert torch.allclose(estimate(lp, ref, "k3_ratio", old_logp=lp), estimate(lp, ref, "k3"), atol=1e-15)
    # off-policy: r = exp(lp - old) = 2 on token 0 -> 2 * 0.19314718 = 0.38629436
    old = lp - t([math.log(2.0), 0.0])
    assert torch.allclose(estimate(lp, ref, "k3_ratio", old_logp=old), t([0.38629436, 0.30685282]), atol=1e-8)


def test_k3_nonnegative_everywhere():
    x = t([-50.0, -20.0, -1.0, -1e-4, -1e-8, -1e-12, -1e-300, 0.0, 1e-300, 1e-12, 1e-8, 1e-4, 1.0, 20.0, 50.0])
    for dtype in (torch.float32, F64):
        lp = torch.zeros_like(x, dtype=dtype)
        assert (estimate(lp, x.to(dtype), "k3") >= 0).all()
        g = torch.Generator().manual_seed(0)
        a = torch.randn(100_000, generator=g, dtype=dtype) * torch.logspace(-10, 1, 100_000, dtype=dtype)
        assert (estimate(torch.zeros_like(a), a, "k3") >= 0).all()


def test_exp_cannot_overflow_and_clamp():
    lp, ref = t([0.0, 0.0]), t([1000.0, -1000.0])
    assert torch.isfinite(estimate(lp, ref, "k3")).all()  # x clamped to [-20, 20] before exp
    out = estimate(lp, ref, "k3", clamp=10.0)  # verl-style value clamp
    assert torch.equal(out, t([10.0, 10.0]))


def test_errors_name_the_argument():
    lp = t([0.0])
    with pytest.raises(ValueError, match="kind"):
        estimate(lp, lp, "k4")
    with pytest.raises(ValueError, match="old_logp"):
        estimate(lp, lp, "k3_ratio")
    with pytest.raises(ValueError, match="clamp"):
        estimate(lp, lp, "k3", clamp=0.0)
    with pytest.raises(ValueError, match="ref_logp"):
        estimate(lp, t([0.0, 1.0]), "k1")
    with pytest.raises(ValueError, match="direction"):
        exact_kl(t([[0.0, 1.0]]), t([[0.0, 1.0]]), direction="backward")


# --------------------------------------------------------------------------------- Schulman's table
@pytest.fixture(scope="module")
def normal_samples():
    return torch.randn(1_000_000, generator=torch.Generator().manual_seed(0), dtype=F64)


# (mu, kind) -> (bias / KL, std / KL) from Schulman (2020), "Approximating KL Divergence"
SCHULMAN = {
    (0.1, "k1"): (0.0, 20.0),
    (0.1, "k2"): (0.002, 1.42),
    (0.1, "k3"): (0.0, 1.42),
    (1.0, "k1"): (0.0, 2.0),
    (1.0, "k2"): (0.25, 1.73),
    (1.0, "k3"): (0.0, 1.70),
}


@pytest.mark.parametrize("mu,kind", list(SCHULMAN))
def test_schulman_gaussian_table(normal_samples, mu, kind):
    # q = N(0, 1) samples the tokens (pi), p = N(mu, 1) is the reference; true KL = mu^2 / 2.
    # Normalising constants cancel in ref - lp, so they are dropped.
    z = normal_samples
    lp, ref = -0.5 * z**2, -0.5 * (z - mu) ** 2
    kl = mu**2 / 2
    est = estimate(lp, ref, kind)
    bias, std = ((est.mean() - kl) / kl).item(), (est.std() / kl).item()
    want_bias, want_std = SCHULMAN[(mu, kind)]
    # std/KL within 3% (1e6 samples: sampling error of a std is ~0.1-0.5%; the table rounds to 3 digits)
    assert std == pytest.approx(want_std, rel=0.03)
    # bias/KL within 5 standard errors of the mean (std/KL / sqrt(N)) plus the table's rounding (0.0005)
    assert abs(bias - want_bias) < 5 * std / math.sqrt(z.numel()) + 5e-4


def test_samples_from_p_estimate_minus_kl(normal_samples):
    # drawing the samples from p = N(mu, 1) instead makes E[k1] = -mu^2/2: the table needs samples from q
    mu = 1.0
    z = normal_samples + mu
    k1 = estimate(-0.5 * z**2, -0.5 * (z - mu) ** 2, "k1")
    assert k1.mean().item() == pytest.approx(-0.5, abs=5 * 1.0 / 1000)


# ----------------------------------------------------------------- sample means vs the exact KL
def test_k1_k3_sample_means_match_exact_kl():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, generator=g, dtype=F64)
    ref_logits = torch.randn(5, generator=g, dtype=F64)
    lp_all, ref_all = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
    exact = exact_kl(logits, ref_logits).item()
    n = 200_000
    idx = torch.multinomial(lp_all.exp(), n, replacement=True, generator=g)  # tokens sampled from pi
    for kind in ("k1", "k3"):
        est = estimate(lp_all[idx], ref_all[idx], kind)
        se = est.std().item() / math.sqrt(n)
        # 5 standard errors: a false failure has probability ~6e-7 (and the generator is seeded)
        assert abs(est.mean().item() - exact) < 5 * se, kind
    # k2 is biased: its mean is not the KL here (sanity check that the test can fail)
    k2 = estimate(lp_all[idx], ref_all[idx], "k2")
    assert abs(k2.mean().item() - exact) > 5 * k2.std().item() / math.sqrt(n)


# ------------------------------------------------------- gradients by exact enumeration (V = 6 categorical)
@pytest.fixture()
def categorical():
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(6, generator=g, dtype=F64).requires_grad_()
    ref_logits = torch.randn(6, generator=g, dtype=F64)
    return theta, ref_logits


def _expected_grad(theta, ref_logits, kind, sampler_logits=None, old_logits=None):
    """grad_theta of E_{v ~ sampler}[k(v)] with the sampling distribution held fixed (what a sampled loss does)."""
    logp = torch.log_softmax(theta, -1)
    ref = torch.log_softmax(ref_logits, -1)
    weights = torch.softmax(theta if sampler_logits is None else sampler_logits, -1).detach()
    old = None if old_logits is None else torch.log_softmax(old_logits, -1).detach()
    val = (weights * estimate(logp, ref, kind, old_logp=old)).sum()
    (grad,) = torch.autograd.grad(val, theta)
    return val.detach(), grad


def _grad_of(fn, theta):
    (grad,) = torch.autograd.grad(fn(theta), theta)
    return grad


def test_k1_as_loss_has_zero_expected_gradient(categorical):
    theta, ref_logits = categorical
    _, grad = _expected_grad(theta, ref_logits, "k1")  # E_pi[grad log pi] = grad sum_v pi_v = 0
    assert torch.allclose(grad, torch.zeros_like(grad), atol=1e-15)


def test_k2_gradient_is_reverse_kl_gradient_and_k1_in_reward(categorical):
    theta, ref_logits = categorical
    _, g_k2 = _expected_grad(theta, ref_logits, "k2")
    g_reverse = _grad_of(lambda th: exact_kl(th, ref_logits), theta)
    # k1 in the reward: REINFORCE surrogate E_pi[sg(k1) log pi] (a penalty, minimised)
    logp = torch.log_softmax(theta, -1)
    ref = torch.log_softmax(ref_logits, -1)
    pi = logp.exp().detach()
    reinforce = (pi * estimate(logp, ref, "k1").detach() * logp).sum()
    (g_reward,) = torch.autograd.grad(reinforce, theta)
    assert torch.allclose(g_k2, g_reverse, atol=1e-14)
    assert torch.allclose(g_reward, g_reverse, atol=1e-14)
    assert g_reverse.abs().max() > 1e-3  # non-trivial


def test_k3_gradient_is_forward_kl_gradient(categorical):
    theta, ref_logits = categorical
    val, g_k3 = _expected_grad(theta, ref_logits, "k3")
    g_forward = _grad_of(lambda th: exact_kl(th, ref_logits, direction="forward"), theta)
    g_reverse = _grad_of(lambda th: exact_kl(th, ref_logits), theta)
    assert torch.allclose(g_k3, g_forward, atol=1e-14)
    assert not torch.allclose(g_k3, g_reverse, atol=1e-3)  # it is really a different direction
    # while its value is the reverse KL
    assert val.item() == pytest.approx(exact_kl(theta, ref_logits).item(), abs=1e-14)


def test_k3_k2grad_has_k3_value_and_k2_gradient(categorical):
    theta, ref_logits = categorical
    v_st, g_st = _expected_grad(theta, ref_logits, "k3_k2grad")
    v_k3, _ = _expected_grad(theta, ref_logits, "k3")
    _, g_k2 = _expected_grad(theta, ref_logits, "k2")
    assert v_st.item() == pytest.approx(v_k3.item(), abs=1e-15)
    assert torch.allclose(g_st, g_k2, atol=1e-15)


def test_k3_ratio_gives_reverse_kl_value_and_gradient_off_policy(categorical):
    theta, ref_logits = categorical
    old_logits = theta.detach() + 0.5 * torch.randn(6, generator=torch.Generator().manual_seed(2), dtype=F64)
    g_reverse = _grad_of(lambda th: exact_kl(th, ref_logits), theta)
    # samples from pi_old: E_old[r k3] = KL(pi || ref) and its gradient is the reverse-KL gradient, exactly
    val, grad = _expected_grad(theta, ref_logits, "k3_ratio", sampler_logits=old_logits, old_logits=old_logits)
    assert val.item() == pytest.approx(exact_kl(theta, ref_logits).item(), abs=1e-14)
    assert torch.allclose(grad, g_reverse, atol=1e-14)
    # on-policy too
    _, grad_on = _expected_grad(theta, ref_logits, "k3_ratio", old_logits=theta.detach())
    assert torch.allclose(grad_on, g_reverse, atol=1e-14)


# ---------------------------------------------------------------------------------------- exact KL
def test_exact_kl_by_hand():
    # pi = [0.5, 0.5], ref = [0.25, 0.75]
    # KL(pi || ref) = 0.5 log(0.5/0.25) + 0.5 log(0.5/0.75) = 0.34657359 - 0.20273255 = 0.14384104
    # KL(ref || pi) = 0.25 log(0.25/0.5) + 0.75 log(0.75/0.5) = -0.17328680 + 0.30409883 = 0.13081204
    logits = torch.log(t([[[0.5, 0.5]]]))  # (B=1, T=1, V=2); log-probs are valid logits
    ref = torch.log(t([[[0.25, 0.75]]]))
    assert exact_kl(logits, ref).shape == (1, 1)
    assert exact_kl(logits, ref).item() == pytest.approx(0.14384104, abs=1e-8)
    assert exact_kl(logits, ref, direction="forward").item() == pytest.approx(0.13081204, abs=1e-8)


def test_exact_kl_stable_and_handles_zero_probabilities():
    # logits of scale 1e4 (softmax without log_softmax would overflow) and a shift invariance check
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 3, 7, generator=g, dtype=F64), torch.randn(2, 3, 7, generator=g, dtype=F64)
    assert torch.allclose(exact_kl(a + 1e4, b - 1e4), exact_kl(a, b), atol=1e-10)
    big = exact_kl(a * 1e4, b * 1e4)
    assert torch.isfinite(big).all() and (big >= -1e-9).all()
    # pi = [1, 0] (a -inf logit), ref uniform: KL(pi || ref) = log 2; KL(ref || pi) = inf
    pi, ref = t([0.0, -float("inf")]), t([0.0, 0.0])
    assert exact_kl(pi, ref).item() == pytest.approx(math.log(2))
    assert exact_kl(pi, ref, direction="forward").item() == float("inf")


def test_exact_kl_matches_loop_and_keeps_dtype():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(2, 3, 5, generator=g, dtype=F64), torch.randn(2, 3, 5, generator=g, dtype=F64)
    out = exact_kl(a, b)
    for i in range(2):
        for j in range(3):
            p = torch.softmax(a[i, j], -1).tolist()
            q = torch.softmax(b[i, j], -1).tolist()
            assert out[i, j].item() == pytest.approx(sum(pv * math.log(pv / qv) for pv, qv in zip(p, q)), abs=1e-12)
    assert exact_kl(a.float(), b.float()).dtype == torch.float32
    assert estimate(a.float(), b.float(), "k3").dtype == torch.float32
    assert algos.kl.KL_ESTIMATORS.names() == ("k1", "k2", "k3", "k3_k2grad", "k3_ratio")


def test_exact_kl_both_is_exact_kl_in_both_directions_bit_for_bit():
    # the training loop logs both directions from one pair of log_softmax calls; the numbers must be exact_kl's
    g = torch.Generator().manual_seed(3)
    logits, ref_logits = torch.randn(4, 5, 7, generator=g) * 3, torch.randn(4, 5, 7, generator=g) * 3
    logits[0, 0, 2] = float("-inf")  # a zero-probability entry under pi only
    rev, fwd = exact_kl_both(logits, ref_logits)
    assert torch.equal(rev, exact_kl(logits, ref_logits))
    assert torch.equal(fwd, exact_kl(logits, ref_logits, direction="forward"))
    with pytest.raises(ValueError, match="ref_logits"):
        exact_kl_both(logits, ref_logits[:, :, :3])


def test_exact_kl_both_from_log_probs_by_hand():
    # the hand example of test_exact_kl_by_hand, given as log-probs (what the loop's scoring already holds):
    # KL(pi || ref) = 0.14384104, KL(ref || pi) = 0.13081204
    rev, fwd = algos.kl.exact_kl_both_from_log_probs(torch.log(t([[[0.5, 0.5]]])), torch.log(t([[[0.25, 0.75]]])))
    assert rev.item() == pytest.approx(0.14384104, abs=1e-8) and fwd.item() == pytest.approx(0.13081204, abs=1e-8)
    g = torch.Generator().manual_seed(3)
    logits, ref_logits = torch.randn(4, 5, 7, generator=g) * 3, torch.randn(4, 5, 7, generator=g) * 3
    both = algos.kl.exact_kl_both_from_log_probs(logits.log_softmax(-1), ref_logits.log_softmax(-1))
    assert all(torch.equal(a, b) for a, b in zip(both, exact_kl_both(logits, ref_logits)))
    with pytest.raises(ValueError, match="ref"):
        algos.kl.exact_kl_both_from_log_probs(logits, ref_logits[:, :, :3])


def test_value_estimates_are_bit_equal_to_estimate_and_worked_by_hand():
    # lp - ref = -0.5 and 1.0: k1 = -0.5, 1; k2 = 0.125, 0.5; k3 = e^0.5 - 1 - 0.5, e^-1 - 1 + 1 = e^-1
    lp, ref = t([-1.5, -0.25]), t([-1.0, -1.25])
    k1, k2, k3 = algos.kl.value_estimates(lp, ref)
    assert k1.tolist() == pytest.approx([-0.5, 1.0])
    assert k2.tolist() == pytest.approx([0.125, 0.5])
    assert k3.tolist() == pytest.approx([math.exp(0.5) - 1.5, math.exp(-1.0)])
    g = torch.Generator().manual_seed(0)
    lp, ref = -torch.rand(64, 13, generator=g) * 5, -torch.rand(64, 13, generator=g) * 5
    lp[0, 0], ref[0, 1] = -40.0, -40.0  # |x| past the k3 clamp
    for kind, v in zip(("k1", "k2", "k3"), algos.kl.value_estimates(lp, ref)):
        assert torch.equal(v, algos.kl.estimate(lp, ref, kind)), kind


def test_exact_kl_zero_probability_terms_are_zero_and_nan_stays_nan():
    logp = torch.log(t([[0.5, 0.5, 0.0]]))  # -inf: a token pi never picks
    ref = torch.log(t([[0.25, 0.25, 0.5]]))
    rev, fwd = algos.kl.exact_kl_both_from_log_probs(logp, ref)
    assert rev.item() == pytest.approx(math.log(2))  # 0.5 ln 2 + 0.5 ln 2 + 0 (the 0 * inf term)
    assert math.isinf(fwd.item())  # KL(ref || pi) with pi = 0 where ref > 0
    nan = algos.kl.exact_kl_both_from_log_probs(t([[float("nan"), 0.0]]), t([[-1.0, -1.0]]))[0]
    assert math.isnan(nan.item())

"""algos.surrogates (ppo_clip, cispo, sapo): values and gradients by hand, gradient checks, accepted ratio
levels, options a surrogate does not read, invariances, and the config / entry-point wiring."""

import inspect
import math

import pytest
import torch

from objbench import algos
from objbench.algos.config import RatioConfig
from objbench.algos.config_dict import with_overrides
from objbench.algos.registry import SURROGATES
from objbench.algos.surrogates import OPTION_DEFAULTS

F64 = torch.float64
MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]


def t(x):
    return torch.tensor(x, dtype=F64)


def _hand_batch():
    # the batch of tests/test_algos_policy.py: one response, 4 tokens, ratios r = [1.5, 0.5, 1.1, 0.9],
    # advantages [+1, -1, +1, -1]; lp = old + log r = [-0.59453489, -2.69314718, -0.40468982, -1.60536052]
    old = t([[-1.0, -2.0, -0.5, -1.5]])
    lp = (old + torch.log(t([[1.5, 0.5, 1.1, 0.9]]))).requires_grad_()
    adv = t([[1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    return lp, old, adv, mask


# ------------------------------------------------------------------------------------------------ cispo
def test_cispo_by_hand_upper_bound_only():
    # default: no lower bound, upper 1 + 0.28: weights w = sg(clip(r)) = [1.28, 0.5, 1.1, 0.9]
    # l = -w A lp:
    #   -1.28 * (+1) * -0.59453489 =  0.76100466
    #   -0.5  * (-1) * -2.69314718 = -1.34657359
    #   -1.1  * (+1) * -0.40468982 =  0.44515880
    #   -0.9  * (-1) * -1.60536052 = -1.44482446
    # token_mean = -1.58523459 / 4 = -0.39630865
    # d l / d lp = -w A / 4 = [-0.32, 0.125, -0.275, 0.225]: no token loses its gradient (PPO's clip zeroes
    # tokens 0 and 1, see test_clipped_surrogate_by_hand)
    lp, old, adv, mask = _hand_batch()
    loss, m = algos.policy_loss(lp, old, adv, mask, surrogate="cispo")
    assert loss.item() == pytest.approx(-0.39630865, abs=1e-8)
    loss.backward()
    assert torch.allclose(lp.grad, t([[-0.32, 0.125, -0.275, 0.225]]), atol=1e-12)
    # clip events: r = 1.5 > 1.28 (whatever the sign of A); no lower bound, so none below
    assert m["clipfrac_high"].item() == 0.25 and m["clipfrac_low"].item() == 0.0
    assert m["dual_clip_frac"].item() == 0.0
    assert m["ratio_mean"].item() == pytest.approx(1.0)


def test_cispo_by_hand_with_lower_bound():
    # eps_low_is 0.2: the weight of r = 0.5 becomes 0.8: -0.8 * (-1) * -2.69314718 = -2.15451774
    # token_mean = (0.76100466 - 2.15451774 + 0.44515880 - 1.44482446) / 4 = -0.59829469
    # gradient of token 1: -0.8 * (-1) / 4 = 0.2
    lp, old, adv, mask = _hand_batch()
    loss, m = algos.policy_loss(lp, old, adv, mask, surrogate="cispo", eps_low_is=0.2)
    assert loss.item() == pytest.approx(-0.59829469, abs=1e-8)
    loss.backward()
    assert torch.allclose(lp.grad, t([[-0.32, 0.2, -0.275, 0.225]]), atol=1e-12)
    assert m["clipfrac_low"].item() == 0.25 and m["clipfrac_high"].item() == 0.25
    # eps_low_is = 1 is the bound 0: the same as no lower bound
    l1, _ = algos.policy_loss(lp, old, adv, mask, surrogate="cispo", eps_low_is=1.0)
    l0, _ = algos.policy_loss(lp, old, adv, mask, surrogate="cispo")
    assert torch.equal(l1, l0)


def test_cispo_sequence_level_by_hand():
    # row 0: lp - old = [log 2, 0] -> s = sqrt(2) = 1.41421356, weight min(s, 1.28) = 1.28 on both tokens
    # row 1: one valid token, s = 0.5 -> weight 0.5; A = [+1, -1], lp = [[log 2, 0], [log 0.5, pad]]
    # l = -w A lp: row 0: [-1.28 * 0.69314718, 0] = [-0.88722839, 0]; row 1: -0.5 * (-1) * -0.69314718 = -0.34657359
    # seq_mean_token_mean = ((-0.88722839 + 0) / 2 + -0.34657359) / 2 = -0.39509389
    # grads: row 0: -1.28 / (2 * 2) = -0.32 per token; row 1: -0.5 * (-1) / 2 = 0.25
    old = t([[0.0, 0.0], [0.0, 0.0]])
    lp = t([[math.log(2.0), 0.0], [math.log(0.5), float("nan")]]).requires_grad_()
    mask = torch.tensor([[True, True], [True, False]])
    loss, m = algos.policy_loss(lp, old, t([1.0, -1.0]), mask, ratio="sequence", surrogate="cispo",
                                agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx(-0.39509389, abs=1e-8)
    loss.backward()
    assert torch.allclose(lp.grad, t([[-0.32, -0.32], [0.25, 0.0]]), atol=1e-12)
    assert m["clipfrac_high"].item() == 0.5  # one of two sequences


# ------------------------------------------------------------------------------------------------- sapo
def test_sapo_by_hand():
    # f(r) = (4 / tau) sigmoid(tau (r - 1)), tau = 1 for A > 0, 1.05 for A < 0; l = -f A
    #   r = 1.5, A = +1: p = sigmoid(0.5)     = 0.62245933, f = 4 p        = 2.48983732 -> l = -2.48983732
    #   r = 0.5, A = -1: p = sigmoid(-0.525)  = 0.37168381, f = 4 p / 1.05 = 1.41593833 -> l = +1.41593833
    #   r = 1.1, A = +1: p = sigmoid(0.1)     = 0.52497919, f = 4 p        = 2.09991675 -> l = -2.09991675
    #   r = 0.9, A = -1: p = sigmoid(-0.105)  = 0.47377409, f = 4 p / 1.05 = 1.80485368 -> l = +1.80485368
    # token_mean = -0.34224052
    # d l / d lp = -A 4 p (1 - p) r / 4, gradient weights 4 p (1 - p) = [0.94001485, 0.93413982, 0.99750416, 0.99724881]:
    #   [-0.94001485 * 1.5, 0.93413982 * 0.5, -0.99750416 * 1.1, 0.99724881 * 0.9] / 4
    #   = [-0.35250557, 0.11676748, -0.27431364, 0.22438098]
    lp, old, adv, mask = _hand_batch()
    loss, m = algos.policy_loss(lp, old, adv, mask, surrogate="sapo")
    assert loss.item() == pytest.approx(-0.34224052, abs=1e-8)
    loss.backward()
    assert torch.allclose(lp.grad, t([[-0.35250557, 0.11676748, -0.27431364, 0.22438098]]), atol=1e-8)
    assert m["clipfrac_low"].item() == 0.0 and m["clipfrac_high"].item() == 0.0  # no hard clip


def test_sapo_temperatures_by_hand():
    # tau_pos = 2, tau_neg = 4, r = 1.5 (A = +1) and r = 0.5 (A = -1), seq_mean_token_sum (a plain sum here):
    #   A = +1: f = (4/2) sigmoid(1.0) = 2 * 0.73105858 = 1.46211716 -> l = -1.46211716
    #   A = -1: f = (4/4) sigmoid(-2.0) = 0.11920292                 -> l = +0.11920292
    #   sum = -1.34291424
    lp = torch.log(t([[1.5, 0.5]]))
    loss, _ = algos.policy_loss(lp, torch.zeros(1, 2, dtype=F64), t([[1.0, -1.0]]), torch.ones(1, 2, dtype=torch.bool),
                                surrogate="sapo", tau_pos=2.0, tau_neg=4.0, agg="seq_mean_token_sum")
    assert loss.item() == pytest.approx(-1.34291424, abs=1e-8)


# ------------------------------------------------------------------------------------- gradient checks
def _batch(seed, B=4, T=5, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 2
    lp = old + spread * torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.rand(B, T, generator=g) > 0.25
    mask[:, 0] = True
    adv = torch.randn(B, generator=g, dtype=F64)
    return lp, old, adv, mask


def _away_from_kinks(lp, old, mask, bounds, level):
    # finite differences are only valid where no clip boundary lies within the step
    lr = (lp - old).masked_fill(~mask, 0.0)
    if level != "token":  # sequence, sequence_token: the value is s_i
        lr = (lr.sum(-1) / mask.sum(-1))[:, None].expand_as(lr)
    r = lr.exp()[mask]
    return all((r - b).abs().min() > 1e-3 for b in bounds)


@pytest.mark.parametrize("level", ["token", "sequence", "sequence_token"])
@pytest.mark.parametrize("agg", MODES)
def test_gradcheck_ppo_clip_and_sapo(level, agg):
    lp, old, adv, mask = _batch(7, spread=0.5)
    cases = [
        dict(surrogate="ppo_clip", eps_low=0.05, eps_high=0.05, dual_clip=1.3),
        dict(surrogate="sapo"),
        dict(surrogate="sapo", tau_pos=3.0, tau_neg=0.5),
    ]
    for kw in cases:
        if kw["surrogate"] == "ppo_clip":  # kinks at 1 - eps_low, 1 + eps_high and (A < 0) r = c
            assert _away_from_kinks(lp, old, mask, [0.95, 1.05, 1.3], level)
            m = algos.policy_loss(lp, old, adv, mask, ratio=level, **kw)[1]  # every branch is exercised
            assert m["clipfrac_low"] > 0 and m["clipfrac_high"] > 0 and (level != "token" or m["dual_clip_frac"] > 0)

        def f(x, kw=kw):
            return algos.policy_loss(x, old, adv, mask, ratio=level, agg=agg, max_len=6, **kw)[0]

        assert torch.autograd.gradcheck(f, (lp.clone().requires_grad_(),), eps=1e-6, atol=1e-8)


def _cispo_potential(lp, old, adv, mask, lo, hi, level, agg):
    """A function whose true gradient is CISPO's: sum of -A W(x) with W' = clip(e^x, lo, hi).

    CISPO's gradient -sg(clip(r)) A d lp is not the gradient of its own loss value (the weight is a
    stop-gradient), so gradcheck of the loss itself would be wrong by design. It is the exact gradient of
    -A W(x), x = log r, with W(x) = e^x inside [log lo, log hi] and continued linearly (slope lo / hi)
    outside -- W' = clip(e^x, lo, hi) is the CISPO weight. For the sequence level x = log s_i, and a row
    contributes |y_i| W(x_i) (each of its tokens carries the weight clip(s_i)).
    """
    def W(x):
        out = x.exp()
        out = torch.where(x > math.log(hi), hi + hi * (x - math.log(hi)), out)
        if lo is not None:
            out = torch.where(x < math.log(lo), lo + lo * (x - math.log(lo)), out)
        return out

    x = (lp - old).masked_fill(~mask, 0.0)
    a = adv[:, None].expand_as(x).masked_fill(~mask, 0.0)
    if level == "token":
        pot = -a * W(x)
    else:
        n = mask.sum(-1, keepdim=True).to(F64)
        xs = x.sum(-1, keepdim=True) / n
        # every valid token of row i carries -A_i W(x_i). Each aggregation weighs a row's tokens equally
        # (c_i), so d/d lp_ik of sum_t c_i (-A_i W(x_i)) = |y_i| c_i (-A_i) W'(x_i) / |y_i| = c_i (-A_i) clip(s_i):
        # the CISPO gradient of token k
        pot = torch.where(mask, -a * W(xs), 0.0)
    return algos.aggregate(pot, mask, agg, 6)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("agg", MODES)
@pytest.mark.parametrize("eps_low_is", [None, 0.1])
def test_cispo_gradient_is_the_gradient_of_its_potential(level, agg, eps_low_is):
    lp, old, adv, mask = _batch(1, spread=0.4)
    hi, lo = 1.1, None if eps_low_is is None else 0.9
    assert _away_from_kinks(lp, old, mask, [0.9, 1.1], level)
    x = lp.clone().requires_grad_()
    loss, m = algos.policy_loss(x, old, adv, mask, ratio=level, agg=agg, max_len=6, surrogate="cispo",
                                eps_low_is=eps_low_is, eps_high_is=0.1)
    loss.backward()
    assert m["clipfrac_high"] > 0 and (eps_low_is is None or m["clipfrac_low"] > 0)  # clipped weights exercised
    # central finite differences of the potential, coordinate by coordinate (float64)
    num = torch.zeros_like(lp)
    h = 1e-6
    for i in range(lp.shape[0]):
        for j in range(lp.shape[1]):
            if not mask[i, j]:
                continue
            up, dn = lp.clone(), lp.clone()
            up[i, j] += h
            dn[i, j] -= h
            num[i, j] = (_cispo_potential(up, old, adv, mask, lo, hi, level, agg)
                         - _cispo_potential(dn, old, adv, mask, lo, hi, level, agg)) / (2 * h)
    assert torch.allclose(x.grad, num, atol=1e-8)


# ------------------------------------------------------------------------------------------ invariances
@pytest.mark.parametrize("level", ["token", "sequence", "sequence_token"])
@pytest.mark.parametrize("agg", MODES)
def test_on_policy_every_surrogate_has_the_policy_gradient(level, agg):
    # r = 1: ppo_clip's gradient is -A d lp; cispo's weight is 1; sapo's gate weight 4 p (1 - p) is 1.
    lp, _, adv, mask = _batch(2)
    old = lp.clone()
    grads = {}
    for sur in ("ppo_clip", "cispo", "sapo"):
        if level not in SURROGATES.get(sur).levels:
            continue
        x = lp.clone().requires_grad_()
        algos.policy_loss(x, old, adv, mask, ratio=level, agg=agg, max_len=6, surrogate=sur)[0].backward()
        grads[sur] = x.grad
    for sur, g in grads.items():
        assert torch.allclose(g, grads["ppo_clip"], atol=1e-14), sur


@pytest.mark.parametrize("sur,kw", [("cispo", {}), ("cispo", {"eps_low_is": 0.1}), ("sapo", {})])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_garbage_under_mask_changes_nothing(sur, kw, level):
    lp, old, _, mask = _batch(3, spread=0.5)
    adv = torch.randn(lp.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    mask[1] = False
    dirty = dict(lp=torch.where(mask, lp, float("nan")), old=torch.where(mask, old, -float("inf")),
                 adv=torch.where(mask, adv, float("inf")))
    out = []
    for a, b, c in ((lp, old, adv), (dirty["lp"], dirty["old"], dirty["adv"])):
        x = a.clone().requires_grad_()
        loss, m = algos.policy_loss(x, b, c, mask, ratio=level, surrogate=sur, **kw)
        loss.backward()
        out.append((loss.detach(), x.grad, m))
    assert torch.equal(out[0][0], out[1][0])
    assert torch.equal(torch.where(mask, out[0][1], 0.0), out[1][1])
    assert all(torch.equal(out[0][2][k], out[1][2][k]) for k in out[0][2])


@pytest.mark.parametrize("sur", ["cispo", "sapo"])
def test_dtype_preserved(sur):
    lp, old, adv, mask = _batch(4)
    for dtype in (torch.float32, F64):
        loss, m = algos.policy_loss(lp.to(dtype), old.to(dtype), adv.to(dtype), mask, surrogate=sur)
        assert loss.dtype == dtype and all(v.dtype == dtype for v in m.values())


# ------------------------------------------------------------------------------------- rejections
def test_levels_a_surrogate_does_not_accept_are_rejected():
    lp, old, adv, mask = _batch(5)
    with pytest.raises(ValueError, match="ratio 'sequence_token' is not accepted by surrogate 'cispo'"):
        algos.policy_loss(lp, old, adv, mask, ratio="sequence_token", surrogate="cispo")
    with pytest.raises(ValueError, match=r"RatioConfig\.level 'sequence_token' is not accepted by RatioConfig\.surrogate 'cispo'"):
        RatioConfig(level="sequence_token", surrogate="cispo")
    with pytest.raises(ValueError, match="surrogate must be one of.*cispo.*ppo_clip.*sapo"):
        algos.policy_loss(lp, old, adv, mask, surrogate="ppo")


@pytest.mark.parametrize(
    "sur,kw,name",
    [
        ("cispo", {"eps_high": 0.28}, "eps_high"),
        ("cispo", {"dual_clip": 3.0}, "dual_clip"),
        ("sapo", {"eps_low": 0.1}, "eps_low"),
        ("sapo", {"eps_high_is": 1.0}, "eps_high_is"),
        ("ppo_clip", {"tau_pos": 2.0}, "tau_pos"),
        ("ppo_clip", {"eps_low_is": 0.2}, "eps_low_is"),
    ],
)
def test_options_the_surrogate_does_not_read_are_rejected(sur, kw, name):
    lp, old, adv, mask = _batch(6)
    with pytest.raises(ValueError, match=f"^{name}=.* is not read by surrogate '{sur}'"):
        algos.policy_loss(lp, old, adv, mask, surrogate=sur, **kw)


@pytest.mark.parametrize("kw,name", [({"eps_low_is": -0.1}, "eps_low_is"), ({"eps_low_is": 1.5}, "eps_low_is"),
                                     ({"eps_high_is": -1.0}, "eps_high_is"), ({"tau_pos": 0.0}, "tau_pos"),
                                     ({"tau_neg": -1.0}, "tau_neg")])
def test_option_ranges(kw, name):
    lp, old, adv, mask = _batch(7)
    with pytest.raises(ValueError, match=f"^{name} must be"):
        algos.policy_loss(lp, old, adv, mask, **kw)
    with pytest.raises(ValueError, match=f"RatioConfig\\.{name}"):
        RatioConfig(**kw)


# ------------------------------------------------------------------------------------------- wiring
def test_option_defaults_agree_everywhere():
    sig = inspect.signature(algos.policy_loss).parameters
    cfg = RatioConfig()
    for name, default in OPTION_DEFAULTS.items():
        assert sig[name].default == default, name
        assert getattr(cfg, name) == default, name
    assert cfg.surrogate == sig["surrogate"].default == "ppo_clip"
    # every option is read by exactly one surrogate
    reads = [f for s in SURROGATES.names() for f in SURROGATES.get(s).reads]
    assert sorted(reads) == sorted(OPTION_DEFAULTS)


def test_registry_and_presets():
    assert SURROGATES.names() == ("cispo", "ppo_clip", "sapo")
    assert all(c.ratio.surrogate == "ppo_clip" for c in algos.presets.values())
    params = {tuple(inspect.signature(SURROGATES.get(n).loss).parameters) for n in SURROGATES.names()}
    assert params == {("ratio", "logp", "adv", "mask", "opts")}
    with pytest.raises(ValueError, match="already registered"):
        SURROGATES.register("cispo", SURROGATES.get("cispo"))


def _written_out(lp, old, adv, mask, surrogate, level, eps_low_is=None, eps_high_is=0.28, tau_pos=1.0,
                 tau_neg=1.05):
    """The loss and its gradient d loss / d lp of one surrogate under agg = seq_mean_token_mean, written out from
    the papers' formulas with Python floats, one token at a time (no algos code):

        loss = (1/B) sum_i (1/n_i) sum_{t valid} l_it,   r = exp(lp - old) per token, or for the sequence
        level s_i = exp((1/n_i) sum_{t valid} (lp_it - old_it)) for every token of y_i
        cispo: l = -w A lp, w = clip(r, 1 - eps_low_is, 1 + eps_high_is) a constant: dl/dlp = -w A
        sapo:  l = -(4/tau) sigmoid(tau (r - 1)) A, tau = tau_pos if A > 0 else tau_neg:
               dl/dlp = -4 p (1 - p) r A with p = sigmoid(tau (r - 1)) (token level)
    """
    B, T = mask.shape
    lp_, old_, adv_, mask_ = lp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    loss, grad = 0.0, [[0.0] * T for _ in range(B)]
    for i in range(B):
        valid = [t for t in range(T) if mask_[i][t]]
        n, A = len(valid), adv_[i]
        s = math.exp(sum(lp_[i][t] - old_[i][t] for t in valid) / n)
        for t in valid:
            r = s if level == "sequence" else math.exp(lp_[i][t] - old_[i][t])
            if surrogate == "cispo":
                w = min(r, 1.0 + eps_high_is)
                if eps_low_is is not None:
                    w = max(w, 1.0 - eps_low_is)
                l, d = -w * A * lp_[i][t], -w * A
            else:
                assert surrogate == "sapo" and level == "token"
                tau = tau_pos if A > 0 else tau_neg
                p = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
                l, d = -(4.0 / tau) * p * A, -4.0 * p * (1.0 - p) * r * A
            loss += l / (n * B)
            grad[i][t] = d / (n * B)
    return loss, grad


@pytest.mark.parametrize("overrides,written_out", [
    ({"ratio.surrogate": "cispo", "ratio.eps_low_is": 0.2, "ratio.eps_high_is": 0.1},
     {"surrogate": "cispo", "level": "token", "eps_low_is": 0.2, "eps_high_is": 0.1}),
    ({"ratio.surrogate": "sapo", "ratio.tau_pos": 1.5, "ratio.tau_neg": 3.0},
     {"surrogate": "sapo", "level": "token", "tau_pos": 1.5, "tau_neg": 3.0}),
    ({"ratio.surrogate": "cispo", "ratio.level": "sequence", "ratio.eps_low_is": 0.05, "ratio.eps_high_is": 0.05},
     {"surrogate": "cispo", "level": "sequence", "eps_low_is": 0.05, "eps_high_is": 0.05}),
])
def test_compute_loss_uses_the_configured_surrogate(overrides, written_out):
    # compute_loss on a grpo config with the surrogate, its options and the ratio level overridden equals the
    # surrogate's formula written out above with those options (value and gradient); the options are chosen
    # away from their defaults and tight enough that they bind on this batch, so a surrogate, an option or a
    # ratio level that compute_loss failed to pass on gives other numbers
    lp, old, adv, mask = _batch(8)
    cfg = with_overrides(algos.get_preset("grpo", group_size=2, kl__placement="none", kl__beta=0.0), overrides)
    assert cfg.loss.agg == "seq_mean_token_mean"
    x = lp.clone().requires_grad_()
    loss, metrics = algos.compute_loss(cfg, logp=x, old_logp=old, advantages=adv, mask=mask)
    loss.backward()
    want, want_grad = _written_out(lp, old, adv, mask, **written_out)
    assert loss.item() == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert x.grad.tolist() == [pytest.approx(row, rel=1e-12, abs=1e-15) for row in want_grad]
    assert all(k in algos.METRIC_DOCS for k in metrics)
    if written_out["surrogate"] == "cispo":  # the clip bounds bind on this batch: some weight is clipped
        assert metrics["clipfrac_low"] > 0 and metrics["clipfrac_high"] > 0

"""algos.compute_advantages / compute_loss / compute_value_loss: KL placement by hand, composition of the
loss terms, mask-garbage invariance end to end, metrics contract, purity of the package."""

import ast
import math
from pathlib import Path

import pytest
import torch
from import_graph import objbench_subpackages as _objbench_subpackages

from objbench import algos
from objbench.algos.config_dict import with_overrides

F64 = torch.float64
ALGOS_DIR = Path(algos.__file__).parent


def t(x):
    return torch.tensor(x, dtype=F64)


def _batch(seed, B=8, T=6, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:, 0] = True
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 2
    lp = old + 0.2 * torch.randn(B, T, generator=g, dtype=dtype)
    ref = old + 0.3 * torch.randn(B, T, generator=g, dtype=dtype)
    values = torch.randn(B, T, generator=g, dtype=dtype)
    ent = torch.rand(B, T, generator=g, dtype=dtype)
    rewards = (torch.rand(B, generator=g) > 0.5).to(dtype)
    return dict(mask=mask, old=old, lp=lp, ref=ref, values=values, ent=ent, rewards=rewards)


# ---------------------------------------------------------------------------------------- advantages
def test_group_advantages_broadcast_by_hand():
    # GRPO, G = 2, rewards [1, 0, 0, 1]: A = +-0.70710578 (see test_algos_advantages), on valid tokens only
    cfg = algos.get_preset("grpo", group_size=2)
    mask = torch.tensor([[True, True, False], [True, False, False], [True, True, True], [True, True, False]])
    adv, ret, m = algos.compute_advantages(cfg, rewards=t([1.0, 0.0, 0.0, 1.0]), mask=mask)
    a = 0.70710578
    assert ret is None
    assert torch.allclose(adv, t([[a, a, 0], [-a, 0, 0], [-a, -a, -a], [a, a, 0]]), atol=1e-8)
    assert m["zero_var_frac"].item() == 0.0 and m["reward_mean"].item() == 0.5


def test_kl_in_reward_group_by_hand():
    # Dr.-GRPO-style scale "none", G = 4, k1 in the reward with beta 0.1.
    # old - ref = k1 per token: row 0 = [0.6, 0.4] (sum 1.0), other rows 0 -> shaped R = [0.9, 0, 0, 1]
    # mean 0.475 -> A = [0.425, -0.475, -0.475, 0.525]
    cfg = algos.get_preset("dr_grpo", group_size=4, kl__estimator="k1", kl__placement="reward", kl__beta=0.1)
    mask = torch.ones(4, 2, dtype=torch.bool)
    ref = torch.zeros(4, 2, dtype=F64)
    old = t([[0.6, 0.4], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    adv, _, m = algos.compute_advantages(cfg, rewards=t([1.0, 0.0, 0.0, 1.0]), mask=mask, old_logp=old, ref_logp=ref)
    assert torch.allclose(adv[:, 0], t([0.425, -0.475, -0.475, 0.525]), atol=1e-12)
    assert torch.equal(adv[:, 0], adv[:, 1])
    assert m["kl_in_reward_mean"].item() == pytest.approx(1.0 / 8)  # (0.6 + 0.4) / 8 valid tokens
    with pytest.raises(ValueError, match="old_logp"):
        algos.compute_advantages(cfg, rewards=t([1.0, 0.0, 0.0, 1.0]), mask=mask)


def _kl_reward_all_correct_group(beta, check, estimator="group"):
    # group 0 is all correct (R = 1, 1, 1, 1) with k1 = old - ref per token
    #   row 0 [0.1, 0.2], row 1 [0.0, 0.1], row 2 [0.2, 0.2], row 3 [0.0, 0.0] -> sums s = [0.3, 0.1, 0.4, 0.0];
    # group 1 is mixed (R = 1, 0, 0, 1) with no KL (old = ref)
    cfg = algos.ObjectiveConfig(
        group_size=4,
        adv=algos.AdvantageConfig(estimator=estimator, eps=0.0) if estimator == "group" else
        algos.AdvantageConfig(estimator=estimator),
        kl=algos.KLConfig(estimator="k1", placement="reward", beta=beta, reward_zero_var_check=check),
    )
    mask = torch.ones(8, 2, dtype=torch.bool)
    old = t([[0.1, 0.2], [0.0, 0.1], [0.2, 0.2], [0.0, 0.0]] + [[0.0, 0.0]] * 4)
    ref = torch.zeros(8, 2, dtype=F64)
    rewards = t([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    return algos.compute_advantages(cfg, rewards=rewards, mask=mask, old_logp=old, ref_logp=ref)


def test_kl_in_reward_all_equal_test_shaped_vs_outcome_by_hand():
    # shaped (default, verl): group 0's shaped rewards 1 - beta s are not all equal;
    #   centred: -beta (s - mean s) = -beta [0.1, -0.1, 0.2, -0.2]
    #   unbiased std: beta sqrt((0.01 + 0.01 + 0.04 + 0.04) / 3) = beta 0.18257419
    #   A = -[0.1, -0.1, 0.2, -0.2] / 0.18257419 = [-0.54772256, 0.54772256, -1.09544512, 1.09544512]
    #   -- beta cancels: beta 0.04 and beta 1e-4 give the same full-size advantages made of KL noise.
    # group 1 (no KL): A = +-0.5 / sqrt(1/3) = +-0.8660254 in both modes.
    noise = t([-0.54772256, 0.54772256, -1.09544512, 1.09544512])
    mixed = t([0.8660254, -0.8660254, -0.8660254, 0.8660254])
    a_big, _, m_big = _kl_reward_all_correct_group(0.04, "shaped")
    a_small, _, m_small = _kl_reward_all_correct_group(1e-4, "shaped")
    assert torch.allclose(a_big[:4, 0], noise, atol=1e-8) and torch.allclose(a_small[:4, 0], noise, atol=1e-8)
    assert torch.allclose(a_big, a_small, atol=1e-9)  # the same advantages whatever beta
    assert torch.allclose(a_big[4:, 0], mixed, atol=1e-7)
    assert m_big["zero_var_frac"].item() == 0.0  # no group looks all-equal any more
    # outcome: the all-equal test sees the outcome rewards -> group 0 gets exactly 0 at every token
    for beta in (0.04, 1e-4):
        a, _, m = _kl_reward_all_correct_group(beta, "outcome")
        assert torch.equal(a[:4], torch.zeros(4, 2, dtype=F64))
        assert torch.allclose(a[4:, 0], mixed, atol=1e-7) and torch.equal(a[4:, 0], a[4:, 1])
        assert m["zero_var_frac"].item() == 0.5
    # rloo has the same all-equal rule: outcome zeroes group 0; shaped gives G/(G-1) (shaped - mean) = beta-sized noise
    a, _, _ = _kl_reward_all_correct_group(0.04, "outcome", estimator="rloo")
    assert torch.equal(a[:4], torch.zeros(4, 2, dtype=F64))
    a, _, _ = _kl_reward_all_correct_group(0.04, "shaped", estimator="rloo")
    assert torch.allclose(a[:4, 0], -0.04 * 4 / 3 * t([0.1, -0.1, 0.2, -0.2]), atol=1e-12)


def test_outcome_test_changes_nothing_without_kl_in_the_reward():
    # beta 0: shaped rewards are the outcome rewards, both tests agree to the bit
    a, _, m = _kl_reward_all_correct_group(0.0, "outcome")
    b, _, n = _kl_reward_all_correct_group(0.0, "shaped")
    assert torch.equal(a, b) and torch.equal(m["zero_var_frac"], n["zero_var_frac"])
    assert torch.equal(a[:4], torch.zeros(4, 2, dtype=F64))


def test_kl_in_reward_gae_by_hand():
    # one response of 3 tokens, R = 1, k1 = old - ref = [0.1, 0.2, 0.3], beta 0.5, V = 0, gamma = lam = 1,
    # no whitening: token rewards [-0.05, -0.1, 1 - 0.15] = [-0.05, -0.1, 0.85];
    # A_t = sum of rewards from t on - V_t = [0.7, 0.75, 0.85]; returns = A + V = A
    cfg = with_overrides(algos.presets["ppo"], {"kl.beta": 0.5, "adv.whiten": False})
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv, ret, _ = algos.compute_advantages(cfg, rewards=t([1.0]), mask=mask, values=torch.zeros(1, 3, dtype=F64),
                                           old_logp=t([[0.1, 0.2, 0.3]]), ref_logp=torch.zeros(1, 3, dtype=F64))
    assert torch.allclose(adv, t([[0.7, 0.75, 0.85]]), atol=1e-12)
    assert torch.allclose(ret, t([[0.7, 0.75, 0.85]]), atol=1e-12)


def test_gae_reward_goes_on_last_valid_token_and_whitening():
    # rows of different lengths: R sits on each row's last valid token; with V = 0 and gamma = lam = 1 every
    # valid token's advantage is R_i before whitening, and returns are R_i
    # KL off: placement none reads no kl.* field, so PPO's k1 goes back to the default too
    cfg = with_overrides(algos.presets["ppo"], {"kl.placement": "none", "kl.beta": 0.0, "kl.estimator": "k3"})
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    adv, ret, _ = algos.compute_advantages(cfg, rewards=t([1.0, 0.0]), mask=mask,
                                           values=torch.zeros(2, 4, dtype=F64))
    assert torch.equal(ret, t([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    # whitened over the 4 valid tokens [1, 1, 1, 0]: mean 0.75, unbiased var 0.25 -> [0.5, 0.5, 0.5, -1.5]
    assert torch.allclose(adv, t([[0.5, 0.5, 0.5, 0.0], [-1.5, 0.0, 0.0, 0.0]]), atol=1e-6)
    with pytest.raises(ValueError, match="values"):
        algos.compute_advantages(cfg, rewards=t([1.0, 0.0]), mask=mask)


def test_filtered_row_keeps_its_reward_in_the_baseline():
    # an overlong-filtered response (all-False row) still counts in its group's mean; its advantage is 0
    cfg = algos.get_preset("dr_grpo", group_size=4)
    mask = torch.ones(4, 3, dtype=torch.bool)
    mask[3] = False
    adv, _, _ = algos.compute_advantages(cfg, rewards=t([1.0, 0.0, 0.0, 1.0]), mask=mask)
    assert torch.allclose(adv[:, 0], t([0.5, -0.5, -0.5, 0.0]))


def test_advantage_errors():
    cfg = algos.presets["grpo"]
    with pytest.raises(ValueError, match="group_size"):
        algos.compute_advantages(cfg, rewards=torch.zeros(6, dtype=F64), mask=torch.ones(6, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="rewards"):
        algos.compute_advantages(cfg, rewards=torch.zeros(7, dtype=F64), mask=torch.ones(8, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        algos.compute_advantages(cfg, rewards=torch.zeros(8, dtype=F64), mask=torch.full((8, 2), 2.0))


# ---------------------------------------------------------------------------------------------- loss
def test_loss_is_policy_plus_beta_kl_minus_entropy():
    b = _batch(0)
    cfg = with_overrides(algos.get_preset("grpo", group_size=4), {"loss.entropy_coef": 0.01})
    adv, _, _ = algos.compute_advantages(cfg, rewards=b["rewards"], mask=b["mask"])
    loss, m = algos.compute_loss(cfg, logp=b["lp"], old_logp=b["old"], advantages=adv, mask=b["mask"],
                                 ref_logp=b["ref"], entropy=b["ent"])
    pg, _ = algos.policy_loss(b["lp"], b["old"], adv, b["mask"], agg="seq_mean_token_mean")
    kl = algos.aggregate(algos.kl.estimate(b["lp"], b["ref"], "k3"), b["mask"], "seq_mean_token_mean")
    ent = algos.aggregate(b["ent"], b["mask"], "seq_mean_token_mean")
    assert torch.allclose(loss, pg + 0.04 * kl - 0.01 * ent, atol=1e-14)
    assert torch.allclose(m["policy_loss"], pg) and torch.allclose(m["kl_loss"], kl) and torch.allclose(m["entropy"], ent)


def test_loss_requirements_name_the_argument():
    b = _batch(1)
    cfg = algos.get_preset("grpo", group_size=4)
    adv = torch.zeros_like(b["lp"])
    with pytest.raises(ValueError, match="ref_logp"):
        algos.compute_loss(cfg, logp=b["lp"], old_logp=b["old"], advantages=adv, mask=b["mask"])
    cfg_h = with_overrides(algos.presets["dapo"], {"loss.entropy_coef": 0.01})
    with pytest.raises(ValueError, match="entropy"):
        algos.compute_loss(cfg_h, logp=b["lp"], old_logp=b["old"], advantages=adv, mask=b["mask"])
    with pytest.raises(ValueError, match="max_len"):
        algos.compute_loss(algos.presets["dr_grpo"], logp=b["lp"], old_logp=b["old"], advantages=adv, mask=b["mask"])


def test_max_len_precedence():
    # seq_mean_token_sum_norm: cfg.loss.max_len wins over the argument; the argument is the fallback
    b = _batch(2)
    adv = torch.randn(b["lp"].shape, generator=torch.Generator().manual_seed(0), dtype=F64)
    kw = dict(logp=b["lp"], old_logp=b["old"], advantages=adv, mask=b["mask"])
    l_arg, _ = algos.compute_loss(algos.presets["dr_grpo"], max_len=12, **kw)
    l_cfg, _ = algos.compute_loss(with_overrides(algos.presets["dr_grpo"], {"loss.max_len": 12}), max_len=99, **kw)
    l_6, _ = algos.compute_loss(algos.presets["dr_grpo"], max_len=6, **kw)
    assert torch.equal(l_arg, l_cfg) and torch.allclose(l_6, 2 * l_arg, atol=1e-14)  # 1/L scaling


@pytest.mark.parametrize("name", ["ppo", "grpo", "dr_grpo", "dapo", "gspo"])
def test_garbage_under_mask_end_to_end(name):
    b = _batch(3)
    cfg = algos.get_preset(name) if name == "ppo" else algos.get_preset(name, group_size=4)
    cfg = with_overrides(cfg, {"loss.entropy_coef": 0.01})
    if cfg.kl.placement == "none":
        cfg = with_overrides(cfg, {"kl.placement": "loss", "kl.beta": 0.02, "kl.estimator": "k3_ratio"})
    mask = b["mask"].clone()
    mask[1] = False  # a filtered row
    nan, inf = float("nan"), float("inf")

    def dirty(x, fill):
        return torch.where(mask, x, torch.full_like(x, fill))

    def run(lp, old, ref, ent, values):
        adv, ret, ma = algos.compute_advantages(cfg, rewards=b["rewards"], mask=mask, values=values,
                                                old_logp=old, ref_logp=ref, max_len=6)
        lp = lp.detach().clone().requires_grad_()
        ent = ent.detach().clone().requires_grad_()
        loss, ml = algos.compute_loss(cfg, logp=lp, old_logp=old, advantages=adv, mask=mask, ref_logp=ref,
                                      entropy=ent, max_len=6)
        loss.backward()
        out = {"adv": adv, "loss": loss.detach(), "g_lp": lp.grad, "g_ent": ent.grad, **ma, **ml}
        if ret is not None:
            v = values.detach().clone().requires_grad_()
            vl, mv = algos.compute_value_loss(cfg, values=v, old_values=values, returns=ret, mask=mask)
            vl.backward()
            out.update(ret=ret, vloss=vl.detach(), g_v=v.grad, **mv)
        return out

    clean = run(b["lp"], b["old"], b["ref"], b["ent"], b["values"])
    noisy = run(dirty(b["lp"], nan), dirty(b["old"], inf), dirty(b["ref"], -inf), dirty(b["ent"], nan),
                dirty(b["values"], nan))
    assert clean.keys() == noisy.keys()
    for k in clean:
        a, c = clean[k], noisy[k]
        if k.startswith("g_"):
            a = torch.where(mask, a, torch.zeros_like(a))
        assert torch.equal(a, c), (name, k)
        assert torch.isfinite(c).all(), (name, k)


@pytest.mark.parametrize("name", ["ppo", "grpo", "dr_grpo", "dapo", "gspo"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_presets_run_preserve_dtype_and_document_metrics(name, dtype):
    b = _batch(4, dtype=dtype)
    cfg = algos.get_preset(name) if name == "ppo" else algos.get_preset(name, group_size=4)
    adv, ret, ma = algos.compute_advantages(cfg, rewards=b["rewards"], mask=b["mask"], values=b["values"],
                                            old_logp=b["old"], ref_logp=b["ref"], max_len=6)
    lp = b["lp"].clone().requires_grad_()
    loss, ml = algos.compute_loss(cfg, logp=lp, old_logp=b["old"], advantages=adv, mask=b["mask"],
                                  ref_logp=b["ref"], entropy=b["ent"], max_len=6)
    loss.backward()
    metrics = {**ma, **ml}
    assert adv.dtype == dtype and loss.dtype == dtype and lp.grad.dtype == dtype and torch.isfinite(lp.grad).all()
    assert (ret is not None) == (cfg.adv.estimator == "gae")
    if ret is not None:
        v = b["values"].clone().requires_grad_()
        vl, mv = algos.compute_value_loss(cfg, values=v, old_values=b["values"], returns=ret, mask=b["mask"])
        assert vl.dtype == dtype
        metrics.update(mv)
    for k, v in metrics.items():
        assert k in algos.METRIC_DOCS, f"undocumented metric {k}"
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad and v.dtype == dtype, k
    assert not adv.requires_grad


def test_value_loss_entry_point_matches_component():
    b = _batch(5)
    cfg = algos.presets["ppo"]
    ret = torch.randn(b["values"].shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    v = b["values"] + 0.7
    l1, m1 = algos.compute_value_loss(cfg, values=v, old_values=b["values"], returns=ret, mask=b["mask"])
    l2, _ = algos.advantages.value_loss(v, b["values"], ret, b["mask"], 0.5, "token_mean")
    assert torch.equal(l1, l2) and 0 < m1["value_clipfrac"].item() < 1


def test_on_policy_first_step_grpo_vs_gspo_through_the_entry_point():
    # same rollout, on-policy: GRPO (without KL) and GSPO give the same loss and gradient
    b = _batch(6)
    grpo = algos.get_preset("grpo", group_size=4, kl__placement="none", kl__beta=0.0)
    gspo = algos.get_preset("gspo", group_size=4)
    adv, _, _ = algos.compute_advantages(grpo, rewards=b["rewards"], mask=b["mask"])
    grads = []
    for cfg in (grpo, gspo):
        lp = b["lp"].clone().requires_grad_()
        loss, _ = algos.compute_loss(cfg, logp=lp, old_logp=b["lp"], advantages=adv, mask=b["mask"])
        loss.backward()
        grads.append((loss.detach(), lp.grad))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-14)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-14)


# ------------------------------------------------------------------------------------------- purity
def _algos_sources():
    return sorted(ALGOS_DIR.glob("*.py"))


def test_algos_imports_nothing_else_of_objbench():
    forbidden = {"envs", "rollout", "experiments", "analysis"}
    for path in _algos_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            for mod in _objbench_subpackages(node):
                assert mod not in forbidden, f"{path.name} imports objbench.{mod}"


def test_subpackage_import_check_sees_every_form():
    forms = {"import objbench.envs.base": ["envs"], "from objbench.rollout.sft import x": ["rollout"],
             "from objbench import experiments, algos": ["experiments", "algos"], "from .kl import k": [],
             "import torch": []}
    for code, want in forms.items():
        assert _objbench_subpackages(ast.parse(code).body[0]) == want, code


def test_no_item_print_or_logging_in_components():
    # component code never syncs or logs: no .item()/.tolist()/.cpu()/.numpy() calls, no print, no logging
    # conformance.py is not a component: it checks a plug-in member once, on a small CPU batch, before training
    for path in [p for p in _algos_sources() if p.name != "conformance.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                fn = node.func
                if isinstance(fn, ast.Attribute):
                    assert fn.attr not in {"item", "tolist", "cpu", "numpy"}, f"{path.name}:{node.lineno} .{fn.attr}()"
                if isinstance(fn, ast.Name):
                    assert fn.id != "print", f"{path.name}:{node.lineno} print()"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert "logging" not in names, f"{path.name} imports logging"


def test_public_names():
    for name in ("compute_advantages", "compute_loss", "compute_value_loss", "policy_loss", "aggregate",
                 "presets", "get_preset", "ObjectiveConfig"):
        assert hasattr(algos, name), name
    assert callable(algos.kl.estimate) and callable(algos.kl.exact_kl)
    assert callable(algos.advantages.group_relative) and callable(algos.advantages.gae)
    assert math.isclose(algos.presets["grpo"].kl.beta, 0.04)

"""Seed 003's other directions as components, by hand: schedules (algos.schedules), the hybrid advantage, group
selection and group reward correction (algos.filters)."""

import dataclasses
import math

import pytest
import torch

from objbench import algos
from objbench.algos.advantages import group_relative, rloo
from objbench.algos.config import ObjectiveConfig
from objbench.algos.config_dict import config_from_dict, config_to_dict, with_overrides
from objbench.algos.filters import group_reward_correction, top_fraction_keep
from objbench.algos.schedules import (
    Schedule,
    TemperatureControl,
    check_temperature,
    controlled_temperature,
    objective_at,
    progress,
    scheduled_values,
    value_at,
)

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


# ------------------------------------------------------------------------------------------------ schedules
def test_schedule_kinds_by_hand():
    lin = Schedule(kind="linear", end=0.05)
    # 0.2 + (0.05 - 0.2) p:  p = 0.25 -> 0.1625
    assert [value_at(lin, 0.2, p) for p in (0.0, 0.25, 1.0)] == pytest.approx([0.2, 0.1625, 0.05], abs=1e-15)
    cos = Schedule(kind="cosine", end=0.05)
    # 0.05 + 0.15 (1 + cos(pi p)) / 2:  p = 0.25 -> 0.05 + 0.075 (1 + 0.70710678) = 0.17803301;  p = 0.5 -> 0.125
    assert [value_at(cos, 0.2, p) for p in (0.0, 0.25, 0.5, 1.0)] == pytest.approx([0.2, 0.17803301, 0.125, 0.05],
                                                                                    abs=1e-8)
    step = Schedule(kind="step", at=[0.5, 0.8], values=[0.1, 0.05])
    # 0.2 before 0.5, 0.1 from 0.5, 0.05 from 0.8
    assert [value_at(step, 0.2, p) for p in (0.0, 0.49, 0.5, 0.79, 0.8, 1.0)] == [0.2, 0.2, 0.1, 0.1, 0.05, 0.05]
    assert [value_at(Schedule(), 0.2, p) for p in (0.0, 0.5, 1.0)] == [0.2, 0.2, 0.2]
    # progress of step t of T: (t - 1) / (T - 1)
    assert [progress(s, 5) for s in (1, 2, 3, 5)] == [0.0, 0.25, 0.5, 1.0] and progress(1, 1) == 0.0


@pytest.mark.parametrize("kw,pattern", [
    (dict(kind="exp"), r"Schedule\.kind must be one of \['constant', 'cosine', 'linear', 'step'\]"),
    (dict(kind="linear"), r"Schedule\.end is required by kind 'linear'"),
    (dict(kind="linear", end=float("nan")), r"Schedule\.end must be a finite number"),
    (dict(kind="cosine", end=float("inf")), r"Schedule\.end must be a finite number"),
    (dict(kind="linear", end=0.1, at=[0.5]), r"Schedule\.at = \[0\.5\] is not read by kind 'linear'"),
    (dict(kind="constant", end=0.1), r"Schedule\.end = 0\.1 is not read by kind 'constant'"),
    (dict(kind="step", at=[0.5], values=[]), r"Schedule\.at and Schedule\.values must be non-empty"),
    (dict(kind="step", at=[0.5, 0.5], values=[1.0, 2.0]), r"Schedule\.at must be strictly increasing"),
    (dict(kind="step", at=[0.0], values=[1.0]), r"Schedule\.at must be strictly increasing fractions in \(0, 1\]"),
    (dict(kind="step", at=[0.5], values=[float("nan")]), r"Schedule\.values\[0\] must be a finite number"),
    (dict(kind="linear", end="0.1"), r"Schedule\.end must be a float"),
])
def test_schedule_validation(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        Schedule(**kw)


def _sched(cfg, **schedules):
    # _sched(cfg, ratio__eps_high=Schedule(...)) -> cfg with that schedule
    return with_overrides(cfg, {f"schedules.{k.replace('__', '.')}": v for k, v in schedules.items()})


def test_objective_at_replaces_the_scheduled_fields():
    grpo = algos.get_preset("grpo")
    cfg = _sched(grpo, ratio__eps_high=Schedule(kind="linear", start=0.2, end=0.05),
                 kl__beta=Schedule(kind="step", at=[0.5], values=[0.01]))
    assert cfg.schedules["ratio"]["eps_high"].end == 0.05
    mid = objective_at(cfg, 0.5)
    # eps_high 0.2 + (0.05 - 0.2) 0.5 = 0.125; beta 0.04 until progress 0.5, then 0.01
    assert mid.ratio.eps_high == 0.125 and mid.kl.beta == 0.01 and mid.schedules == {}
    assert dataclasses.replace(mid, ratio=grpo.ratio, kl=grpo.kl) == grpo  # nothing else moved
    assert scheduled_values(cfg, 0.0) == {"ratio.eps_high": 0.2, "kl.beta": 0.04}
    assert objective_at(grpo, 0.7) is grpo  # no schedules: the config itself
    # the same through the dotted form of with_overrides (as the command line gives it), and a dict round trip
    dotted = with_overrides(grpo, {"schedules.ratio.eps_high.kind": "linear", "schedules.ratio.eps_high.end": 0.05,
                                   "schedules.kl.beta.kind": "step", "schedules.kl.beta.at": [0.5],
                                   "schedules.kl.beta.values": [0.01]})
    assert dotted.schedules["ratio"]["eps_high"] == Schedule(kind="linear", end=0.05)
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_entropy_coef_and_hybrid_alpha_follow_schedules():
    cfg = _sched(ObjectiveConfig(adv=algos.AdvantageConfig(estimator="hybrid", alpha=0.8)),
                 adv__alpha=Schedule(kind="linear", end=0.2), loss__entropy_coef=Schedule(kind="cosine", end=0.01))
    end = objective_at(cfg, 1.0)
    assert end.adv.alpha == pytest.approx(0.2) and end.loss.entropy_coef == 0.01
    assert objective_at(cfg, 0.5).loss.entropy_coef == pytest.approx(0.005)  # cosine midpoint of 0 and 0.01


@pytest.mark.parametrize("schedules,pattern", [
    ({"foo.bar": Schedule()}, r"schedules\.foo: ObjectiveConfig has no section 'foo'"),
    ({"ratio.eps_hi": Schedule(kind="linear", end=0.1)}, r"RatioConfig has no field 'eps_hi'; its float fields: "
                                                          r"eps_low, eps_high"),
    ({"loss.agg": Schedule()}, r"loss\.agg is not a float field"),
    ({"loss.max_len": Schedule()}, r"loss\.max_len is not a float field"),
    ({"ratio.tau_pos": Schedule(kind="linear", end=2.0)},
     r"ratio\.tau_pos is not read by ratio\.surrogate = 'ppo_clip', so its schedule would change nothing"),
    ({"kl.beta": Schedule(kind="linear", end=0.1)}, r"kl\.beta is not read by kl\.placement = 'none'"),
    ({"ratio.dual_clip": Schedule(kind="linear", end=3.0)}, r"ratio\.dual_clip is None \(off\)"),
    ({"ratio.eps_high": Schedule(kind="linear", start=0.3, end=0.1)},
     r"schedules\.ratio\.eps_high\.start = 0\.3 but ratio\.eps_high = 0\.2"),
    ({"ratio.eps_low": Schedule(kind="linear", end=1.0)},
     r"reach an invalid setting at progress 1 .*RatioConfig\.eps_low must be in \[0, 1\)"),
    ({"ratio.eps_low": Schedule(kind="step", at=[0.3], values=[-0.1])},
     r"reach an invalid setting at progress 0\.3"),
])
def test_objective_schedules_are_validated(schedules, pattern):
    with pytest.raises(ValueError, match=pattern):
        with_overrides(ObjectiveConfig(), {f"schedules.{k}": v for k, v in schedules.items()})


def test_critic_learning_rate_cannot_be_scheduled():
    ppo = algos.get_preset("ppo")
    with pytest.raises(ValueError, match=r"value\.lr_scale cannot follow a schedule: the loop reads it once"):
        with_overrides(ppo, {"schedules.value.lr_scale": Schedule(kind="linear", end=0.5)})
    with_overrides(ppo, {"schedules.value.coef": Schedule(kind="linear", end=0.5)})  # read every step: fine


def test_temperature_control_by_hand():
    ctl = TemperatureControl(target=1.0, gain=0.5, low=0.7, high=1.2)
    # 1.0 + 0.5 (1.0 - 0.8) = 1.1;  1.2 + 0.5 (1.0 - 2.36) = 0.52 -> clamped to 0.7;  1.1 + 0.5 (1.0 - 0.2) = 1.5 -> 1.2
    assert controlled_temperature(1.0, 0.8, ctl) == pytest.approx(1.1)
    assert controlled_temperature(1.2, 2.36, ctl) == 0.7 and controlled_temperature(1.1, 0.2, ctl) == 1.2
    assert controlled_temperature(1.0, float("nan"), ctl) == 1.0  # no update ran: unchanged
    assert controlled_temperature(1.0, 0.1, TemperatureControl()) == 1.0  # off


def test_temperature_checks():
    check_temperature(1.2, Schedule(kind="cosine", end=0.7), TemperatureControl())
    check_temperature(1.2, Schedule(), TemperatureControl(target=0.5))
    for args, pattern in [
        ((1.2, Schedule(kind="linear", end=0.7), TemperatureControl(target=0.5)), "both set the temperature"),
        ((1.5, Schedule(), TemperatureControl(target=0.5)), r"rollout\.temperature = 1\.5 must lie in"),
        ((1.0, Schedule(kind="linear", end=-0.1), TemperatureControl()), "must stay > 0"),
        ((1.0, Schedule(kind="step", at=[0.5], values=[0.0]), TemperatureControl()), "must stay > 0"),
        ((1.0, Schedule(kind="linear", start=1.2, end=0.7), TemperatureControl()), "starts at 1.2"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            check_temperature(*args)
    with pytest.raises(ValueError, match=r"TemperatureControl\.gain = 0\.3 is not read while"):
        TemperatureControl(gain=0.3)
    with pytest.raises(ValueError, match=r"TemperatureControl\.low and TemperatureControl\.high"):
        TemperatureControl(target=1.0, low=1.3, high=1.2)


# ------------------------------------------------------------------------------------------------- hybrid
def test_hybrid_advantage_by_hand():
    # one group of two: R = [1, 0]; row 0 has two valid tokens, row 1 one; V = [[0.5, 0.25], [0.2, -]]
    # GAE (gamma = lam = 1, not whitened): row 0: delta_1 = 1 - 0.25 = 0.75, delta_0 = 0.25 - 0.5 = -0.25
    #   -> A = [0.5, 0.75], returns [1, 1];  row 1: delta_0 = 0 - 0.2 -> A = -0.2, returns 0
    # group (std, eps 0): +-0.5 / 0.70710678 = +-0.70710678
    # alpha 0.25: row 0: 0.17677670 + 0.75 [0.5, 0.75] = [0.55177670, 0.73927670]; row 1: -0.17677670 - 0.15
    cfg = ObjectiveConfig(group_size=2, adv=algos.AdvantageConfig(estimator="hybrid", alpha=0.25, eps=0.0,
                                                                   whiten=False))
    mask = torch.tensor([[True, True], [True, False]])
    values = t([[0.5, 0.25], [0.2, 99.0]])  # 99 under the mask: ignored
    adv, ret, _ = algos.compute_advantages(cfg, rewards=t([1.0, 0.0]), mask=mask, values=values)
    assert torch.allclose(adv, t([[0.55177670, 0.73927670], [-0.32677670, 0.0]]), atol=1e-8)
    assert torch.equal(ret, t([[1.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="values"):
        algos.compute_advantages(cfg, rewards=t([1.0, 0.0]), mask=mask)


def test_hybrid_ends_are_the_group_and_gae_estimators():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(8, generator=g, dtype=F64)
    v = torch.randn(8, 5, generator=g, dtype=F64)
    mask = torch.rand(8, 5, generator=g) > 0.3
    mask[:, 0] = True

    def run(estimator, **kw):
        cfg = ObjectiveConfig(group_size=4, adv=algos.AdvantageConfig(estimator=estimator, **kw))
        return algos.compute_advantages(cfg, rewards=r, mask=mask, values=v)[:2]

    assert torch.equal(run("hybrid", alpha=1.0)[0], run("group")[0])
    assert torch.equal(run("hybrid", alpha=0.0)[0], run("gae")[0])
    assert torch.equal(run("hybrid", alpha=0.3)[1], run("gae")[1])  # returns: GAE's, the critic's targets


def test_hybrid_declares_values_and_its_fields():
    est = algos.registry.ADVANTAGE_ESTIMATORS.get("hybrid")
    assert est.needs_values and not est.all_equal_zero and est.min_group_size == 2
    assert {"adv.alpha", "adv.scale", "adv.eps", "adv.gamma", "adv.lam", "adv.whiten", "value.coef"} <= set(est.reads)
    with pytest.raises(ValueError, match=r"adv\.alpha = 0\.3 is not read by adv\.estimator = 'group'"):
        ObjectiveConfig(adv=algos.AdvantageConfig(alpha=0.3))
    with pytest.raises(ValueError, match=r"AdvantageConfig\.alpha must be in \[0, 1\]"):
        algos.AdvantageConfig(estimator="hybrid", alpha=1.5)


# ---------------------------------------------------------------------------------------- group selection
def test_top_fraction_keep_by_hand():
    # sizes [2, 3, 4], top 30%: k = ceil(0.6) = 1, ceil(0.9) = 1, ceil(1.2) = 2
    #   [1, 0] -> the 1;  [0.5, 1, 0.5] -> the 1;  [1, 1, 0, 1] -> two of the three 1s: the earlier two (ties)
    r = t([1.0, 0.0, 0.5, 1.0, 0.5, 1.0, 1.0, 0.0, 1.0])
    keep = top_fraction_keep(r, [2, 3, 4], 0.3)
    assert keep.tolist() == [True, False, False, True, False, True, True, False, False]
    # at least two: k = 2, 2, 2 -- the tie 0.5 / 0.5 goes to the earlier response
    assert top_fraction_keep(r, [2, 3, 4], 0.3, min_keep=2).tolist() == [True, True, True, True, False,
                                                                          True, True, False, False]
    assert top_fraction_keep(r, [2, 3, 4], 1.0).all()
    # equal groups of 3, top 50%: k = 2 per group; [0, 1, 0.5] -> 1 and 0.5; [2, 2, 2] -> the first two
    assert top_fraction_keep(t([0.0, 1.0, 0.5, 2.0, 2.0, 2.0]), 3, 0.5).tolist() == [False, True, True,
                                                                                      True, True, False]
    with pytest.raises(ValueError, match="fraction"):
        top_fraction_keep(r, [2, 3, 4], 0.0)


def test_selected_rows_keep_their_reward_in_the_baseline():
    # the selection is a loss mask: advantages come from the whole group ([1, 0, 0, 0] -> 1.5, -0.5, ...), the
    # dropped rows get 0, the kept row keeps 1.5 (not 0, which a group of the kept row alone would give)
    cfg = ObjectiveConfig(group_size=4, adv=algos.AdvantageConfig(eps=0.0))
    r = t([1.0, 0.0, 0.0, 0.0])
    mask = torch.ones(4, 2, dtype=torch.bool) & top_fraction_keep(r, 4, 0.25)[:, None]
    adv, _, _ = algos.compute_advantages(cfg, rewards=r, mask=mask)
    assert torch.allclose(adv, t([[1.5, 1.5], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))


def test_group_reward_correction_by_hand():
    # sizes [2, 3, 4]; malformed shares 1/2 (not > 0.5), 2/3 (> 0.5), 1/4: only group 2 is scaled by 0.8
    r = t([1.0, 0.5, 1.0, 0.0, 0.5, 1.0, 1.0, 0.0, 0.0])
    flagged = torch.tensor([False, True, True, True, False, False, False, False, True])
    out, hit = group_reward_correction(r, flagged, [2, 3, 4], share=0.5, factor=0.8)
    assert hit.tolist() == [False, True, False]
    assert torch.equal(out, t([1.0, 0.5, 0.8, 0.0, 0.4, 1.0, 1.0, 0.0, 0.0]))
    out2, hit2 = group_reward_correction(r[:6], flagged[:6], 3, share=0.0, factor=0.5)  # equal groups of 3
    assert hit2.tolist() == [True, True] and torch.equal(out2, r[:6] * 0.5)
    with pytest.raises(ValueError, match="share"):
        group_reward_correction(r, flagged, [2, 3, 4], share=1.0, factor=0.8)


def test_group_correction_cancels_under_group_std_scaling():
    # (f R - f mean) / (f std) = (R - mean) / std: with eps 0 the std-scaled advantages do not move;
    # Dr. GRPO's and RLOO's advantages are scaled by f
    g = torch.Generator().manual_seed(1)
    r = torch.rand(12, generator=g, dtype=F64)
    flagged = torch.ones(12, dtype=torch.bool)
    out, _ = group_reward_correction(r, flagged, [3, 4, 5], share=0.5, factor=0.8)
    assert torch.allclose(group_relative(out, [3, 4, 5], eps=0.0), group_relative(r, [3, 4, 5], eps=0.0), atol=1e-12)
    none = group_relative(r, [3, 4, 5], scale="none")
    assert torch.allclose(group_relative(out, [3, 4, 5], scale="none"), 0.8 * none)
    assert torch.allclose(rloo(out, [3, 4, 5]), 0.8 * rloo(r, [3, 4, 5]))


def test_filter_switches_declare_their_fields():
    with pytest.raises(ValueError, match=r"filters\.top_fraction = 0\.5 is not read by filters\.top_select = False"):
        with_overrides(ObjectiveConfig(), {"filters.top_fraction": 0.5})
    with pytest.raises(ValueError, match=r"filters\.correction_factor = 0\.5 is not read by "
                                         r"filters\.group_correction = False"):
        with_overrides(ObjectiveConfig(), {"filters.correction_factor": 0.5})
    with_overrides(ObjectiveConfig(), {"filters.top_select": True, "filters.top_fraction": 0.5,
                                       "filters.group_correction": True, "filters.correction_factor": 0.5})
    with pytest.raises(ValueError, match=r"FilterConfig\.top_fraction must be in \(0, 1\]"):
        with_overrides(ObjectiveConfig(), {"filters.top_select": True, "filters.top_fraction": 0.0})
    assert math.isclose(algos.FilterConfig().top_fraction, 0.3)  # the seed's top 30%

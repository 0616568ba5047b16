"""Unequal and adaptive group sizes (algos.groups; seed 003 direction 1): every group function with one size per
group, by hand; the equal-size path unchanged; the size rules, the fixed budget and the running pass rate."""

import math
import random
import statistics

import pytest
import torch

from objbench import algos
from objbench.algos.advantages import group_relative, group_stats, rloo
from objbench.algos.config import GroupConfig, ObjectiveConfig
from objbench.algos.config_dict import with_overrides
from objbench.algos.filters import dynamic_sampling_keep
from objbench.algos.groups import fill_budget, layout, update_pass_rates, wanted_sizes

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


SIZES = [2, 3, 4]
R = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5]


# ----------------------------------------------------------------------------------- advantages by hand
def test_group_std_unequal_sizes_by_hand():
    # [1, 0]: mean 0.5, ddof-1 var (0.25 + 0.25) / 1 = 0.5, std 0.70710678      -> +-0.5 / 0.70710678 = +-0.70710678
    # [1, 0, 0]: mean 1/3, var (4/9 + 1/9 + 1/9) / 2 = 1/3, std 0.57735027       -> (2/3) / std = 1.15470054,
    #                                                                                 (-1/3) / std = -0.57735027
    # [1, 1, 0, 0.5]: mean 0.625, deviations .375 .375 -.625 -.125, var .6875 / 3 = 0.22916667, std 0.47871355
    #                 -> 0.78334945, -1.30558242, -0.26111648
    want = [0.70710678, -0.70710678, 1.15470054, -0.57735027, -0.57735027,
            0.78334945, 0.78334945, -1.30558242, -0.26111648]
    assert torch.allclose(group_relative(t(R), SIZES, eps=0.0), t(want), atol=1e-8)
    # eps is added to each group's own std: 0.5 / (0.70710678 + 1e-6) = 0.70710578
    assert group_relative(t(R), SIZES)[0].item() == pytest.approx(0.70710578, abs=1e-8)


def test_group_none_and_rloo_unequal_sizes_by_hand():
    # Dr. GRPO: R - mean of the own group (0.5; 1/3; 0.625)
    assert torch.allclose(group_relative(t(R), SIZES, scale="none"),
                          t([0.5, -0.5, 2 / 3, -1 / 3, -1 / 3, 0.375, 0.375, -0.625, -0.125]), atol=1e-15)
    # RLOO, the mean of the other G_g - 1 members of the own group:
    #   [1, 0] -> 1 - 0 = 1, 0 - 1 = -1;  [1, 0, 0] -> 1 - 0/2 = 1, 0 - 1/2 = -0.5 (twice)
    #   [1, 1, 0, .5] -> 1 - 1.5/3 = 0.5 (twice), 0 - 2.5/3 = -0.83333333, 0.5 - 2/3 = -0.16666667
    assert torch.allclose(rloo(t(R), SIZES), t([1.0, -1.0, 1.0, -0.5, -0.5, 0.5, 0.5, -2.5 / 3, 0.5 - 2 / 3]),
                          atol=1e-15)


def test_batch_scale_unequal_uses_the_batch_std():
    # centred on each group's mean, divided by the std of all nine rewards (ddof 1)
    sd = statistics.stdev(R)
    centred = [0.5, -0.5, 2 / 3, -1 / 3, -1 / 3, 0.375, 0.375, -0.625, -0.125]
    assert torch.allclose(group_relative(t(R), SIZES, scale="batch", eps=0.0), t([c / sd for c in centred]), atol=1e-12)


def test_all_equal_groups_are_exactly_zero_with_unequal_sizes():
    # 0.1 + 0.1 + 0.1 != 0.3 in floating point: the all-equal rule sets 0 explicitly, as in the equal-size path
    r = t([0.1, 0.1, 0.1, 1.0, 0.0])
    for scale in ("group", "batch", "none"):
        out = group_relative(r, [3, 2], scale=scale, eps=0.0)
        assert torch.equal(out[:3], torch.zeros(3, dtype=F64)) and torch.isfinite(out).all()
    assert torch.equal(rloo(r, [3, 2])[:3], torch.zeros(3, dtype=F64))


def test_singleton_groups_are_rejected_by_group_estimators_and_accepted_by_stats():
    r = t([1.0, 0.0, 1.0, 0.0, 0.0, 0.7])  # sizes [2, 3, 1]
    for fn in (lambda: group_relative(r, [2, 3, 1]), lambda: rloo(r, [2, 3, 1]),
               lambda: dynamic_sampling_keep(r, [2, 3, 1])):
        with pytest.raises(ValueError, match="group_size: every group needs >= 2 members.*singleton"):
            fn()
    st = group_stats(r, [2, 3, 1])
    # means 0.5, 1/3, 0.7; ddof-1 stds 0.70710678, 0.57735027 and 0 for the singleton; pass (>= 0.5) 1/2, 1/3, 1
    assert torch.allclose(st.mean, t([0.5, 1 / 3, 0.7]), atol=1e-15)
    assert torch.allclose(st.std, t([0.70710678, 0.57735027, 0.0]), atol=1e-8)
    assert torch.allclose(st.pass_rate, t([0.5, 1 / 3, 1.0]), atol=1e-15)
    assert st.zero_var.tolist() == [False, False, True]


def test_equal_sizes_given_as_a_list_take_the_reshape_path_bit_for_bit():
    g = torch.Generator().manual_seed(3)
    r = torch.rand(12, generator=g, dtype=F64)
    for scale in ("group", "batch", "none"):
        assert torch.equal(group_relative(r, [4, 4, 4], scale=scale), group_relative(r, 4, scale=scale))
    assert torch.equal(rloo(r, (3, 3, 3, 3)), rloo(r, 3))
    assert layout([4, 4, 4], 12) == (4, None) and layout([2, 3], 5) == (None, (2, 3))


def _loop_reference(rewards, sizes, scale, eps):
    out, start = [], 0
    for g in sizes:
        grp = rewards[start:start + g]
        m = sum(grp) / g
        if max(grp) == min(grp):
            out += [0.0] * g
        else:
            sd = {"group": statistics.stdev(grp), "batch": statistics.stdev(rewards), "none": None}[scale]
            out += [(x - m) if sd is None else (x - m) / (sd + eps) for x in grp]
        start += g
    return out


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_unequal_groups_match_a_plain_python_loop(scale):
    rng = random.Random(0)
    sizes = [rng.randint(2, 7) for _ in range(9)]
    rewards = [rng.choice([0.0, 1.0, 0.25]) for _ in range(sum(sizes))]
    got = group_relative(t(rewards), sizes, scale=scale, eps=1e-6)
    assert torch.allclose(got, t(_loop_reference(rewards, sizes, scale, 1e-6)), atol=1e-12)


def test_compute_advantages_with_group_sizes_by_hand():
    # sizes [2, 3]: [1, 0] -> +-0.70710578 (eps 1e-6); [1, 1, 1] all equal -> 0; zero_var_frac 1/2
    cfg = algos.get_preset("grpo")
    mask = torch.ones(5, 2, dtype=torch.bool)
    adv, ret, m = algos.compute_advantages(cfg, rewards=t([1.0, 0.0, 1.0, 1.0, 1.0]), mask=mask, group_sizes=[2, 3])
    assert ret is None and m["zero_var_frac"].item() == 0.5
    assert torch.allclose(adv[:, 0], t([0.70710578, -0.70710578, 0.0, 0.0, 0.0]), atol=1e-8)
    with pytest.raises(ValueError, match="group sizes sum to 6"):
        algos.compute_advantages(cfg, rewards=t([1.0, 0.0, 1.0, 1.0, 1.0]), mask=mask, group_sizes=[3, 3])
    with pytest.raises(ValueError, match="tensor"):
        algos.compute_advantages(cfg, rewards=t([1.0, 0.0, 1.0, 1.0, 1.0]), mask=mask, group_sizes=torch.tensor([2, 3]))


def test_outcome_zero_var_test_with_unequal_groups_by_hand():
    # KL in the reward with the all-equal test on the outcome: the all-correct group [1, 1, 1] gets 0 although its
    # shaped rewards (KL noise) differ; group [1, 0] keeps its (shaped) advantages
    cfg = with_overrides(algos.get_preset("grpo"), {"kl.placement": "reward", "kl.estimator": "k1", "kl.beta": 0.1,
                                                    "kl.reward_zero_var_check": "outcome"})
    mask = torch.ones(5, 1, dtype=torch.bool)
    old = t([[-1.0], [-1.0], [-1.0], [-2.0], [-3.0]])
    ref = t([[-1.0], [-1.0], [-1.5], [-1.5], [-1.5]])
    adv, _, m = algos.compute_advantages(cfg, rewards=t([1.0, 0.0, 1.0, 1.0, 1.0]), mask=mask, old_logp=old,
                                         ref_logp=ref, group_sizes=[2, 3])
    assert torch.equal(adv[2:], torch.zeros(3, 1, dtype=F64)) and m["zero_var_frac"].item() == 0.5
    assert torch.allclose(adv[:2, 0], t([0.70710578, -0.70710578]), atol=1e-8)  # k1 = 0 on rows 0 and 1


# ------------------------------------------------------------------------------------ rules and budget
def test_wanted_sizes_by_difficulty_and_by_pass_rate_by_hand():
    by_d = with_overrides(ObjectiveConfig(), {"groups.rule": "difficulty", "groups.thresholds": [2, 3],
                                              "groups.sizes": [4, 8, 12]})
    # level 1 < 2 -> 4; 2 <= level < 3 -> 8; level >= 3 -> 12
    assert wanted_sizes(by_d, [1, 2, 3, 4], {}) == [4, 8, 12, 12]
    by_p = with_overrides(ObjectiveConfig(), {"groups.rule": "pass_rate", "groups.thresholds": [0.2, 0.8],
                                              "groups.sizes": [12, 8, 4], "groups.prior": 0.5})
    # rates 0.9 -> 4 (easy), 0.5 -> 8, 0.1 -> 12 (hard); level 4 never seen: the prior 0.5 -> 8; 0.8 itself -> 4
    assert wanted_sizes(by_p, [1, 2, 3, 4, 5], {1: 0.9, 2: 0.5, 3: 0.1, 5: 0.8}) == [4, 8, 12, 8, 4]
    assert wanted_sizes(ObjectiveConfig(group_size=6), [1, 3], {}) == [6, 6]  # fixed


def test_fill_budget_by_hand():
    assert fill_budget([4, 12, 4, 12], 20) == [4, 12, 4]  # 4 + 12 + 4 = 20 exactly
    assert fill_budget([4, 12, 4, 12], 18) == [4, 12, 2]  # the last group trimmed to what is left
    assert fill_budget([4, 12, 4, 12], 17) == [4, 13]  # 12 would leave a singleton: the group takes it
    assert fill_budget([4, 4], 5) == [5]
    assert fill_budget([1, 1, 1], 3, min_size=1) == [1, 1, 1]  # GAE: singletons are fine
    with pytest.raises(ValueError, match="not enough"):
        fill_budget([4, 4], 12)
    with pytest.raises(ValueError, match="budget"):
        fill_budget([4], 1)


def test_running_pass_rate_by_hand():
    # prior 0.5, ema 0.25: level 1 sees 3 of 4 correct -> 0.75 * 0.5 + 0.25 * 0.75 = 0.5625;
    # level 2 sees 0 of 2 -> 0.375; level 3 not observed keeps 0.9
    out = update_pass_rates({3: 0.9}, [1, 1, 1, 1, 2, 2], [True, True, False, True, False, False], ema=0.25, prior=0.5)
    assert out == {1: 0.5625, 2: 0.375, 3: 0.9}
    assert update_pass_rates(out, [2], [True], ema=1.0, prior=0.5)[2] == 1.0  # ema 1: the last step only


def test_group_config_validation():
    for overrides, pattern in [
        ({"groups.rule": "difficulty", "groups.thresholds": [2.0], "groups.sizes": [4]},
         r"GroupConfig\.sizes must hold"),
        ({"groups.rule": "difficulty", "groups.thresholds": [3.0, 2.0], "groups.sizes": [4, 8, 12]},
         r"GroupConfig\.thresholds"),
        ({"groups.rule": "difficulty", "groups.thresholds": [2.0], "groups.sizes": [4, 12], "group_size": 4},
         r"ObjectiveConfig\.group_size = 4 is not read by groups\.rule = 'difficulty'"),
        ({"groups.rule": "difficulty", "groups.thresholds": [2.0], "groups.sizes": [1, 12]},
         r"ObjectiveConfig\.groups\.sizes must all be >= 2 for adv\.estimator='group'"),
        ({"groups.rule": "pass_rate", "groups.thresholds": [0.5], "groups.sizes": [4, 8], "groups.ema": 0.0},
         r"GroupConfig\.ema"),
        ({"groups.thresholds": [2.0]}, r"groups\.thresholds = \[2\.0\] is not read by groups\.rule = 'fixed'"),
        ({"groups.rule": "difficulty", "groups.thresholds": [2.0], "groups.sizes": [4, 12], "groups.prior": 0.9},
         r"groups\.prior = 0\.9 is not read by groups\.rule = 'difficulty'"),
        ({"groups.rule": "magic"}, r"GroupConfig\.rule must be one of"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            with_overrides(ObjectiveConfig(), overrides)
    with pytest.raises(ValueError, match=r"GroupConfig\.sizes\[1\] must be an int"):
        GroupConfig(rule="difficulty", thresholds=[2.0], sizes=[4, 1.5])
    # GAE accepts groups of one; dynamic sampling does not
    ok = with_overrides(algos.get_preset("ppo"), {"group_size": 8, "groups.rule": "difficulty",
                                                  "groups.thresholds": [2.0], "groups.sizes": [1, 2]})
    assert ok.groups.sizes == [1, 2]
    with pytest.raises(ValueError, match=r"groups\.sizes must all be >= 2 with filters\.dynamic_sampling"):
        with_overrides(ok, {"filters.dynamic_sampling": True})


def test_top_fraction_rounding_is_robust():
    # 0.28 * 25 = 7.000000000000001 in floating point: the top 28% of 25 is 7, not 8
    from objbench.algos.filters import top_fraction_keep

    assert 0.28 * 25 > 7 and top_fraction_keep(torch.arange(25, dtype=F64), 25, 0.28).sum().item() == 7
    assert math.ceil(0.3 * 8) == 3 and top_fraction_keep(torch.zeros(8, dtype=F64), 8, 0.3).sum().item() == 3

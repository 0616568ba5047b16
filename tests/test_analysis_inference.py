"""analysis.inference: every interval and test against numbers worked out by hand (written into the test), BCa against
scipy, the small-sample refusals, the verdict rule, and (slow) the coverage of the t interval."""

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from objbench.analysis.inference import (
    MIN_BOOTSTRAP_N,
    bca_interval,
    INCONCLUSIVE,
    apply_positive_control,
    compare_declared,
    compare_exploratory,
    detectable_difference,
    holm,
    mean_interval,
    permutation_test,
    sign_test,
    t_interval,
)
from objbench.analysis.stats import _rng, bootstrap_ci, mean_ci, prob_improvement, stratified_bootstrap_ci  # _rng: scipy's rng kw


# ------------------------------------------------------------------------------------------------ t interval
def test_t_interval_of_1_2_3_4_by_hand():
    # mean 2.5; deviations -1.5 -0.5 0.5 1.5 -> s^2 = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, s = 1.2909944
    # se = s / sqrt(4) = 0.6454972; t_3(0.975) = 3.1824463 (t table, 3 df); half-width = 2.0542603
    iv = t_interval([1, 2, 3, 4])
    assert iv.method == "t" and iv.n == 4 and iv.point == 2.5
    assert iv.half_width == pytest.approx(3.1824463 * math.sqrt(5 / 3) / 2, rel=1e-7)
    assert iv.low == pytest.approx(0.4457397, abs=1e-6) and iv.high == pytest.approx(4.5542603, abs=1e-6)
    # 90%: t_3(0.95) = 2.3533634 -> half-width 1.5190919
    assert t_interval([1, 2, 3, 4], 0.90).half_width == pytest.approx(2.3533634 * 0.6454972, rel=1e-6)


def test_t_interval_edge_cases():
    one = t_interval([0.7])
    assert one.point == 0.7 and one.method == "none" and math.isnan(one.low) and math.isnan(one.half_width)
    assert math.isnan(t_interval([]).point)
    same = t_interval([0.3, 0.3, 0.3])
    assert (same.low, same.high) == (0.3, 0.3) and not same.excludes(0.3) and same.excludes(0.0)
    with pytest.raises(ValueError, match="NaN"):
        t_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="confidence"):
        t_interval([1.0, 2.0], confidence=95)


# ------------------------------------------------------------------------------------------------ no bootstrap on few seeds
def test_three_seed_percentile_interval_is_min_max_and_is_refused():
    # why the refusal: with 3 values every bootstrap mean lies in [min, max], so a 95% percentile interval is
    # [min, max] itself (up to resampling noise); scipy shows it
    x = np.array([0.1, 0.5, 0.3])
    res = scipy.stats.bootstrap((x,), np.mean, method="percentile", n_resamples=20_000, **_rng(0))
    assert res.confidence_interval.low == pytest.approx(0.1, abs=0.02)
    assert res.confidence_interval.high == pytest.approx(0.5, abs=0.02)
    for fn in (lambda: bootstrap_ci(x, method="percentile"), lambda: bootstrap_ci(x), lambda: bca_interval(x),
               lambda: mean_interval(x, method="BCa"), lambda: stratified_bootstrap_ci(np.ones((9, 2)))):
        with pytest.raises(ValueError, match="refused"):
            fn()
    with pytest.raises(ValueError, match="no percentile"):
        mean_interval(x, method="percentile")
    # the table path switches to t instead, and says so
    ci = mean_ci(x)
    assert ci.method == "t" and ci.low < 0.1 and ci.high > 0.5  # wider than [min, max]
    assert mean_ci(np.arange(9.0)).method == "t" and mean_ci(np.arange(10.0)).method == "BCa"
    assert mean_ci([0.4]).method == "none"
    # P(X > Y) gets no interval below 10 runs per arm
    p = prob_improvement([1, 2, 3], [0, 0, 0])
    assert p.point == 1.0 and p.method == "none" and math.isnan(p.low)


def test_bca_matches_scipy_on_a_fixed_sample():
    x = np.array([0.52, 0.61, 0.47, 0.58, 0.66, 0.49, 0.55, 0.71, 0.44, 0.60, 0.57, 0.63])
    iv = bca_interval(x, n_resamples=5000, seed=7)
    ref = scipy.stats.bootstrap((x,), np.mean, method="BCa", n_resamples=5000, **_rng(7))
    assert iv.method == "BCa" and iv.point == pytest.approx(x.mean())
    assert iv.low == ref.confidence_interval.low and iv.high == ref.confidence_interval.high
    assert iv == bca_interval(x, n_resamples=5000, seed=7)  # seeded: bit for bit
    assert bootstrap_ci(x, n_resamples=5000, seed=7)[:3] == (iv.point, iv.low, iv.high)
    flat = bca_interval(np.full(12, 0.3))  # BCa itself is undefined there: the interval is the point
    assert flat.low == flat.high == flat.point == pytest.approx(0.3)


def test_bca_differs_from_percentile_on_a_skewed_sample():
    # 11 small values and one large one: the mean's sampling distribution is right-skewed; BCa shifts the interval
    # up (bias correction and acceleration) where the percentile interval stays put
    x = np.array([0.0] * 11 + [10.0])
    bca = bootstrap_ci(x, n_resamples=5000, seed=0, method="BCa")
    pct = bootstrap_ci(x, n_resamples=5000, seed=0, method="percentile")
    assert bca.method == "BCa" and pct.method == "percentile"
    assert bca.high > pct.high + 0.3 and bca.low >= pct.low


# ------------------------------------------------------------------------------------------------ sign test
def test_sign_test_by_hand():
    # 9 of 10 positive: P(X >= 9) = (C(10,9) + C(10,10)) / 2^10 = 11/1024; two-sided 22/1024 = 0.021484375
    r = sign_test([1.0] * 9 + [-0.5])
    assert r.p == pytest.approx(22 / 1024, abs=1e-15) and (r.n_pos, r.n_neg, r.n_zero) == (9, 1, 0)
    assert sign_test([1, 2, 3]).p == pytest.approx(2 / 8)        # 3/3: the "3/3 seeds agree" of REFERENCE.md
    assert sign_test([1] * 9).p == pytest.approx(2 / 512)         # 9/9 independent pairs
    z = sign_test([0.0, 0.0, 1.0, 2.0, -1.0])                      # zeros dropped: 2 of 3 -> p = 1
    assert (z.n_zero, z.p) == (2, 1.0)
    assert sign_test([0.0, 0.0]).p == 1.0


# ------------------------------------------------------------------------------------------------ permutation test
def test_permutation_test_small_vectors_by_hand():
    # d = [1, 2, 3], observed sum 6; the 8 sign patterns give +-6, +-4, +-2, 0, 0: |sum| >= 6 twice -> 2/8
    r = permutation_test([1, 2, 3])
    assert (r.p, r.n_permutations, r.exact, r.seed) == (0.25, 8, True, None)
    # d = [1, -2, 3, 4], observed sum 6; flipping the subset S of |d| = (1, 2, 3, 4) gives 10 - 2 sum(S), so
    # |.| >= 6 iff sum(S) <= 2 ({}, {1}, {2}) or sum(S) >= 8 ({1,3,4}, {2,3,4}, {1,2,3,4}): 6 of 16
    assert permutation_test([1, -2, 3, 4]).p == pytest.approx(6 / 16)
    # all positive: only the observed pattern and its mirror reach the observed |sum| -> 2 / 2^n
    assert permutation_test([0.5, 1.0, 2.0, 0.1, 0.3]).p == pytest.approx(2 / 32)
    assert permutation_test([0.0, 0.0, 0.0]).p == 1.0
    # floating ties count: 0.1 + 0.2 vs 0.3 differ in the last bit
    assert permutation_test([0.1, 0.2, -0.3]).p == 1.0


def test_permutation_test_exact_matches_brute_force_at_n_12():
    d = np.random.default_rng(3).normal(0.4, 1.0, 12)
    signs = np.array(list(itertools.product([1.0, -1.0], repeat=12)))  # 4096 x 12
    brute = np.mean(np.abs(signs @ np.abs(d)) >= abs(d.sum()) - 1e-9 * np.abs(d).sum())
    r = permutation_test(d)
    assert r.exact and r.n_permutations == 4096 and r.p == brute


def test_permutation_test_monte_carlo_above_20():
    d = np.random.default_rng(5).normal(0.3, 1.0, 24)
    a = permutation_test(d, n_resamples=20_000, seed=1)
    assert not a.exact and a.n_permutations == 20_000 and a.seed == 1
    assert a == permutation_test(d, n_resamples=20_000, seed=1)          # seeded
    exact = permutation_test(d, exact_max_n=24)                          # 2^24 patterns, by meeting in the middle
    assert exact.exact and exact.n_permutations == 2 ** 24
    assert a.p == pytest.approx(exact.p, abs=4 * math.sqrt(exact.p * (1 - exact.p) / 20_000) + 1e-4)


# ------------------------------------------------------------------------------------------------ Holm
def test_holm_four_p_values_by_hand():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> running max 0.06)
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm([0.5, 0.9]), [1.0, 1.0])                  # capped at 1
    out = holm([0.01, np.nan, 0.02])                                          # NaN counts as p = 1: m = 3
    assert out[0] == pytest.approx(0.03) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert holm([]).size == 0
    with pytest.raises(ValueError):
        holm([1.5])


# ------------------------------------------------------------------------------------------------ power
def test_detectable_difference_by_hand_and_by_simulation():
    # the shortcut (t_9(0.975) + t_9(0.8)) / sqrt(10) = (2.262157 + 0.883404) / 3.162278 = 0.994714 is close; the
    # exact noncentral-t answer is a little larger: 0.99600
    assert (2.262157 + 0.883404) / math.sqrt(10) == pytest.approx(0.994714, abs=1e-6)
    assert detectable_difference(1.0, 10) == pytest.approx(0.99600, abs=2e-5)
    assert detectable_difference(2.0, 10) == pytest.approx(2 * 0.99600, abs=4e-5)  # linear in sd
    # a family of 6 (Bonferroni 0.05/6): t_9(1 - 0.05/12) = 3.5919, shortcut (3.5919 + 0.8834)/sqrt(10) = 1.4152
    assert detectable_difference(1.0, 10, 0.05 / 6) == pytest.approx(1.3714, abs=1e-4)
    assert detectable_difference(0.0, 10) == 0.0 and math.isnan(detectable_difference(1.0, 1))
    # simulation: 40 000 studies of 10 normal differences with mean = the MDD reject at 0.05 in 80% of them
    rng = np.random.default_rng(0)
    x = rng.normal(0.99600, 1.0, size=(40_000, 10))
    t = x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(10))
    assert (np.abs(t) > 2.262157).mean() == pytest.approx(0.80, abs=0.006)  # binomial sd 0.002


# ------------------------------------------------------------------------------------------------ verdicts
def test_declared_three_seeds_cannot_be_resolved_and_says_why():
    # a large, consistent difference on 3 seeds: the Bonferroni t interval excludes 0, but the exact permutation p
    # cannot go below 2/8 = 0.25
    c = compare_declared([("a", "b", "m (final)", [0, 1, 2], [1.0, 1.1, 0.9])], alpha=0.05, min_seeds=10)[0]
    assert c.t_adj.excludes(0) and c.perm.p == 0.25 and c.p_holm == 0.25
    assert c.verdict == "not resolved" and "smallest attainable permutation p is 0.25" in c.reason
    # t_2(0.975) = 4.3026527, s = 0.1, se = 0.1/sqrt(3): half-width 0.2484138
    assert c.t_adj.half_width == pytest.approx(4.3026527 * 0.1 / math.sqrt(3), rel=1e-6)
    # 80% power at 0.05 (family of 1) with 3 seeds: 3.2640 sd, and sd = 0.1 here
    assert c.mdd == pytest.approx(0.32640, abs=1e-5)
    assert c.underpowered == ("underpowered: 3 seeds (fewer than min_seeds = 10); differences below 0.326 are "
                              "detected with less than 80% power")


def test_declared_interval_including_zero_is_not_resolved():
    d = [0.2, -0.1, 0.3, -0.2, 0.1, 0.0, 0.15, -0.05, 0.1, -0.1, 0.05, 0.02]
    c = compare_declared([("a", "b", "m", list(range(12)), d)], min_seeds=10)[0]
    assert c.verdict == "not resolved" and "includes 0" in c.reason and c.underpowered == ""
    assert c.bca is not None and c.bca_adj is not None  # BCa from 10 seeds on


def test_declared_family_holm_and_resolution():
    rng = np.random.default_rng(0)
    strong = list(1.0 + 0.1 * rng.standard_normal(12))
    null = list(0.1 * rng.standard_normal(12))
    rows = compare_declared([("a", "b", "m", range(12), strong), ("c", "b", "m", range(12), null),
                             ("d", "b", "m", [], [])], alpha=0.05, min_seeds=10)
    assert [r.m for r in rows] == [3, 3, 3]
    # Holm: the strong one's permutation p = 2/4096 times 3
    assert rows[0].perm.p == pytest.approx(2 / 4096) and rows[0].p_holm == pytest.approx(6 / 4096)
    assert rows[0].verdict == "a > b" and rows[0].reason == ""
    assert rows[0].t_adj.confidence == pytest.approx(1 - 0.05 / 3)
    assert rows[0].t_adj.half_width > rows[0].t.half_width  # the adjusted interval is wider
    assert rows[1].verdict == "not resolved"
    assert rows[2].verdict == "not resolved" and math.isnan(rows[2].p_holm) and "0 paired seed" in rows[2].reason
    ex = compare_exploratory([("a", "b", "m", range(12), strong)])[0]
    assert ex.verdict is None and ex.p_holm is None and ex.m == 1


def test_a_failed_positive_control_makes_the_unresolved_comparisons_inconclusive():
    rng = np.random.default_rng(1)
    strong, null = list(1.0 + 0.1 * rng.standard_normal(12)), list(0.1 * rng.standard_normal(12))
    rows = compare_declared([("ctl", "b", "m", range(12), null), ("x", "b", "m", range(12), null),
                             ("y", "b", "m", range(12), strong)], alpha=0.05)
    out = apply_positive_control(rows, 0)
    assert out[0].verdict == "not resolved" and "the positive control failed" in out[0].reason
    assert out[1].verdict == INCONCLUSIVE == "inconclusive (positive control failed)"
    assert "positive control failed: ctl - b on m is not resolved" in out[1].reason
    assert out[2].verdict == "y > b"  # a resolved difference stays resolved
    # a control that resolves as predicted changes nothing
    rows = compare_declared([("ctl", "b", "m", range(12), strong), ("x", "b", "m", range(12), null)], alpha=0.05)
    assert apply_positive_control(rows, 0) == rows
    # one resolved the other way round is a failure too
    neg = [-v for v in strong]
    rows = compare_declared([("ctl", "b", "m", range(12), neg), ("x", "b", "m", range(12), null)], alpha=0.05)
    assert rows[0].verdict == "ctl < b" and apply_positive_control(rows, 0)[1].verdict == INCONCLUSIVE


# ------------------------------------------------------------------------------------------------ coverage (slow)
@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 5, 10])
def test_t_interval_coverage_by_simulation(n):
    """Normal differences, true mean 0.3: the 95% t interval covers it in ~95% of 20 000 simulated studies
    (binomial sd 0.0015), where a percentile bootstrap covers 63-76% at n = 3 (REFERENCE.md)."""
    rng = np.random.default_rng(n)
    x = rng.normal(0.3, 1.0, size=(20_000, n))
    m, s = x.mean(axis=1), x.std(axis=1, ddof=1)
    h = scipy.stats.t.ppf(0.975, n - 1) * s / np.sqrt(n)
    covered = np.abs(m - 0.3) <= h
    assert covered.mean() == pytest.approx(0.95, abs=0.006)
    # and the function itself agrees with the vectorised formula on the first studies
    for row, hh in zip(x[:20], h[:20]):
        assert t_interval(row).half_width == pytest.approx(hh)
    assert MIN_BOOTSTRAP_N == 10

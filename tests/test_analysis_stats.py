"""Hand-checkable values for analysis.stats (rliable-style tests: data small enough to verify by hand)."""

import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from objbench.analysis.stats import (
    CI,
    bootstrap_ci,
    iqm,
    mean_ci,
    mean_ci_over_seeds,
    prob_improvement,
    stratified_bootstrap_ci,
)
from objbench.envs.passk import pass_at_k


# ------------------------------------------------------------------------------------------------ IQM
def test_iqm_rliable_example():
    assert iqm([[1, 2], [2, 2], [1, 1], [2, 1]]) == 1.5


def test_iqm_eight_values_by_hand():
    # sorted: -50 1 2 3 5 7 10 100; drop 2 at each end -> mean(2, 3, 5, 7) = 17/4
    assert iqm([10, 1, 7, 3, 100, 2, 5, -50]) == pytest.approx(4.25)


def test_iqm_three_values_is_mean():
    # floor(0.25 * 3) = 0 values cut
    assert iqm([0.0, 1.0, 5.0]) == pytest.approx(2.0)


def test_iqm_rejects_nan_and_empty():
    with pytest.raises(ValueError, match="NaN"):
        iqm([1.0, float("nan")])
    with pytest.raises(ValueError, match="empty"):
        iqm([])


# ------------------------------------------------------------------------------------------------ pass@k
def test_pass_at_k_lives_in_envs_and_analysis_re_exports_it():
    from objbench.analysis import stats

    assert stats.pass_at_k is pass_at_k and "pass_at_k" in stats.__all__


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 4, 1 - math.comb(7, 4) / math.comb(10, 4)),
        (5, 0, 3, 0.0),  # no correct sample
        (5, 4, 2, 1.0),  # n - c = 1 < k
        (5, 5, 1, 1.0),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_stable_for_large_n_and_vectorised():
    # the product form must not overflow where C(n, k) is astronomically large
    v = pass_at_k(2000, 1, 1000)
    assert v == pytest.approx(0.5)
    np.testing.assert_allclose(pass_at_k(np.array([5, 5]), 2, np.array([1, 2])), [0.4, 0.7])


@pytest.mark.parametrize("n,c,k", [(5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)])
def test_pass_at_k_rejects_invalid(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


# ------------------------------------------------------------------------------------------------ P(X > Y)
def test_prob_improvement_hand_values():
    assert prob_improvement([1, 2, 3], [0, 0, 0]).point == 1.0
    assert prob_improvement([0, 0, 0], [1, 2, 3]).point == 0.0
    assert prob_improvement([1, 1], [1, 1]).point == 0.5  # all ties count 1/2
    assert prob_improvement([1, 3], [2, 2]).point == 0.5  # 2 wins, 2 losses out of 4 pairs
    # 3 vs 2: one win (3>2), one tie (2=2) -> (1 + 0.5) / 9 ... pairs of [1,2,3] x [2,3,4]:
    # wins: 3>2 -> 1; ties: 2=2, 3=3 -> 2 halves = 1; total 2 / 9
    assert prob_improvement([1, 2, 3], [2, 3, 4]).point == pytest.approx(2 / 9)


def test_prob_improvement_matches_mannwhitney_and_is_complementary():
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 5, 12).astype(float), rng.integers(0, 5, 10).astype(float)
    p = prob_improvement(x, y, n_resamples=500)
    u = scipy.stats.mannwhitneyu(x, y).statistic
    assert p.point == pytest.approx(u / (12 * 10))
    assert p.point + prob_improvement(y, x, n_resamples=500).point == pytest.approx(1.0)
    assert p.method == "BCa" and 0.0 <= p.low <= p.point <= p.high <= 1.0


def test_prob_improvement_no_interval_below_ten_runs():
    p = prob_improvement([2.0], [1.0, 3.0])
    assert p.point == 0.5 and math.isnan(p.low) and math.isnan(p.high) and p.method == "none"
    p = prob_improvement(np.arange(9.0), np.arange(12.0))  # one arm has 9 runs
    assert p.method == "none" and math.isnan(p.low)
    p = prob_improvement(np.arange(10.0) + 100, np.arange(10.0))  # every pair a win: every resample gives 1
    assert (p.point, p.low, p.high, p.method) == (1.0, 1.0, 1.0, "BCa")


# ------------------------------------------------------------------------------------------------ bootstrap
X12 = [0.2, 0.5, 0.4, 0.9, 0.3, 0.6, 0.45, 0.35, 0.8, 0.55, 0.25, 0.7]


def test_bootstrap_ci_contains_mean_and_is_reproducible():
    a = bootstrap_ci(X12, n_resamples=2000, seed=3)
    b = bootstrap_ci(X12, n_resamples=2000, seed=3)
    assert isinstance(a, CI) and a.method == "BCa"
    assert a == b
    assert a.point == pytest.approx(np.mean(X12))
    assert min(X12) <= a.low < a.point < a.high <= max(X12)
    assert bootstrap_ci(X12, n_resamples=2000, seed=4) != a  # the seed matters
    assert bootstrap_ci(X12, n_resamples=2000, method="percentile").method == "percentile"  # allowed from 10 on


def test_bootstrap_ci_wider_at_higher_confidence():
    lo = bootstrap_ci(X12, confidence=0.5, n_resamples=2000)
    hi = bootstrap_ci(X12, confidence=0.99, n_resamples=2000)
    assert hi.low <= lo.low and lo.high <= hi.high


def test_bootstrap_ci_refuses_few_values_and_edge_cases():
    for n in (1, 3, 9):
        with pytest.raises(ValueError, match="refused"):
            bootstrap_ci(np.arange(float(n)))
    assert bootstrap_ci([0.25] * 10) == CI(0.25, 0.25, 0.25, "BCa")  # BCa alone would be undefined
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, np.nan])
    with pytest.raises(ValueError):
        bootstrap_ci(X12, confidence=95)


def test_mean_ci_t_below_ten_bca_from_ten():
    ci = mean_ci([1, 2, 3, 4])  # t_3(0.975) = 3.1824463, se = sqrt(5/3)/2
    assert ci.method == "t" and ci.low == pytest.approx(2.5 - 3.1824463 * math.sqrt(5 / 3) / 2, abs=1e-6)
    assert mean_ci(X12).method == "BCa" and mean_ci(X12)[:3] == bootstrap_ci(X12)[:3]
    one = mean_ci([0.4])
    assert one.method == "none" and one.point == 0.4 and math.isnan(one.low)


def test_bootstrap_ci_iqm_statistic():
    x = [1.0, 2.0, 3.0, 100.0] * 3
    ci = bootstrap_ci(x, statistic="iqm", n_resamples=1000)
    assert ci.point == pytest.approx(2.5)  # sorted 1 1 1 2 2 2 3 3 3 100 100 100: cut 3 each end -> 2 2 2 3 3 3


def test_stratified_bootstrap_resamples_within_columns():
    # constant columns: every resample is the original matrix
    scores = np.tile([0.0, 10.0], (10, 1))
    assert stratified_bootstrap_ci(scores, statistic="mean") == CI(5.0, 5.0, 5.0, "BCa")
    # column 1 is always 10, so the pooled mean of a resample is (mean of 10 draws from column 0 + 10) / 2: the
    # interval is half as wide as the interval of column 0's mean alone (a pooled bootstrap would mix the columns)
    col0 = np.arange(10.0)
    scores = np.column_stack([col0, np.full(10, 10.0)])
    ci = stratified_bootstrap_ci(scores, statistic="mean", n_resamples=4000, seed=0)
    alone = bootstrap_ci(col0, n_resamples=4000, seed=0)
    assert ci.point == pytest.approx(7.25)
    assert (ci.high - ci.low) == pytest.approx((alone.high - alone.low) / 2, rel=0.1)
    assert ci == stratified_bootstrap_ci(scores, statistic="mean", n_resamples=4000, seed=0)
    assert stratified_bootstrap_ci(np.tile([[1, 2], [2, 2], [1, 1], [2, 1]], (3, 1)), n_resamples=500).point == 1.5


def test_stratified_bootstrap_refuses_few_runs_and_takes_callables():
    with pytest.raises(ValueError, match="refused"):
        stratified_bootstrap_ci([[0.1, 0.2, 0.3]] * 9, statistic="mean")
    # a callable gets (..., n_runs, n_tasks): here the mean over tasks of the per-task max
    m = np.column_stack([np.arange(10.0), np.arange(10.0) + 1])
    ci = stratified_bootstrap_ci(m, statistic=lambda a: a.max(axis=-2).mean(axis=-1), n_resamples=200,
                                 method="percentile")
    assert ci.point == pytest.approx(9.5) and ci.method == "percentile"
    with pytest.raises(ValueError, match="named statistic"):
        stratified_bootstrap_ci(m, statistic=lambda a: a.max(axis=-2).mean(axis=-1))


# ------------------------------------------------------------------------------------------------ curves
def _curves_frame():
    rows = []
    for arm, offset in (("a", 0.0), ("b", 10.0)):
        for s in range(3):
            for step in (1, 2, 3):
                rows.append({"arm": arm, "run": f"{arm}{s}", "seed": s, "step": step,
                             "tokens": 100 * step + 10 * s, "value": offset + step + s})
    return pd.DataFrame(rows)


def test_mean_ci_over_seeds_per_step():
    out = mean_ci_over_seeds(_curves_frame(), n_resamples=500)
    assert list(out.columns) == ["arm", "step", "mean", "low", "high", "n"]
    a = out[out.arm == "a"]
    np.testing.assert_allclose(a["mean"], [2.0, 3.0, 4.0])  # step + mean(0, 1, 2)
    assert (a["n"] == 3).all()
    # 3 runs: a t band; values step + (0, 1, 2): s = 1, t_2(0.975) = 4.3026527 -> half-width 4.3026527 / sqrt(3)
    np.testing.assert_allclose(a["high"] - a["mean"], 4.3026527 / math.sqrt(3), rtol=1e-6)
    np.testing.assert_allclose(a["mean"] - a["low"], 4.3026527 / math.sqrt(3), rtol=1e-6)
    np.testing.assert_allclose(out[out.arm == "b"]["mean"], [12.0, 13.0, 14.0])


def test_mean_ci_over_seeds_bca_from_ten_runs():
    # a skewed sample of 12 runs: the band is BCa's (up to Monte Carlo noise), not t's (symmetric)
    rows = [{"arm": "a", "run": f"r{s}", "step": step, "value": step + 0.1 * s ** 1.5}
            for s in range(12) for step in (1, 2)]
    out = mean_ci_over_seeds(pd.DataFrame(rows), n_resamples=20_000, seed=2)
    ref = bootstrap_ci([0.1 * s ** 1.5 + 1 for s in range(12)], n_resamples=20_000, seed=2)
    first = out.iloc[0]
    assert first["n"] == 12 and first["low"] == pytest.approx(ref.low, abs=0.03)
    assert first["high"] == pytest.approx(ref.high, abs=0.03)
    assert (first["high"] - first["mean"]) > 1.1 * (first["mean"] - first["low"])


def test_mean_ci_over_seeds_ragged_runs_and_single_seed():
    df = _curves_frame()
    df = df[~((df.run == "a2") & (df.step == 3))]  # one run stopped early
    df = df[~((df.run.isin(["a1"])) & (df.step == 3))]
    out = mean_ci_over_seeds(df, n_resamples=200)
    last = out[(out.arm == "a") & (out.step == 3)].iloc[0]
    assert last["n"] == 1 and last["mean"] == 3.0 and math.isnan(last["low"])


def test_mean_ci_over_seeds_tokens_interpolates_to_common_budget():
    # run s reaches value step + s at tokens 100 step + 10 s, i.e. value = tokens/100 + 0.9 s on its range
    # [100 + 10 s, 300 + 10 s]; the mean over s = 0, 1, 2 is tokens/100 + 0.9
    out = mean_ci_over_seeds(_curves_frame(), x="tokens", n_resamples=200, grid_points=5)
    a = out[out.arm == "a"]
    np.testing.assert_allclose(a["tokens"], [120, 165, 210, 255, 300])  # range covered by all three runs
    assert (a["n"] == 3).all()
    np.testing.assert_allclose(a["mean"], a["tokens"] / 100 + 0.9)
    union = mean_ci_over_seeds(_curves_frame(), x="tokens", n_resamples=200, grid_points=12, coverage="any")
    ua = union[union.arm == "a"]
    assert ua["tokens"].min() == 100 and ua["tokens"].max() == 320
    assert ua["n"].iloc[0] == 1 and ua["n"].iloc[-1] == 1 and ua["n"].max() == 3


def test_mean_ci_over_seeds_smoothing_is_per_run_trailing_mean():
    df = pd.DataFrame({"arm": "a", "run": ["r1"] * 4 + ["r2"] * 4, "step": [1, 2, 3, 4] * 2,
                       "value": [0.0, 2.0, 4.0, 6.0, 10.0, 10.0, 10.0, 30.0]})
    out = mean_ci_over_seeds(df, smooth=2, n_resamples=100)
    # r1 -> 0, 1, 3, 5; r2 -> 10, 10, 10, 20; mean over runs
    np.testing.assert_allclose(out["mean"], [5.0, 5.5, 6.5, 12.5])
    np.testing.assert_allclose(mean_ci_over_seeds(df, n_resamples=100)["mean"], [5.0, 6.0, 7.0, 18.0])


def test_mean_ci_over_seeds_checks_columns():
    with pytest.raises(ValueError, match="missing column"):
        mean_ci_over_seeds(pd.DataFrame({"arm": [], "step": []}))
    df = _curves_frame().assign(metric=["m1", "m2"] * 9)
    with pytest.raises(ValueError, match="one metric"):
        mean_ci_over_seeds(df)

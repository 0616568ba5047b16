"""Hand-checkable values for analysis.stats (rliable-style tests: data small enough to verify by hand)."""

import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from analysis.stats import (
    CI,
    bootstrap_ci,
    iqm,
    mean_ci_over_seeds,
    pass_at_k,
    prob_improvement,
    stratified_bootstrap_ci,
)


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
    x, y = rng.integers(0, 5, 7).astype(float), rng.integers(0, 5, 4).astype(float)
    p = prob_improvement(x, y, n_resamples=500)
    u = scipy.stats.mannwhitneyu(x, y).statistic
    assert p.point == pytest.approx(u / (7 * 4))
    assert p.point + prob_improvement(y, x, n_resamples=500).point == pytest.approx(1.0)
    assert 0.0 <= p.low <= p.point <= p.high <= 1.0


def test_prob_improvement_single_run_gives_nan_interval():
    p = prob_improvement([2.0], [1.0, 3.0])
    assert p.point == 0.5 and math.isnan(p.low) and math.isnan(p.high)


# ------------------------------------------------------------------------------------------------ bootstrap
def test_bootstrap_ci_contains_mean_and_is_reproducible():
    x = [0.2, 0.5, 0.4, 0.9, 0.3]
    a = bootstrap_ci(x, n_resamples=2000, seed=3)
    b = bootstrap_ci(x, n_resamples=2000, seed=3)
    assert isinstance(a, CI)
    assert a == b
    assert a.point == pytest.approx(np.mean(x))
    assert min(x) <= a.low < a.point < a.high <= max(x)
    assert bootstrap_ci(x, n_resamples=2000, seed=4) != a  # the seed matters


def test_bootstrap_ci_wider_at_higher_confidence():
    x = [0.2, 0.5, 0.4, 0.9, 0.3]
    lo = bootstrap_ci(x, confidence=0.5, n_resamples=2000)
    hi = bootstrap_ci(x, confidence=0.99, n_resamples=2000)
    assert hi.low <= lo.low and lo.high <= hi.high


def test_bootstrap_ci_edge_cases():
    one = bootstrap_ci([0.7])
    assert one.point == 0.7 and math.isnan(one.low) and math.isnan(one.high)
    assert bootstrap_ci([0.3, 0.3, 0.3]) == CI(0.3, 0.3, 0.3)
    assert bootstrap_ci([0.3, 0.3, 0.3], method="BCa") == CI(0.3, 0.3, 0.3)  # BCa alone would be undefined
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, np.nan])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 2.0], confidence=95)


def test_bootstrap_ci_iqm_statistic():
    x = [1.0, 2.0, 3.0, 100.0]
    ci = bootstrap_ci(x, statistic="iqm", n_resamples=1000)
    assert ci.point == pytest.approx(2.5)


def test_stratified_bootstrap_resamples_within_columns():
    # constant columns: every resample is the original matrix
    scores = np.array([[0.0, 10.0], [0.0, 10.0], [0.0, 10.0]])
    assert stratified_bootstrap_ci(scores, statistic="mean") == CI(5.0, 5.0, 5.0)
    # column 1 is always 10 and each resample keeps 4 draws per column, so the pooled mean is
    # (mean of 4 draws from column 0 + 10) / 2, within [5, 6.5]. A bootstrap that pooled the 8 values
    # (0 1 2 3 10 10 10 10) would reach about 8.5 at its upper end.
    scores = np.array([[0.0, 10.0], [1.0, 10.0], [2.0, 10.0], [3.0, 10.0]])
    ci = stratified_bootstrap_ci(scores, statistic="mean", n_resamples=2000, seed=0)
    assert ci.point == pytest.approx(5.75)
    assert 5.0 <= ci.low < ci.point < ci.high <= 6.5
    assert ci == stratified_bootstrap_ci(scores, statistic="mean", n_resamples=2000, seed=0)
    assert stratified_bootstrap_ci([[1, 2], [2, 2], [1, 1], [2, 1]]).point == 1.5  # default: IQM


def test_stratified_bootstrap_single_run_and_callable():
    ci = stratified_bootstrap_ci([[0.1, 0.2, 0.3]], statistic="mean")
    assert ci.point == pytest.approx(0.2) and math.isnan(ci.low)
    # a callable gets (..., n_runs, n_tasks): here the mean over tasks of the per-task max
    ci = stratified_bootstrap_ci([[0.0, 1.0], [2.0, 3.0]], statistic=lambda a: a.max(axis=-2).mean(axis=-1),
                                 n_resamples=200)
    assert ci.point == pytest.approx(2.5)


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
    assert ((a["low"] <= a["mean"]) & (a["mean"] <= a["high"])).all()
    np.testing.assert_allclose(out[out.arm == "b"]["mean"], [12.0, 13.0, 14.0])


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

"""Statistics over seeds: intervals of a mean, IQM, P(X > Y), learning-curve bands (and pass@k, re-exported from
objbench.envs.passk, where the training loop imports it).

Every function is pure: arrays or DataFrames in, numbers or DataFrames out, no I/O, no plotting, no global
random state. Functions that resample take ``seed`` (an int or a ``numpy.random.Generator``); the same
inputs and the same seed give the same interval, bit for bit.

Choices (following Agarwal et al., 2021, "Deep RL at the Edge of the Statistical Precipice", and REFERENCE.md):

- Small samples. With n seeds a percentile bootstrap is too narrow: at n = 3 a 95% percentile interval is exactly
  [min, max] of the seeds (coverage 63-76% in simulation, 72-84% at n = 5). So no bootstrap interval is ever
  computed on fewer than ``MIN_BOOTSTRAP_N`` = 10 values: ``bootstrap_ci``, ``stratified_bootstrap_ci`` and
  ``prob_improvement`` refuse (ValueError), and ``mean_ci`` / ``mean_ci_over_seeds`` switch to a Student t
  interval. Every returned :class:`CI` names its ``method`` so that tables can say which interval they show.
- Library: ``scipy.stats.bootstrap`` does all resampling and ``scipy.stats.trim_mean`` computes the IQM (the
  ``rliable`` package implements the same estimators but pulls in ``arch``; scipy is already a dependency).
- Bootstrap method: BCa by default (``method="BCa"``; "percentile" and "basic" remain available from 10 values on).
  BCa is undefined when every resample gives the same value; the interval is then ``(v, v)``.
- Resamples: 10_000 for single numbers (tables), 2_000 per point for learning curves (rliable uses 2_000
  for curves too).
- Unit of resampling: one run (= one seed of one arm). Stratified bootstrap (``stratified_bootstrap_ci``)
  resamples runs independently within each task column, which is what rliable calls StratifiedBootstrap;
  it is done with scipy by passing each task column as a separate sample (scipy resamples separate samples
  independently).
- IQM uses ``trim_mean(..., 0.25)``, which cuts ``floor(0.25 n)`` values at each end: with n = 3 seeds the
  IQM equals the mean, with n = 5 it drops the lowest and highest run.
"""

from __future__ import annotations

import inspect
from typing import Callable, NamedTuple, Sequence

import warnings

import numpy as np
import pandas as pd
import scipy.stats

from objbench.analysis.inference import MIN_BOOTSTRAP_N, mean_interval
from objbench.envs.passk import pass_at_k  # re-exported: the training loop logs pass@k with it

__all__ = [
    "CI",
    "MIN_BOOTSTRAP_N",
    "mean_ci",
    "DEFAULT_RESAMPLES",
    "CURVE_RESAMPLES",
    "iqm",
    "bootstrap_ci",
    "stratified_bootstrap_ci",
    "prob_improvement",
    "pass_at_k",
    "mean_ci_over_seeds",
]

DEFAULT_RESAMPLES = 10_000
"""Bootstrap resamples for one number (a table cell)."""
CURVE_RESAMPLES = 2_000
"""Bootstrap resamples per point of a learning curve."""

_MAX_BATCH_ELEMS = 4_000_000  # cap on resampled floats scipy holds at once (about 32 MB)


class CI(NamedTuple):
    """A point estimate with a confidence interval; ``low``/``high`` are NaN when they cannot be estimated.

    ``method``: how the interval was made: "t", "BCa", "percentile", "basic", or "none" (no interval)."""

    point: float
    low: float
    high: float
    method: str = "none"


def _require_bootstrap_n(n: int, what: str) -> None:
    if n < MIN_BOOTSTRAP_N:
        raise ValueError(f"bootstrap interval over {n} {what} refused: below {MIN_BOOTSTRAP_N} a bootstrap interval "
                         "is too narrow (at n = 3 a 95% percentile interval is [min, max]); use mean_ci (a t "
                         "interval there) or report the point estimate without an interval")


def _bootstrap(data, stat, *, point: float, method: str, **kw) -> CI:
    """scipy.stats.bootstrap -> CI; a BCa interval that scipy cannot form (constant resamples) becomes (v, v)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=getattr(scipy.stats, "DegenerateDataWarning", RuntimeWarning))
        warnings.simplefilter("ignore", category=RuntimeWarning)  # 0/0 in BCa's acceleration: handled below
        res = scipy.stats.bootstrap(data, stat, method=method, **kw)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        dist = np.asarray(res.bootstrap_distribution)
        if dist.size and np.all(dist == dist.flat[0]):
            return CI(point, point, point, method)
    return CI(point, lo, hi, method)


def mean_ci(x, confidence: float = 0.95, n_resamples: int = 10_000, seed=0) -> CI:
    """Mean of ``x`` (one value per seed) with a confidence interval: Student t below ``MIN_BOOTSTRAP_N`` values,
    BCa bootstrap from there on (``analysis.inference.mean_interval``); ``method`` says which ("none" for n < 2,
    interval NaN). Example: ``mean_ci([1, 2, 3, 4])`` -> ``CI(2.5, 0.4457, 4.5543, "t")``."""
    iv = mean_interval(_as_finite_array(x, "x", ndim=1), confidence, n_resamples, seed)
    return CI(iv.point, iv.low, iv.high, iv.method)


# ---------------------------------------------------------------------------------------------- aggregates


def _iqm_last_axes(a: np.ndarray, ndim: int) -> np.ndarray:
    """IQM over the last ``ndim`` axes of ``a`` (flattened together), vectorised over leading axes."""
    flat = a.reshape(a.shape[: a.ndim - ndim] + (-1,))
    return scipy.stats.trim_mean(flat, proportiontocut=0.25, axis=-1)


def iqm(scores) -> float:
    """Interquartile mean: the mean of the middle 50% of all scores.

    Args:
        scores: array-like of any shape, typically ``(n_runs,)`` or ``(n_runs, n_tasks)``; all entries are
            pooled (rliable's ``aggregate_iqm``). Must be non-empty and contain no NaN.

    Returns:
        ``scipy.stats.trim_mean(scores, 0.25, axis=None)`` as a float. ``floor(0.25 n)`` values are cut at each
        end, so for n < 4 this is the plain mean.

    Example: ``iqm([[1, 2], [2, 2], [1, 1], [2, 1]]) == 1.5``.
    """
    a = _as_finite_array(scores, "scores")
    return float(scipy.stats.trim_mean(a, proportiontocut=0.25, axis=None))


_NAMED_STATISTICS: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    # each maps (array, number of trailing data axes) -> array over the leading (batch) axes
    "mean": lambda a, nd: a.reshape(a.shape[: a.ndim - nd] + (-1,)).mean(axis=-1),
    "median": lambda a, nd: np.median(a.reshape(a.shape[: a.ndim - nd] + (-1,)), axis=-1),
    "iqm": _iqm_last_axes,
}


def _resolve_statistic(statistic) -> tuple[Callable[[np.ndarray, int], np.ndarray], str]:
    if callable(statistic):
        name = getattr(statistic, "__name__", "custom")
        return (lambda a, nd: np.asarray(statistic(a))), name
    if statistic not in _NAMED_STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; valid: {sorted(_NAMED_STATISTICS)} or a callable")
    return _NAMED_STATISTICS[statistic], statistic


# ---------------------------------------------------------------------------------------------- bootstrap


def _as_finite_array(x, name: str, ndim: int | None = None) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or inf; drop or impute them before computing statistics")
    return a


def _rng(seed) -> dict:
    """Keyword argument that seeds ``scipy.stats.bootstrap`` (``rng`` since scipy 1.15, ``random_state`` before)."""
    gen = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return {_RNG_KW: gen}


_RNG_KW = "rng" if "rng" in inspect.signature(scipy.stats.bootstrap).parameters else "random_state"


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _batch(n_resamples: int, elems_per_resample: int) -> int:
    return int(max(1, min(n_resamples, _MAX_BATCH_ELEMS // max(1, elems_per_resample))))


def bootstrap_ci(
    x,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed=0,
    statistic="mean",
    method: str = "BCa",
) -> CI:
    """Bootstrap confidence interval of a statistic of one sample of runs (e.g. one value per seed).

    Args:
        x: 1-D array-like, one value per run; finite, at least ``MIN_BOOTSTRAP_N`` (10) values, else ValueError
            (use :func:`mean_ci`, which gives a t interval there).
        confidence: two-sided confidence level.
        n_resamples: bootstrap resamples.
        seed: int or ``numpy.random.Generator``; same seed -> same interval.
        statistic: ``"mean"`` (default), ``"median"``, ``"iqm"``, or a callable mapping an array of shape
            ``(..., n)`` to ``(...)`` (vectorised over leading axes).
        method: ``"BCa"`` (default), ``"percentile"`` or ``"basic"``, passed to ``scipy.stats.bootstrap``.

    Returns:
        ``CI(point, low, high, method)``. For an all-equal sample the interval is ``(v, v)``.
    """
    a = _as_finite_array(x, "x", ndim=1)
    _check_confidence(confidence)
    _require_bootstrap_n(a.size, "values")
    fn, _ = _resolve_statistic(statistic)
    point = float(fn(a, 1))
    if np.all(a == a[0]):
        return CI(point, point, point, method)
    return _bootstrap(
        (a,),
        lambda s, axis=-1: fn(np.moveaxis(s, axis, -1), 1),
        point=point,
        method=method,
        n_resamples=n_resamples,
        batch=_batch(n_resamples, a.size),
        vectorized=True,
        confidence_level=confidence,
        **_rng(seed),
    )


def stratified_bootstrap_ci(
    scores,
    statistic="iqm",
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed=0,
    method: str = "BCa",
) -> CI:
    """Stratified bootstrap CI of an aggregate over a (runs x tasks) score matrix, as rliable.

    Runs are resampled with replacement independently within each task column (a "task" can be an
    environment, a difficulty bucket, or anything the runs are scored on separately), and the statistic is
    applied to the resampled matrix.

    Args:
        scores: array-like of shape ``(n_runs, n_tasks)`` (1-D is treated as one task); finite, rectangular, with
            n_runs >= ``MIN_BOOTSTRAP_N`` (10), else ValueError.
        statistic: ``"iqm"`` (default), ``"mean"``, ``"median"`` (all pool the matrix), or a callable mapping an
            array of shape ``(..., n_runs, n_tasks)`` to ``(...)``; a callable needs ``method="percentile"`` or
            ``"basic"`` (BCa's jackknife leaves one run out of one column, which no longer makes a matrix).
        confidence, n_resamples, seed, method: as in :func:`bootstrap_ci`.

    Returns:
        ``CI(point, low, high, method)``.
    """
    a = _as_finite_array(scores, "scores")
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError(f"scores must have shape (n_runs, n_tasks), got {a.shape}")
    _check_confidence(confidence)
    _require_bootstrap_n(a.shape[0], "runs per task")
    if callable(statistic) and method == "BCa":
        raise ValueError("stratified BCa needs a named statistic (mean, median, iqm); pass method='percentile' "
                         "for a callable")
    fn, _ = _resolve_statistic(statistic)
    point = float(fn(a, 2))
    if np.all(a == a[0:1, :]):  # every column constant: every resample is the original matrix
        return CI(point, point, point, method)

    pooled = not callable(statistic)  # mean, median, iqm pool the matrix: only the values matter, not its shape

    def stat(*cols, axis=-1):  # each col: (..., n_runs) -> matrix (..., n_runs, n_tasks)
        cols = [np.moveaxis(c, axis, -1) for c in cols]
        if pooled:  # also serves BCa's jackknife, which leaves one run out of one column (ragged columns)
            return fn(np.concatenate(cols, axis=-1), 1)
        return fn(np.stack(cols, axis=-1), 2)

    return _bootstrap(
        tuple(a[:, j] for j in range(a.shape[1])),
        stat,
        point=point,
        method=method,
        n_resamples=n_resamples,
        batch=_batch(n_resamples, a.size),
        vectorized=True,
        paired=False,  # columns are resampled independently: the strata
        confidence_level=confidence,
        **_rng(seed),
    )


# ---------------------------------------------------------------------------------------------- P(X > Y)


def _pairwise_prob(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mean over all (i, j) of 1[x_i > y_j] + 1/2 1[x_i == y_j]; x (..., n), y (..., m) -> (...).

    Equals the Mann-Whitney U statistic of x divided by n * m.
    """
    d = x[..., :, None] - y[..., None, :]
    return ((d > 0) + 0.5 * (d == 0)).mean(axis=(-2, -1))


def prob_improvement(
    x,
    y,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed=0,
    method: str = "BCa",
) -> CI:
    """Probability of improvement P(X > Y): the chance that a random run of X scores above a random run of Y.

    Point estimate: Mann-Whitney ``U / (n m)`` from ``scipy.stats.mannwhitneyu(x, y)``, i.e. the fraction of
    (x_i, y_j) pairs with x_i > y_j, ties counting 1/2 (Agarwal et al., 2021). P(X > Y) + P(Y > X) = 1.
    Interval: two-sample bootstrap, x and y resampled independently, only when both samples have at least
    ``MIN_BOOTSTRAP_N`` (10) runs; below that the interval is ``(nan, nan)`` with method "none" (no bootstrap on
    few seeds; there is no t interval for this statistic).

    Args:
        x, y: 1-D array-likes of final scores, one per run (seed); finite, non-empty; sizes may differ.
        confidence, n_resamples, seed, method: as in :func:`bootstrap_ci`.

    Returns:
        ``CI(point, low, high, method)``.
    """
    a = _as_finite_array(x, "x", ndim=1)
    b = _as_finite_array(y, "y", ndim=1)
    _check_confidence(confidence)
    u = scipy.stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic").statistic
    point = float(u / (a.size * b.size))
    if min(a.size, b.size) < MIN_BOOTSTRAP_N:
        return CI(point, float("nan"), float("nan"), "none")
    if np.all(a == a[0]) and np.all(b == b[0]):
        return CI(point, point, point, method)

    def stat(xs, ys, axis=-1):
        return _pairwise_prob(np.moveaxis(xs, axis, -1), np.moveaxis(ys, axis, -1))

    return _bootstrap(
        (a, b),
        stat,
        point=point,
        method=method,
        n_resamples=n_resamples,
        batch=_batch(n_resamples, a.size * b.size),
        vectorized=True,
        paired=False,
        confidence_level=confidence,
        **_rng(seed),
    )


# ---------------------------------------------------------------------------------------------- curves


def _check_columns(df: pd.DataFrame, required: Sequence[str], what: str) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: missing column(s) {missing}; got {list(df.columns)}")


def mean_ci_over_seeds(
    df: pd.DataFrame,
    x: str = "step",
    value: str = "value",
    by: str = "arm",
    unit: str = "run",
    confidence: float = 0.95,
    n_resamples: int = CURVE_RESAMPLES,
    seed=0,
    smooth: int | None = None,
    interpolate: bool | None = None,
    grid_points: int | None = None,
    coverage: str = "all",
) -> pd.DataFrame:
    """Learning curve per group: the mean over runs at each x, with a CI over runs (t below 10 runs, else BCa).

    Data contract:
        ``df`` is long-format for ONE metric, with columns ``by`` (e.g. arm), ``unit`` (one learning curve,
        e.g. run), ``x`` (e.g. step or tokens) and ``value``. A ``metric`` column, if present, must hold a
        single name. NaN values are dropped first.

    Args:
        x: the x column. Runs are aligned on exact x values unless ``interpolate``.
        smooth: optional trailing rolling-mean window (in points) applied to each run before aggregation;
            ``None`` (default) = no smoothing.
        interpolate: linearly interpolate each run onto a common grid of x before averaging. Default
            (``None``): True when ``x != "step"``, because generated-token counts differ between runs at the
            same step, so runs must be compared at equal budgets. Runs are never extrapolated.
        grid_points: grid size when interpolating; default: the largest number of points of any run.
        coverage: extent of the interpolation grid of a group. ``"all"`` (default): the x range that every run
            of the group covers, so each point averages all runs at the same budget (a run that stopped early
            shortens its group's curve). ``"any"``: the union of the ranges; ``n`` then drops at the ends.
        confidence, n_resamples, seed: interval settings: at each x, a Student t interval over the runs covering it
            when they are fewer than ``MIN_BOOTSTRAP_N`` (10), a BCa bootstrap over runs otherwise.

    Returns:
        DataFrame with columns ``[by, x, "mean", "low", "high", "n"]``, one row per (group, x) with n >= 1,
        groups in order of first appearance in ``df``, x ascending. ``low``/``high`` are NaN where n = 1.
    """
    _check_columns(df, [by, unit, x, value], "mean_ci_over_seeds")
    if "metric" in df.columns and df["metric"].nunique() > 1:
        raise ValueError(f"mean_ci_over_seeds expects one metric, got {sorted(df['metric'].unique())}")
    _check_confidence(confidence)
    if coverage not in ("all", "any"):
        raise ValueError(f"coverage must be 'all' or 'any', got {coverage!r}")
    if interpolate is None:
        interpolate = x != "step"
    data = df[[by, unit, x, value]].dropna()
    out_cols = [by, x, "mean", "low", "high", "n"]
    if data.empty:
        return pd.DataFrame(columns=out_cols)

    parts = []
    for group, gdf in data.groupby(by, sort=False):
        # wide: rows = x, columns = units
        wide = gdf.pivot_table(index=x, columns=unit, values=value, aggfunc="mean", sort=True)
        if smooth and smooth > 1:
            wide = wide.apply(lambda col: col.dropna().rolling(smooth, min_periods=1).mean())
        if interpolate:
            wide = _interpolate_to_grid(wide, grid_points, coverage)
        mat = wide.to_numpy(dtype=float).T  # (n_units, n_x)
        mean, low, high, n = _column_ci(mat, confidence, n_resamples, seed)
        part = pd.DataFrame({by: group, x: wide.index.to_numpy(), "mean": mean, "low": low, "high": high, "n": n})
        parts.append(part[part["n"] > 0])
    return pd.concat(parts, ignore_index=True)[out_cols]


def _interpolate_to_grid(wide: pd.DataFrame, grid_points: int | None, coverage: str) -> pd.DataFrame:
    """Columns (units) of ``wide`` interpolated onto a common grid of the index; NaN outside each unit's range."""
    cols = [wide[u].dropna() for u in wide.columns]
    cols = [c for c in cols if len(c)]
    starts = [float(c.index.min()) for c in cols]
    ends = [float(c.index.max()) for c in cols]
    npts = max(len(c) for c in cols)
    lo, hi = (max(starts), min(ends)) if coverage == "all" else (min(starts), max(ends))
    if hi < lo:  # the runs' ranges do not overlap: nothing is covered by all of them
        return pd.DataFrame(columns=wide.columns, index=pd.Index([], name=wide.index.name), dtype=float)
    grid = np.linspace(lo, hi, grid_points or max(npts, 2)) if hi > lo else np.array([lo])
    out = {}
    for u in wide.columns:
        col = wide[u].dropna()
        if col.empty:
            out[u] = np.full(grid.shape, np.nan)
            continue
        cx, cy = col.index.to_numpy(dtype=float), col.to_numpy(dtype=float)
        y = np.interp(grid, cx, cy)
        y[(grid < cx.min()) | (grid > cx.max())] = np.nan  # no extrapolation
        out[u] = y
    return pd.DataFrame(out, index=pd.Index(grid, name=wide.index.name))


def _column_ci(mat: np.ndarray, confidence: float, n_resamples: int, seed):
    """Mean and CI of each column of ``mat`` (n_units, n_x) over its non-NaN rows: a t interval where fewer than
    ``MIN_BOOTSTRAP_N`` units cover the point, a BCa bootstrap where at least that many do.

    Columns with the same pattern of present units are handled together (one vectorised scipy call).
    """
    n_x = mat.shape[1]
    mean = np.full(n_x, np.nan)
    low = np.full(n_x, np.nan)
    high = np.full(n_x, np.nan)
    present = ~np.isnan(mat)
    n = present.sum(axis=0)
    patterns: dict[bytes, list[int]] = {}
    for j in range(n_x):
        if n[j] > 0:
            patterns.setdefault(present[:, j].tobytes(), []).append(j)
    for cols in patterns.values():
        rows = present[:, cols[0]]
        sub = mat[np.ix_(rows, cols)]  # (n_present, n_cols), no NaN
        k = sub.shape[0]
        mean[cols] = sub.mean(axis=0)
        if k < 2:
            continue
        if k < MIN_BOOTSTRAP_N:
            h = scipy.stats.t.ppf(0.5 + confidence / 2, k - 1) * sub.std(axis=0, ddof=1) / np.sqrt(k)
            low[cols], high[cols] = sub.mean(axis=0) - h, sub.mean(axis=0) + h
            continue
        const = np.all(sub == sub[0:1], axis=0)
        low[np.asarray(cols)[const]] = high[np.asarray(cols)[const]] = sub[0, const]
        vary = np.asarray(cols)[~const]
        if vary.size == 0:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=getattr(scipy.stats, "DegenerateDataWarning", RuntimeWarning))
            res = scipy.stats.bootstrap(
                (sub[:, ~const],),
                np.mean,
                axis=0,
                n_resamples=n_resamples,
                batch=_batch(n_resamples, sub[:, ~const].size),
                vectorized=True,
                confidence_level=confidence,
                method="BCa",
                **_rng(seed),
            )
        low[vary] = res.confidence_interval.low
        high[vary] = res.confidence_interval.high
    return mean, low, high, n

"""Paired comparisons of two arms over seeds: t and BCa intervals, exact sign and permutation tests, Holm.

The unit of replication is the seed: every arm of a seed shares its warm start and prompt stream, so two arms are
compared through the per-seed paired differences ``d_i = a_i - b_i`` (REFERENCE.md, Statistics). Every function
here is pure (arrays in, numbers out, no I/O, no global random state); functions that draw random numbers take
``seed``.

Choices, each stated once:

- Intervals. ``t_interval`` (Student t on the mean, n - 1 degrees of freedom) is valid from n = 2 on, under
  approximate normality of the differences. ``bca_interval`` (``scipy.stats.bootstrap(method="BCa")``) refuses
  fewer than :data:`MIN_BOOTSTRAP_N` = 10 values: with n seeds a percentile bootstrap is too narrow (with 3 seeds a
  95% percentile interval is exactly [min, max], coverage 63-76% in simulation) and BCa's acceleration estimate is
  unstable. ``mean_interval(method="auto")`` is the one every table uses: t below 10 values, BCa from 10 on, and
  the returned :class:`Interval` names the method so the table can say which it shows.
- Tests. ``sign_test``: exact two-sided binomial test of #(d > 0) against Bin(n, 1/2), zeros dropped (9 of 10
  positive: p = 2 (C(10,9) + C(10,10)) / 2^10 = 22/1024). ``permutation_test``: the paired (sign-flip)
  permutation test of the mean: under "no difference" each d_i is as likely to be -d_i, so the p-value is the
  share of the 2^n sign patterns whose |sum| is at least the observed |sum|. Exact (all 2^n patterns, counted by
  meeting in the middle) for n <= :data:`EXACT_PERMUTATION_MAX_N` = 20, else a seeded Monte Carlo whose count of
  draws is returned with the p-value; the observed pattern counts, so p >= 2 / 2^n (0.25 at n = 3, 0.0625 at
  n = 5): with 5 or fewer seeds no difference can reach p < 0.05.
- Multiplicity. ``holm`` adjusts the p-values of the comparisons a study declares (Holm, 1979); a p-value that is
  NaN (a comparison without data) still counts in the family, as p = 1, so an empty comparison never makes the
  others look stronger.
- Power. ``detectable_difference`` is the minimum detectable difference (MDD): the smallest true mean difference
  that a two-sided paired t test at level alpha/m (the family's Bonferroni level, which is also Holm's first step)
  detects with probability 80%, given n seeds and the observed sd of the differences; exact, from the noncentral t
  distribution. It describes the t test; the exact permutation test the verdicts use has about the same power for
  near-normal differences, and less with very few seeds (its smallest p is 2 / 2^n).
- Verdict (``compare_declared``). A declared comparison is "resolved" only when the Bonferroni-adjusted interval
  (confidence 1 - alpha/m over the m declared comparisons: t, and also BCa from 10 seeds on) excludes 0 *and* the
  Holm-adjusted permutation p is <= alpha; otherwise it is "not resolved", with the reason. A study may declare
  one comparison its positive control (the place where the design was built to show the effect): when that one is
  not resolved in the predicted direction, every other unresolved comparison is "inconclusive (positive control
  failed)" (``apply_positive_control``): the design could not show the effect where it should have, so its
  silence elsewhere says nothing.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np
import scipy.optimize
import scipy.stats

__all__ = [
    "MIN_BOOTSTRAP_N",
    "EXACT_PERMUTATION_MAX_N",
    "MC_PERMUTATIONS",
    "Interval",
    "SignTest",
    "PermutationTest",
    "Comparison",
    "t_interval",
    "bca_interval",
    "mean_interval",
    "interval_label",
    "sign_test",
    "permutation_test",
    "holm",
    "detectable_difference",
    "compare_declared",
    "compare_exploratory",
    "INCONCLUSIVE",
    "apply_positive_control",
]

MIN_BOOTSTRAP_N = 10
"""Fewest values a bootstrap interval is computed on; below it, intervals are t intervals."""
EXACT_PERMUTATION_MAX_N = 20
"""Largest n for which the permutation test enumerates all 2^n sign patterns."""
MC_PERMUTATIONS = 100_000
"""Monte Carlo sign patterns drawn above EXACT_PERMUTATION_MAX_N."""
DEFAULT_RESAMPLES = 10_000
"""Bootstrap resamples of a BCa interval."""


class Interval(NamedTuple):
    """A mean with its confidence interval and how the interval was made.

    ``method``: ``"t"`` (Student t), ``"BCa"`` (bias-corrected accelerated bootstrap), or ``"none"`` (fewer than
    2 values: ``low``/``high`` are NaN). ``confidence``: the two-sided level, e.g. 0.95.
    """

    point: float
    low: float
    high: float
    method: str
    n: int
    confidence: float

    @property
    def half_width(self) -> float:
        """(high - low) / 2; NaN without an interval."""
        return (self.high - self.low) / 2

    def excludes(self, value: float = 0.0) -> bool:
        """True when the interval lies entirely above or below ``value`` (False without an interval)."""
        return bool(np.isfinite(self.low) and np.isfinite(self.high) and (self.low > value or self.high < value))


class SignTest(NamedTuple):
    """Exact sign test: ``p`` two-sided; counts of positive, negative and zero differences (zeros are dropped)."""

    p: float
    n_pos: int
    n_neg: int
    n_zero: int


class PermutationTest(NamedTuple):
    """Paired permutation test: two-sided ``p``, the number of sign patterns it counted over, whether that was all
    of them (``exact``), and the Monte Carlo seed (None when exact)."""

    p: float
    n_permutations: int
    exact: bool
    seed: int | None


def _finite_1d(x, name: str = "x") -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or inf; drop them before computing statistics")
    return a


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


# ---------------------------------------------------------------------------------------------- intervals


def t_interval(x, confidence: float = 0.95) -> Interval:
    """Student t interval of the mean: ``mean +- t_{n-1}(1 - (1 - confidence)/2) * s / sqrt(n)``, s with ddof 1.

    Args:
        x: 1-D array-like of finite values (e.g. per-seed paired differences); may be empty.
        confidence: two-sided level.

    Returns:
        :class:`Interval` with method ``"t"``; for n < 2 method ``"none"`` and NaN bounds (mean NaN when empty).
        All-equal values give a zero-width interval at the value.

    Example: ``t_interval([1, 2, 3, 4])``: mean 2.5, s = sqrt(5/3), t_3(0.975) = 3.18245, half-width 2.05427.
    """
    a = _finite_1d(x)
    _check_confidence(confidence)
    n = a.size
    point = float(a.mean()) if n else float("nan")
    if n < 2:
        return Interval(point, float("nan"), float("nan"), "none", n, confidence)
    se = float(a.std(ddof=1)) / math.sqrt(n)
    h = float(scipy.stats.t.ppf(0.5 + confidence / 2, n - 1)) * se
    return Interval(point, point - h, point + h, "t", n, confidence)


def _rng_kw(seed) -> dict:
    """Keyword argument that seeds ``scipy.stats.bootstrap`` (``rng`` since scipy 1.15, ``random_state`` before)."""
    gen = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return {_RNG_KW: gen}


_RNG_KW = "rng" if "rng" in inspect.signature(scipy.stats.bootstrap).parameters else "random_state"


def bca_interval(x, confidence: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES, seed=0) -> Interval:
    """BCa bootstrap interval of the mean (``scipy.stats.bootstrap(..., method="BCa")``), seeded.

    Refuses fewer than :data:`MIN_BOOTSTRAP_N` values (raises ValueError): use :func:`t_interval` or
    :func:`mean_interval` there. All-equal values give ``(v, v)`` (BCa itself is undefined for them).
    """
    a = _finite_1d(x)
    _check_confidence(confidence)
    if a.size < MIN_BOOTSTRAP_N:
        raise ValueError(f"bootstrap interval on {a.size} values refused: below {MIN_BOOTSTRAP_N} values a bootstrap "
                         "interval is too narrow; use t_interval (or mean_interval, which picks t there)")
    point = float(a.mean())
    if np.all(a == a[0]):
        return Interval(point, point, point, "BCa", a.size, confidence)
    res = scipy.stats.bootstrap((a,), np.mean, n_resamples=n_resamples, vectorized=True, confidence_level=confidence,
                                method="BCa", **_rng_kw(seed))
    return Interval(point, float(res.confidence_interval.low), float(res.confidence_interval.high), "BCa", a.size,
                    confidence)


def mean_interval(x, confidence: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES, seed=0,
                  method: str = "auto") -> Interval:
    """Interval of the mean of ``x`` by ``method``: ``"auto"`` (t below :data:`MIN_BOOTSTRAP_N` values, BCa from
    there on), ``"t"`` or ``"BCa"`` (which refuses small samples). The result's ``method`` says which was used."""
    a = _finite_1d(x)
    if method not in ("auto", "t", "BCa"):
        raise ValueError(f"method must be 'auto', 't' or 'BCa', got {method!r} (no percentile intervals: see "
                         "analysis.inference)")
    if method == "t" or (method == "auto" and a.size < MIN_BOOTSTRAP_N):
        return t_interval(a, confidence)
    return bca_interval(a, confidence, n_resamples, seed)


def interval_label(method: str, confidence: float = 0.95) -> str:
    """Words for a table: ``"95% t"``, ``"95% BCa"``, ``"none (n < 2)"``."""
    if method == "none":
        return "none (n < 2)"
    pct = f"{100 * confidence:.4g}%"
    return f"{pct} {method}"


# ---------------------------------------------------------------------------------------------- tests


def sign_test(d) -> SignTest:
    """Exact two-sided sign test of paired differences ``d`` against "as likely positive as negative".

    Zeros carry no sign and are dropped. ``p = scipy.stats.binomtest(#pos, #pos + #neg, 0.5).pvalue``, which for
    p = 1/2 is twice the smaller tail (capped at 1). No non-zero difference: p = 1.
    """
    a = _finite_1d(d, "d")
    pos, neg = int((a > 0).sum()), int((a < 0).sum())
    zero = a.size - pos - neg
    if pos + neg == 0:
        return SignTest(1.0, pos, neg, zero)
    return SignTest(float(scipy.stats.binomtest(pos, pos + neg, 0.5).pvalue), pos, neg, zero)


def _sign_sums(v: np.ndarray) -> np.ndarray:
    """All 2^len(v) values of sum_i s_i v_i, s_i = +-1."""
    out = np.zeros(1)
    for x in v:
        out = np.concatenate([out + x, out - x])
    return out


def permutation_test(d, exact_max_n: int = EXACT_PERMUTATION_MAX_N, n_resamples: int = MC_PERMUTATIONS,
                     seed: int = 0) -> PermutationTest:
    """Two-sided paired permutation (sign-flip) test of the mean of ``d``.

    p = #{sign patterns s : |sum_i s_i |d_i|| >= |sum_i d_i|} / #patterns. For n <= ``exact_max_n`` all 2^n patterns
    are counted (the sums of the two halves are enumerated and matched by sorting, so n = 20 costs two lists of
    1024); above it, ``n_resamples`` random patterns from ``numpy.random.default_rng(seed)`` give
    p = (1 + hits) / (1 + n_resamples). Sums equal up to 1e-9 of sum |d_i| count as ties (at least as extreme).

    Example: d = [1, 2, 3] -> sums of the 8 patterns are +-6, +-4, +-2, 0, 0: p = 2/8 = 0.25.
    """
    a = _finite_1d(d, "d")
    n = a.size
    if n == 0:
        return PermutationTest(1.0, 1, True, None)
    mag = np.abs(a)
    obs = abs(float(a.sum()))
    tol = 1e-9 * float(mag.sum())
    if obs <= tol:  # every pattern is at least as extreme as a zero sum
        return PermutationTest(1.0, 2 ** n if n <= exact_max_n else n_resamples, n <= exact_max_n,
                               None if n <= exact_max_n else seed)
    thr = obs - tol
    if n <= exact_max_n:
        h = n // 2
        left, right = _sign_sums(mag[:h]), np.sort(_sign_sums(mag[h:]))
        ge = right.size - np.searchsorted(right, thr - left, side="left")   # left + right >= thr
        le = np.searchsorted(right, -thr - left, side="right")              # left + right <= -thr
        hits = int(ge.sum() + le.sum())
        total = 2 ** n
        return PermutationTest(hits / total, total, True, None)
    rng = np.random.default_rng(seed)
    hits, done, chunk = 0, 0, max(1, 4_000_000 // n)
    while done < n_resamples:
        k = min(chunk, n_resamples - done)
        signs = rng.integers(0, 2, size=(k, n), dtype=np.int8) * 2 - 1
        hits += int((np.abs(signs @ mag) >= thr).sum())
        done += k
    return PermutationTest((1 + hits) / (1 + n_resamples), n_resamples, False, seed)


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm step-down adjusted p-values, in the input order.

    Sorted ascending p_(1) <= ... <= p_(m): adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)). NaN entries
    count as p = 1 in the family (m is the number of entries) and come back NaN.

    Example: [0.01, 0.04, 0.03, 0.005] -> [0.03, 0.06, 0.06, 0.02].
    """
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"pvalues must be 1-D, got shape {p.shape}")
    if np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must be in [0, 1], got {p.tolist()}")
    m = p.size
    filled = np.where(np.isnan(p), 1.0, p)
    order = np.argsort(filled, kind="stable")
    adj = np.minimum(1.0, (m - np.arange(m)) * filled[order])
    out = np.empty(m)
    out[order] = np.maximum.accumulate(adj)
    out[np.isnan(p)] = np.nan
    return out


def detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable difference of a two-sided one-sample (paired) t test: the smallest delta > 0 with
    ``P(|T| > t_{n-1}(1 - alpha/2)) >= power`` for T noncentral t with n - 1 degrees of freedom and noncentrality
    delta sqrt(n) / sd. NaN for n < 2 or a non-finite sd; 0 for sd = 0.

    Example: sd = 1, n = 10, alpha = 0.05: 0.9960 (the shortcut
    (t_9(0.975) + t_9(0.8)) / sqrt(10) = (2.2622 + 0.8834) / 3.1623 = 0.9947 is a little low).
    """
    if n < 2 or not np.isfinite(sd):
        return float("nan")
    if sd == 0:
        return 0.0
    df = n - 1
    crit = float(scipy.stats.t.ppf(1 - alpha / 2, df))

    def shortfall(nc: float) -> float:  # power at noncentrality nc, minus the target
        lower = float(np.nan_to_num(scipy.stats.nct.cdf(-crit, df, nc)))  # ~0; scipy returns NaN at some nc
        return float(scipy.stats.nct.sf(crit, df, nc)) + lower - power

    hi = crit + 4.0
    while shortfall(hi) < 0:
        hi *= 2
    nc = scipy.optimize.brentq(shortfall, 0.0, hi, xtol=1e-12)
    return float(nc * sd / math.sqrt(n))


# ---------------------------------------------------------------------------------------------- comparisons


@dataclass(frozen=True)
class Comparison:
    """One comparison a - b over seeds (see :func:`compare_declared`).

    Attributes:
        a, b: arm names; ``d = a - b`` per seed.
        label: what is compared (endpoint metric and window), for tables.
        d: the per-seed differences, in seed order; ``seeds`` their seeds.
        t: 1 - alpha t interval of the mean difference; ``t_adj``: at 1 - alpha/m (Bonferroni over the family).
        bca, bca_adj: the same by BCa bootstrap when n >= MIN_BOOTSTRAP_N, else None.
        sign, perm: exact sign test and paired permutation test (unadjusted).
        p_holm: Holm-adjusted permutation p over the family (None for exploratory rows).
        verdict: "a > b", "a < b" or "not resolved" for declared rows; None for exploratory rows.
        reason: why not resolved (empty when resolved or exploratory).
        underpowered: the warning text when n < min_seeds (empty otherwise).
        mdd: the difference detectable with 80% power at level alpha/m (:func:`detectable_difference`; the
            family's correction for declared rows, alpha for exploratory ones); NaN below 2 seeds.
    """

    a: str
    b: str
    label: str
    seeds: tuple[int, ...]
    d: tuple[float, ...]
    t: Interval
    t_adj: Interval
    bca: Interval | None
    bca_adj: Interval | None
    sign: SignTest
    perm: PermutationTest
    alpha: float
    m: int
    p_holm: float | None = None
    verdict: str | None = None
    reason: str = ""
    underpowered: str = ""
    mdd: float = float("nan")
    extra: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.d)

    @property
    def mean(self) -> float:
        return self.t.point


def _one(a: str, b: str, label: str, seeds, d, alpha: float, m: int, n_resamples: int, seed: int) -> Comparison:
    d = _finite_1d(d, "d")
    adj_conf = 1 - alpha / m
    t = t_interval(d, 1 - alpha)
    t_adj = t_interval(d, adj_conf)
    bca = bca_adj = None
    if d.size >= MIN_BOOTSTRAP_N:
        bca = bca_interval(d, 1 - alpha, n_resamples, seed)
        bca_adj = bca_interval(d, adj_conf, n_resamples, seed)
    mdd = detectable_difference(float(d.std(ddof=1)), d.size, alpha / m) if d.size >= 2 else float("nan")
    return Comparison(a, b, label, tuple(int(s) for s in seeds), tuple(float(v) for v in d), t, t_adj, bca, bca_adj,
                      sign_test(d), permutation_test(d, seed=seed), alpha, m, mdd=mdd)


def smallest_permutation_p(n: int) -> float:
    """The smallest two-sided p the exact paired permutation test can give at ``n`` seeds: 2/2^n (all signs alike,
    either way); 0 above EXACT_PERMUTATION_MAX_N, where the test is no longer exact-enumerated."""
    return 2.0 / 2 ** n if n <= EXACT_PERMUTATION_MAX_N else 0.0


def compare_declared(items: Sequence[tuple[str, str, str, Sequence[int], Sequence[float]]], alpha: float = 0.05,
                     min_seeds: int = 10, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> list[Comparison]:
    """The declared comparisons of a study, as one family: intervals, tests, Holm and a verdict for each.

    Args:
        items: ``(a, b, label, seeds, d)`` per declared comparison, ``d`` the per-seed differences a - b (possibly
            empty when an arm has no runs).
        alpha: family-wise error rate; intervals are also given at 1 - alpha.
        min_seeds: fewer paired seeds than this gives the "underpowered" warning.
        n_resamples, seed: BCa settings (and the Monte Carlo seed of the permutation test above 20 seeds).

    Returns:
        One :class:`Comparison` per item, in order. Verdict rule (module docstring): "a > b" / "a < b" when the
        1 - alpha/m interval(s) exclude 0 and the Holm-adjusted permutation p <= alpha, else "not resolved".
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    m = max(1, len(items))
    rows = [_one(a, b, label, seeds, d, alpha, m, n_resamples, seed) for a, b, label, seeds, d in items]
    p_adj = holm([r.perm.p if r.n >= 1 else np.nan for r in rows]) if rows else []
    out = []
    for r, ph in zip(rows, p_adj):
        ph = float(ph)
        shown = [r.t_adj] + ([r.bca_adj] if r.bca_adj is not None else [])
        reasons = []
        if r.n < 2:
            reasons.append(f"{r.n} paired seed(s): nothing to compare")
        else:
            for iv in shown:
                if not iv.excludes(0.0):
                    reasons.append(f"the {interval_label(iv.method, iv.confidence)} interval "
                                   f"[{iv.low:+.4g}, {iv.high:+.4g}] includes 0")
            if not (ph <= alpha):
                why = f"Holm-adjusted permutation p = {ph:.3g} > {alpha:g}"
                floor = smallest_permutation_p(r.n)
                if floor > alpha / m:
                    why += (f" (with {r.n} seeds the smallest attainable permutation p is {floor:.3g}, "
                            f"above {alpha:g}/{m})")
                reasons.append(why)
        verdict = "not resolved" if reasons else (f"{r.a} > {r.b}" if r.mean > 0 else f"{r.a} < {r.b}")
        under = ""
        if r.n < min_seeds:
            under = (f"underpowered: {r.n} seeds (fewer than min_seeds = {min_seeds}); differences below "
                     f"{r.mdd:.3g} are detected with less than 80% power" if np.isfinite(r.mdd) else
                     f"underpowered: {r.n} seeds (fewer than min_seeds = {min_seeds}); no interval")
        out.append(_replace(r, p_holm=ph, verdict=verdict, reason="; ".join(reasons), underpowered=under))
    return out


def compare_exploratory(items: Sequence[tuple[str, str, str, Sequence[int], Sequence[float]]], alpha: float = 0.05,
                        n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> list[Comparison]:
    """Comparisons nobody declared before the runs: 1 - alpha intervals and unadjusted tests, no Holm, no verdict."""
    return [_one(a, b, label, seeds, d, alpha, 1, n_resamples, seed) for a, b, label, seeds, d in items]


def _replace(c: Comparison, **kw) -> Comparison:
    from dataclasses import replace

    return replace(c, **kw)


INCONCLUSIVE = "inconclusive (positive control failed)"
"""Verdict of an unresolved comparison in a family whose positive control failed."""


def apply_positive_control(rows: Sequence[Comparison], control: int) -> list[Comparison]:
    """``rows`` (from :func:`compare_declared`) with the positive control applied: ``rows[control]`` is expected
    to resolve as "a > b". When it does not, every other row that is "not resolved" becomes :data:`INCONCLUSIVE`
    and the control's own reason says it failed; resolved rows keep their verdicts (a difference the data resolve
    is still a difference). When it does, the rows are returned unchanged."""
    c = rows[control]
    if c.verdict == f"{c.a} > {c.b}":
        return list(rows)
    failed = f"positive control failed: {c.a} - {c.b} on {c.label} is {c.verdict}, not {c.a} > {c.b}"
    out = []
    for i, r in enumerate(rows):
        if i == control:
            out.append(_replace(r, reason="; ".join(x for x in (r.reason, "the positive control failed") if x)))
        elif r.verdict == "not resolved":
            out.append(_replace(r, verdict=INCONCLUSIVE, reason="; ".join(x for x in (r.reason, failed) if x)))
        else:
            out.append(r)
    return out

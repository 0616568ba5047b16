"""Pre-registration: what a sweep spec's ``report:`` section declares before the runs, and the per-run values it
names.

Spec keys (all optional; ``objbench sweep`` copies the section into sweep.json, where the report reads it)::

    report:
      primary: eval/pass@1        # headline metric of the tables; also the endpoint when `endpoints` is absent
      window: final               # window of the primary endpoint (default final; see below)
      endpoints:                  # optional: the measures that get verdicts, when they are not (only) the primary
        - {metric: length/incorrect, window: {last: 50}}
      comparisons:                # [a, b] pairs: the per-seed difference a - b ...
        - [seq_mean_token_mean, token_mean]
      baseline: group_std         # ... or every other arm minus this one (both may be given; duplicates dropped)
      positive_control: [verdict_seq_mean, verdict_token_mean]   # optional: the comparison (one of the above,
                                  # on the first endpoint) that must resolve as a > b for the study to be able to
                                  # show the effect; when it does not, the other unresolved comparisons are
                                  # "inconclusive (positive control failed)" (analysis.inference)
      alpha: 0.05                 # family-wise error rate over endpoints x comparisons (Holm); default 0.05
      min_seeds: 10               # fewer paired seeds -> the report says "underpowered"; default 10
      study: length_bias          # study section (analysis/studies.py)

Windows (the per-run value of a metric). Windows count training steps, never logged points: a "point" is a step at
which the metric was logged (every step for metrics.jsonl keys, every evaluation for eval.jsonl keys), and a window
takes the points whose steps fall inside it. Step 0 is the start policy: it is left out of every window whenever a
run has later points, except ``auc`` (the area starts at the start policy) and a ``steps`` range that includes 0.

- ``final``: the last point.
- ``{last: K}`` (or ``"last:K"``): mean of the points in the last K steps of the run's schedule, steps
  S - K + 1 .. S with S the run's ``train.steps`` (the last logged step where the schedule is unknown). A run
  that did not log the metric at every one of those steps contributes the points it has (the report says how many
  points each run contributed); one with none there is left out of the comparison. For an evaluation metric
  logged every E steps the window holds the evaluations inside it (``last: 50`` with E = 10: five).
- ``{steps: [lo, hi]}``: mean of the points with lo <= step <= hi.
- ``{last: K, stat: median}`` / ``{steps: [lo, hi], stat: median}``: the median of the same points instead of
  their mean (a heavy-tailed per-step metric such as policy/approx_kl, whose mean a few steps dominate).
- ``auc``: area under the curve over steps (trapezoid rule) divided by the step span, i.e. the curve's mean
  height; one point: its value.
- ``std``: standard deviation (ddof 1) over the points (e.g. the stability of the gradient norm).
- ``{from: WINDOW, to: WINDOW}``: the change, value(to) - value(from) (e.g. the gain from the first 20 steps to
  the last 50).
- ``{reach: X}``: steps to a level, the first step (start policy included) whose value is >= X. A run that never
  gets there is censored: it counts as reaching X one point period after its last point (last step + the gap
  between its last two points), so a difference between arms is then a bound, not an estimate (the report says
  how many runs were censored).

The Holm family is every (endpoint, comparison) pair; a report gives verdicts for those and nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "REPORT_KEYS",
    "DEFAULT_ALPHA",
    "DEFAULT_MIN_SEEDS",
    "Window",
    "Endpoint",
    "Plan",
    "parse_window",
    "parse_plan",
    "check_report_spec",
    "per_run_values",
    "schedule_ends",
    "points_note",
    "eval_window_problems",
    "paired_differences",
]

REPORT_KEYS = ("primary", "window", "endpoints", "comparisons", "baseline", "positive_control", "alpha", "min_seeds",
               "study")
"""Keys a sweep spec's ``report:`` section may hold."""
DEFAULT_ALPHA = 0.05
DEFAULT_MIN_SEEDS = 10


@dataclass(frozen=True)
class Window:
    """How one run's curve of a metric becomes one number (module docstring). ``kind`` is one of final, last,
    steps, auc, std, change; ``k`` (last), ``lo``/``hi`` (steps), ``start``/``end`` (change: end - start)."""

    kind: str
    k: int | None = None
    stat: str = "mean"
    lo: int | None = None
    hi: int | None = None
    start: "Window | None" = None
    end: "Window | None" = None
    level: float | None = None

    def label(self) -> str:
        """Short words for tables: ``final``, ``last 50``, ``steps 1-20``, ``step 0``, ``auc``, ``std``,
        ``last 50 - steps 1-20``."""
        med = "median of " if self.stat == "median" else ""
        if self.kind == "last":
            return f"{med}last {self.k}"
        if self.kind == "steps":
            return med + (f"step {self.lo}" if self.lo == self.hi else f"steps {self.lo}-{self.hi}")
        if self.kind == "change":
            return f"{self.end.label()} - {self.start.label()}"
        if self.kind == "reach":
            return f"steps to {self.level:g}"
        return self.kind

    def describe(self) -> str:
        """A sentence fragment for the report."""
        if self.kind == "reach":
            return (f"the first step at which each run's value is >= {self.level:g} (never: censored one point period "
                    f"after its last point)")
        if self.kind == "change":
            return f"the change per run from ({self.start.describe()}) to ({self.end.describe()})"
        return {
            "final": "the last point of each run",
            "last": f"the {self.stat} over the last {self.k} steps of each run's schedule",
            "steps": f"the {self.stat} over steps {self.lo}-{self.hi} of each run",
            "auc": "the area under each run's curve over steps divided by the step span (its mean height)",
            "std": "the standard deviation over each run's points",
        }[self.kind]

    def to_spec(self) -> Any:
        """The YAML/JSON form :func:`parse_window` reads back."""
        med = {"stat": "median"} if self.stat == "median" else {}
        if self.kind == "last":
            return {"last": self.k, **med}
        if self.kind == "steps":
            return {"steps": [self.lo, self.hi], **med}
        if self.kind == "change":
            return {"from": self.start.to_spec(), "to": self.end.to_spec()}
        if self.kind == "reach":
            return {"reach": self.level}
        return self.kind


FINAL = Window("final")


def parse_window(spec: Any) -> Window:
    """A window from its spec form (module docstring); ``None`` means ``final``. Raises ValueError naming the
    valid forms."""
    forms = ("final, auc, std, {last: K} (or 'last:K'), {steps: [lo, hi]}, either with stat: median, "
             "{from: WINDOW, to: WINDOW}, {reach: X}")
    if spec is None:
        return FINAL
    if isinstance(spec, Window):
        return spec
    if isinstance(spec, str):
        s = spec.strip()
        if s in ("final", "auc", "std"):
            return Window(s)
        if s.startswith("last:"):
            return parse_window({"last": s[5:].strip()})
        raise ValueError(f"unknown window {spec!r}; valid: {forms}")
    if isinstance(spec, dict) and "stat" in spec:
        stat, rest = spec["stat"], {k: v for k, v in spec.items() if k != "stat"}
        if stat not in ("mean", "median") or set(rest) not in ({"last"}, {"steps"}):
            raise ValueError(f"window stat: mean | median, with last: K or steps: [lo, hi] only; got {spec!r}")
        return dataclasses.replace(parse_window(rest), stat=stat)
    if isinstance(spec, dict):
        keys = set(spec)
        if keys == {"last"}:
            k = spec["last"]
            try:
                k = int(k)
            except (TypeError, ValueError):
                raise ValueError(f"window last: K needs a positive integer, got {spec['last']!r}") from None
            if k < 1:
                raise ValueError(f"window last: K needs K >= 1, got {k}")
            return Window("last", k=k)
        if keys == {"steps"}:
            r = spec["steps"]
            if (not isinstance(r, (list, tuple)) or len(r) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                                                           for v in r) or r[0] > r[1] or r[0] < 0):
                raise ValueError(f"window steps: needs [lo, hi] with 0 <= lo <= hi integers, got {r!r}")
            return Window("steps", lo=int(r[0]), hi=int(r[1]))
        if keys == {"reach"}:
            x = spec["reach"]
            if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or abs(x) == float("inf"):
                raise ValueError(f"window reach: X needs a finite number, got {x!r}")
            return Window("reach", level=float(x))
        if keys == {"from", "to"}:
            a, b = parse_window(spec["from"]), parse_window(spec["to"])
            if "change" in (a.kind, b.kind):
                raise ValueError("a change window cannot nest another change window")
            return Window("change", start=a, end=b)
    raise ValueError(f"unknown window {spec!r}; valid: {forms}")


@dataclass(frozen=True)
class Endpoint:
    """A metric and its window: one number per run."""

    metric: str
    window: Window = FINAL

    def label(self) -> str:
        return f"{self.metric} ({self.window.label()})"

    def to_spec(self) -> dict:
        return {"metric": self.metric, "window": self.window.to_spec()}


@dataclass(frozen=True)
class Plan:
    """What a report tests, as declared before the runs.

    Attributes:
        endpoints: the measures that get verdicts.
        comparisons: ``(a, b)`` arm pairs, difference a - b per seed; empty when nothing was declared.
        alpha, min_seeds: as in the spec.
        declared: True when the spec declared comparisons (else the report gives no verdicts).
        positive_control: the comparison ``(a, b)`` expected to resolve as a > b on the first endpoint, or None.
    """

    endpoints: tuple[Endpoint, ...]
    comparisons: tuple[tuple[str, str], ...]
    alpha: float = DEFAULT_ALPHA
    min_seeds: int = DEFAULT_MIN_SEEDS
    positive_control: tuple[str, str] | None = None

    @property
    def declared(self) -> bool:
        return bool(self.comparisons)

    @property
    def family_size(self) -> int:
        return len(self.endpoints) * len(self.comparisons)

    def to_spec(self) -> dict:
        spec = {"endpoints": [e.to_spec() for e in self.endpoints], "comparisons": [list(c) for c in self.comparisons],
                "alpha": self.alpha, "min_seeds": self.min_seeds}
        if self.positive_control:
            spec["positive_control"] = list(self.positive_control)
        return spec


def _comparisons(report: dict, arms: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    raw = report.get("comparisons")
    if raw is not None:
        if not isinstance(raw, list):
            raise ValueError(f"report.comparisons must be a list of [arm_a, arm_b] pairs, got {raw!r}")
        for c in raw:
            if (not isinstance(c, (list, tuple)) or len(c) != 2 or not all(isinstance(x, str) for x in c)
                    or c[0] == c[1]):
                raise ValueError(f"report.comparisons: each entry is [arm_a, arm_b] with two different arm names, "
                                 f"got {c!r}")
            pairs.append((c[0], c[1]))
    base = report.get("baseline")
    if base is not None:
        if not isinstance(base, str):
            raise ValueError(f"report.baseline must be an arm name, got {base!r}")
        if arms is None:
            raise ValueError("report.baseline needs the sweep's arm list")
        pairs += [(a, base) for a in arms if a != base]
    if arms is not None:
        unknown = sorted({x for p in pairs for x in p} - set(arms) | ({base} - set(arms) if base else set()))
        if unknown:
            raise ValueError(f"report comparisons name unknown arm(s) {unknown}; arms: {', '.join(arms)}")
    seen, out = set(), []
    for p in pairs:
        if p in seen:
            continue
        if (p[1], p[0]) in seen:
            raise ValueError(f"report comparisons declare both {list(p)} and {[p[1], p[0]]}: declare one direction")
        seen.add(p)
        out.append(p)
    return tuple(out)


def parse_plan(report: dict | None, arms: Sequence[str] | None = None, primary: str | None = None) -> Plan:
    """The :class:`Plan` of a ``report:`` section.

    Args:
        report: the section (sweep.json ``report``); None or {} = nothing declared.
        arms: the sweep's arms (checks the comparisons' names, expands ``baseline``); None skips the check.
        primary: the primary metric to use when the section names none (the report's resolved default).

    Raises:
        ValueError: unknown keys, malformed values, unknown arms; the message names the key.
    """
    report = report or {}
    if not isinstance(report, dict):
        raise ValueError(f"the report section must be a mapping, got {report!r}")
    unknown = sorted(set(report) - set(REPORT_KEYS))
    if unknown:
        raise ValueError(f"unknown report key(s) {unknown}; valid: {', '.join(REPORT_KEYS)}")
    alpha = report.get("alpha", DEFAULT_ALPHA)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"report.alpha must be a number in (0, 1), got {alpha!r}")
    min_seeds = report.get("min_seeds", DEFAULT_MIN_SEEDS)
    if isinstance(min_seeds, bool) or not isinstance(min_seeds, int) or min_seeds < 2:
        raise ValueError(f"report.min_seeds must be an integer >= 2, got {min_seeds!r}")
    window = parse_window(report.get("window"))
    eps = report.get("endpoints")
    if eps is not None:
        if not isinstance(eps, list) or not eps:
            raise ValueError("report.endpoints must be a non-empty list of {metric: KEY, window: WINDOW}")
        endpoints = []
        for e in eps:
            if isinstance(e, str):
                e = {"metric": e}
            if not isinstance(e, dict) or "metric" not in e or set(e) - {"metric", "window"} or not isinstance(
                    e["metric"], str):
                raise ValueError(f"report.endpoints: each entry is {{metric: KEY, window: WINDOW}}, got {e!r}")
            endpoints.append(Endpoint(e["metric"], parse_window(e.get("window"))))
        if len(set(endpoints)) != len(endpoints):
            raise ValueError("report.endpoints lists the same endpoint twice")
    else:
        metric = report.get("primary", primary)
        if metric is not None and not isinstance(metric, str):
            raise ValueError(f"report.primary must be a metric name, got {metric!r}")
        endpoints = [Endpoint(metric, window)] if metric else []
    comparisons = _comparisons(report, arms)
    if comparisons and not endpoints:
        raise ValueError("report comparisons are declared but no endpoint: give report.primary or report.endpoints")
    control = report.get("positive_control")
    if control is not None:
        if not isinstance(control, (list, tuple)) or tuple(control) not in comparisons:
            raise ValueError(f"report.positive_control must be one of the declared comparisons [a, b] (expected "
                             f"a > b on the first endpoint), got {control!r}")
        control = tuple(control)
    return Plan(tuple(endpoints), comparisons, float(alpha), int(min_seeds), control)


# the studies whose report section analysis/studies.py writes (named by a spec's report.study)
STUDIES = ("length_bias", "difficulty_bias", "kl_estimators", "off_policy")


def check_report_spec(report: Any, arms: Sequence[str] | None = None) -> None:
    """Validate a sweep spec's ``report:`` section when the spec is loaded (before any run): raises ValueError
    with the problem. The study name is checked against ``STUDIES`` (each has a section in analysis/studies.py)."""
    plan_input = report if report is not None else {}
    parse_plan(plan_input, arms)
    if isinstance(report, dict) and "study" in report:
        if report["study"] not in STUDIES:
            raise ValueError(f"report.study {report['study']!r} is not one of {', '.join(STUDIES)}")


# ---------------------------------------------------------------------------------------------- values


def _window_value(steps: np.ndarray, values: np.ndarray, w: Window, end: int | None = None) -> tuple[float, int]:
    """One run's value and the number of points it was computed from; ``steps`` ascending, values finite; ``end``
    the last step of the run's schedule (None: its last logged step)."""
    if w.kind == "change":
        (v1, n1), (v0, n0) = _window_value(steps, values, w.end, end), _window_value(steps, values, w.start, end)
        return v1 - v0, n1 + n0
    if w.kind == "auc":
        if steps.size == 1:
            return float(values[0]), 1
        area = float(np.sum((values[1:] + values[:-1]) / 2 * np.diff(steps)))  # trapezoid rule
        return area / float(steps[-1] - steps[0]), int(steps.size)
    if w.kind == "reach":
        hit = np.nonzero(values >= w.level)[0]
        if hit.size:
            return float(steps[hit[0]]), int(hit[0]) + 1
        gap = float(steps[-1] - steps[-2]) if steps.size > 1 else 1.0
        return float(steps[-1]) + gap, int(steps.size)  # censored: see the module docstring
    pool = np.median if w.stat == "median" else np.mean
    if w.kind == "steps":
        sel = (steps >= w.lo) & (steps <= w.hi)
        return (float(pool(values[sel])) if sel.any() else float("nan")), int(sel.sum())
    if steps.size > 1 and steps[0] == 0:  # the start policy is not part of a training window
        steps, values = steps[1:], values[1:]
    if w.kind == "final":
        return float(values[-1]), 1
    if w.kind == "last":
        last = int(steps[-1]) if end is None else int(end)
        sel = (steps > last - w.k) & (steps <= last)
        return (float(pool(values[sel])) if sel.any() else float("nan")), int(sel.sum())
    if w.kind == "std":
        return (float(values.std(ddof=1)) if values.size > 1 else float("nan")), int(values.size)
    raise ValueError(f"unknown window kind {w.kind!r}")


def schedule_ends(configs: pd.DataFrame) -> dict[str, int]:
    """The last step of each run's schedule (its ``train.steps``), from a ``Runs.configs`` table; runs without
    the key are absent (their windows end at their last logged point)."""
    if "train.steps" not in configs.columns:
        return {}
    steps = configs[["run", "train.steps"]].dropna()
    return {str(r): int(s) for r, s in zip(steps["run"], steps["train.steps"])}


def per_run_values(frame: pd.DataFrame, metric: str, window: Window | Any = FINAL,
                   ends: dict[str, int] | None = None) -> pd.DataFrame:
    """One value per run of ``metric`` over ``window``.

    Data contract: ``frame`` is a long table (``Runs.metrics`` or ``Runs.evals``) with columns run, arm, seed, step,
    metric, value. Runs without the metric are absent; a run whose window holds no point gets NaN and is dropped.
    ``ends``: run -> last step of its schedule (:func:`schedule_ends`), where ``last: K`` windows end; a run not in
    it ends at its last logged point.

    Returns:
        DataFrame with columns run, arm, seed, value, points (how many logged points the value was computed from),
        in the run order of ``frame``.
    """
    w = parse_window(window)
    missing = [c for c in ("run", "arm", "seed", "step", "metric", "value") if c not in frame.columns]
    if missing:
        raise ValueError(f"per_run_values: missing column(s) {missing}; got {list(frame.columns)}")
    ends = ends or {}
    d = frame[(frame["metric"] == metric) & frame["value"].notna()]
    rows = []
    for run, g in d.groupby("run", sort=False):
        g = g.sort_values("step", kind="stable")
        v, points = _window_value(g["step"].to_numpy(), g["value"].to_numpy(dtype=float), w, ends.get(str(run)))
        if np.isfinite(v):
            rows.append({"run": run, "arm": g["arm"].iloc[0], "seed": int(g["seed"].iloc[0]), "value": v,
                         "points": points})
    return pd.DataFrame(rows, columns=["run", "arm", "seed", "value", "points"])


def points_note(values: pd.DataFrame, label: str) -> str:
    """One sentence on how many points each run's value of an endpoint was computed from: the range over the runs
    with at least half the largest count, and each run with fewer named with its count (up to 8)."""
    if values.empty:
        return f"`{label}`: no run has a point in the window"
    full = int(values["points"].max())
    most = values[values["points"] * 2 >= full]
    few = values[values["points"] * 2 < full].sort_values("points", kind="stable")
    lo = int(most["points"].min())
    text = f"`{label}`: points per run {lo if lo == full else f'{lo}-{full}'} ({len(most)} run{'s' * (len(most) > 1)})"
    if not few.empty:
        named = [f"{r} {int(n)}" for r, n in zip(few["run"], few["points"])]
        text += "; fewer than half: " + ", ".join(named[:8]) + (f" and {len(named) - 8} more" if len(named) > 8 else "")
    return text


def _eval_steps_in(w: Window, steps: int, every: int) -> int:
    """How many evaluations (steps 0, every, 2 every, ..., and the last step) window ``w`` can hold in a run of
    ``steps`` steps; change windows: the smaller of their two parts."""
    if w.kind == "change":
        return min(_eval_steps_in(w.start, steps, every), _eval_steps_in(w.end, steps, every))
    evals = sorted({0, steps, *range(every, steps + 1, every)})
    if w.kind == "steps":
        return sum(w.lo <= s <= w.hi for s in evals)
    if w.kind == "last":
        return sum(steps - w.k < s <= steps and s > 0 for s in evals)
    return len(evals)


def eval_window_problems(plan: Plan, schedules: dict[str, tuple[int, int]]) -> list[str]:
    """Declared endpoints on an evaluation metric (``eval/...``) whose window holds no evaluation in some arm's
    schedule, as messages; ``schedules``: arm -> (train.steps, train.eval_every)."""
    problems = []
    for e in plan.endpoints:
        if not e.metric.startswith("eval/"):
            continue
        for arm, (steps, every) in schedules.items():
            if _eval_steps_in(e.window, steps, every) == 0:
                problems.append(f"endpoint {e.metric} ({e.window.label()}) holds no evaluation in arm {arm!r}: it "
                                f"evaluates at step 0, every {every} steps and at its last step {steps}")
    return problems


def unresolvable_warning(plan: Plan, n_seeds: int) -> str | None:
    """A note when no declared comparison can be resolved at ``n_seeds`` paired seeds, whatever the data: a
    comparison resolves only with a Holm-adjusted exact permutation p <= alpha, so its raw p must reach alpha/m (m the
    family size), and the smallest p the exact test can give is 2/2^n. None when it can, or nothing is declared."""
    from objbench.analysis.inference import smallest_permutation_p

    if not cannot_resolve(plan, n_seeds):
        return None
    level = plan.alpha / plan.family_size
    need = next(n for n in range(n_seeds + 1, 64) if not cannot_resolve(plan, n))
    return (f"note: at {n_seeds} seeds no declared comparison can be resolved, whatever the data: the smallest exact "
            f"permutation p is 2/2^{n_seeds} = {smallest_permutation_p(n_seeds):.3g}, above alpha/m = {plan.alpha:g}/"
            f"{plan.family_size} = {level:.3g} ({need} seeds reach it); its comparisons can only be descriptive")


def cannot_resolve(plan: Plan, n_seeds: int) -> bool:
    """True when the plan declares comparisons and none can be resolved at ``n_seeds`` paired seeds whatever the data:
    the smallest exact permutation p, 2/2^n, lies above alpha/m (Holm's first step)."""
    from objbench.analysis.inference import smallest_permutation_p

    return plan.declared and n_seeds >= 1 and smallest_permutation_p(n_seeds) > plan.alpha / plan.family_size


def paired_differences(values: pd.DataFrame, a: str, b: str) -> tuple[list[int], list[float]]:
    """Seeds and per-seed differences a - b of :func:`per_run_values` output, over the seeds both arms have,
    ascending. Two runs of one arm with the same seed raise ValueError."""
    def by_seed(arm):
        s = values[values["arm"] == arm]
        if s["seed"].duplicated().any():
            raise ValueError(f"arm {arm!r} has more than one run for seed(s) "
                             f"{sorted(s.loc[s['seed'].duplicated(), 'seed'].unique())}: cannot pair by seed")
        return s.set_index("seed")["value"]

    d = (by_seed(a) - by_seed(b)).dropna().sort_index()
    return [int(s) for s in d.index], [float(v) for v in d.to_numpy()]

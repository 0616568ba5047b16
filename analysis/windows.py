"""Windows: how one run's curve of a metric becomes one number (``Window``, ``Endpoint``), the per-run values
of a metric over a window, and per-seed paired differences of them. A sweep spec's ``report:`` section names
windows (analysis.prereg); the study sections and the score card use them too.

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

"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "Window",
    "FINAL",
    "Endpoint",
    "parse_window",
    "per_run_values",
    "schedule_ends",
    "points_note",
    "paired_differences",
]


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

"""The measures the study sections share: per-run means over the start and end windows of training, their per-arm
tables with 95% intervals over seeds, exploratory paired differences between arms, and learning curves smoothed per
run.

Windows: the start is steps 1-20 (``START``), the end the last 50 steps of each run's schedule (``END``); ``GAIN``
is their difference. Intervals over seeds are t intervals below 10 seeds, BCa from 10 (analysis.stats.mean_ci; the
tables name the method). Paired differences are exploratory: exact sign and permutation tests, not adjusted.
"""

from __future__ import annotations

import pandas as pd

from objbench.analysis.inference import compare_exploratory
from objbench.analysis.stats import mean_ci
from objbench.analysis.windows import Endpoint, Window, paired_differences, per_run_values, schedule_ends

__all__ = ["START", "END_STEPS", "END", "GAIN", "per_run_window", "window_table", "end_table", "paired_diff",
           "undeclared", "curves"]

START = (1, 20)      # steps of the "start" window
END_STEPS = 50       # the "end" window: the last 50 steps of each run
END = Window("last", k=END_STEPS)
"""The end window as a pre-registration window: the mean of the last 50 logged steps."""
GAIN = Window("change", start=Window("steps", lo=START[0], hi=START[1]), end=END)
"""Start -> end change: mean over the last 50 steps minus the mean over steps 1-20."""


def per_run_window(runs, metric: str, lo: int | None, hi: int | None, last: int | None = None) -> pd.DataFrame:
    """Mean of ``metric`` per run over steps [lo, hi], or over the last ``last`` steps of its schedule. Columns
    run, arm, seed, value."""
    m = runs.metrics
    m = m[m["metric"] == metric]
    if m.empty:
        return pd.DataFrame(columns=["run", "arm", "seed", "value"])
    if last is not None:  # the last steps of each run's schedule (its last logged step where that is unknown)
        top = m["run"].map(schedule_ends(runs.configs)).fillna(m.groupby("run")["step"].transform("max"))
        m = m[(m["step"] > top - last) & (m["step"] <= top)]
    else:
        m = m[(m["step"] >= lo) & (m["step"] <= hi)]
    return m.groupby(["run", "arm", "seed"], as_index=False)["value"].mean()


def window_table(runs, metrics: list[str], n_resamples: int = 10_000) -> pd.DataFrame:
    """Per arm and metric: start-window mean, end-window mean, mean per-seed change with a 95% interval (t below 10
    seeds, BCa from 10; column ``interval``)."""
    rows = []
    for metric in metrics:
        a = per_run_window(runs, metric, *START)
        b = per_run_window(runs, metric, None, None, last=END_STEPS)
        if a.empty or b.empty:
            continue
        j = a.merge(b, on=["run", "arm", "seed"], suffixes=("_start", "_end")).dropna()
        for arm in runs.present_arms:
            r = j[j["arm"] == arm]
            if r.empty:
                continue
            d = (r["value_end"] - r["value_start"]).to_numpy()
            ci = mean_ci(d, n_resamples=n_resamples)
            rows.append({"metric": metric, "arm": arm, "n": len(r), "start": r["value_start"].mean(),
                         "end": r["value_end"].mean(), "change": d.mean(), "ci_low": ci.low, "ci_high": ci.high,
                         "interval": ci.method})
    return pd.DataFrame(rows, columns=["metric", "arm", "n", "start", "end", "change", "ci_low", "ci_high",
                                       "interval"])


def end_table(runs, metrics: list[str], n_resamples: int = 10_000) -> pd.DataFrame:
    """Per arm and metric: mean over the end window, mean over seeds with a 95% interval (t below 10 seeds, BCa from
    10; column ``interval``)."""
    rows = []
    for metric in metrics:
        b = per_run_window(runs, metric, None, None, last=END_STEPS).dropna()
        for arm in runs.present_arms:
            v = b[b["arm"] == arm]["value"].to_numpy()
            if len(v) == 0:
                continue
            ci = mean_ci(v, n_resamples=n_resamples)
            rows.append({"metric": metric, "arm": arm, "n": len(v), "mean": v.mean(), "ci_low": ci.low,
                         "ci_high": ci.high, "interval": ci.method})
    return pd.DataFrame(rows, columns=["metric", "arm", "n", "mean", "ci_low", "ci_high", "interval"])


def endpoint_values(runs, e: Endpoint) -> pd.DataFrame:
    """One value per run of the endpoint ``e`` (analysis.windows.per_run_values), from the evaluations when ``e``
    names an evaluation metric, else from the training metrics."""
    frame = runs.evals if e.metric in set(runs.eval_names) else runs.metrics
    return per_run_values(frame, e.metric, e.window, schedule_ends(runs.configs))


def paired_diff(runs, metric: str, a: str, b: str, change: bool = False, n_resamples: int = 10_000,
                window: Window | None = None) -> dict:
    """Per-seed difference arm a - arm b of ``metric`` over the end window (last 50 steps), or of its start -> end
    change (``change=True``), or over ``window``: mean over seeds, 95% t interval (BCa from 10 seeds), exact sign and
    permutation tests (unadjusted: exploratory)."""
    e = Endpoint(metric, window or (GAIN if change else END))
    vals = endpoint_values(runs, e)
    seeds, d = paired_differences(vals, a, b) if not vals.empty else ([], [])
    c = compare_exploratory([(a, b, e.label(), seeds, d)], n_resamples=n_resamples)[0]
    iv = c.bca if c.bca is not None else c.t
    return {"a": a, "b": b, "metric": metric, "endpoint": e, "n": c.n, "mean": c.mean, "lo": iv.low, "hi": iv.high,
            "interval": iv.method, "wins": c.sign.n_pos, "sign_p": c.sign.p, "perm_p": c.perm.p}


def undeclared(rows: list[dict], plan) -> tuple[list[dict], int]:
    """Rows of :func:`paired_diff` whose (endpoint, a, b) the plan does not declare, and how many were left out as
    declared (their verdicts are in the report's pre-registered section)."""
    if plan is None or not plan.declared:
        return rows, 0
    declared = {(e, c) for e in plan.endpoints for c in plan.comparisons}
    keep = [r for r in rows if (r["endpoint"], (r["a"], r["b"])) not in declared]
    return keep, len(rows) - len(keep)


def curves(runs, metric: str, smooth: int = 10) -> pd.DataFrame:
    """Mean over seeds per arm and step of a rolling mean per run (columns arm, step, value)."""
    m = runs.metrics[runs.metrics["metric"] == metric].sort_values(["run", "step"])
    if m.empty:
        return m
    m = m.assign(value=m.groupby("run")["value"].transform(lambda s: s.rolling(smooth, min_periods=1).mean()))
    return m.groupby(["arm", "step"], as_index=False)["value"].mean()

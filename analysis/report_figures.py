"""A report's figures (PNG, and PDF beside each) with their captions: learning curves, accuracy per difficulty
bucket, final score per arm, and the per-seed paired differences of the declared comparisons. Curves come from
analysis.stats, final scores and comparisons from the report's tables (analysis.report_stats); analysis.plots
draws them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import pandas as pd

from objbench.analysis.inference import MIN_BOOTSTRAP_N
from objbench.analysis.load import Runs
from objbench.analysis.plots import (ACC_LIM, MAX_COLUMNS, TRAINING_PANELS, Panel, arm_colors, metric_bounds,
                                    plot_final, plot_paired_differences, plot_panels, save_figure)
from objbench.analysis.report_metrics import bucket_keys
from objbench.analysis.report_stats import ReportNumbers, shared_start
from objbench.analysis.stats import CURVE_RESAMPLES, mean_ci_over_seeds
from objbench.analysis.tables import final_scores

__all__ = ["panel_curves", "save_figures"]

_BAND = f"95% CI band: t below {MIN_BOOTSTRAP_N} runs, BCa from {MIN_BOOTSTRAP_N}"


def panel_curves(runs: Runs, panels: Sequence[Panel] = TRAINING_PANELS, x: str = "step", smooth: int | None = None,
                 n_resamples: int = CURVE_RESAMPLES, seed: int = 0) -> list[tuple[str, str, pd.DataFrame | None]]:
    """Compute the curves of each panel: ``[(title, ylabel, curves or None), ...]`` for ``plot_panels``.

    The first logged key of each panel is used and named in its title; a panel with none is ``None``
    ("not logged").
    """
    out = []
    for p in panels:
        frame = runs.evals if p.source == "evals" else runs.metrics
        key = next((k for k in p.keys if (frame["metric"] == k).any()), None)
        if key is None:
            out.append((f"{p.title}\n({' / '.join(p.keys)})", p.ylabel, None))
            continue
        d = frame[frame["metric"] == key]
        curves = mean_ci_over_seeds(d, x=x, smooth=smooth, n_resamples=n_resamples, seed=seed)
        out.append((f"{p.title}\n({key})", p.ylabel, curves))
    return out


def save_figures(runs: Runs, num: ReportNumbers, out: Path, opts: dict) -> list[tuple[str, str]]:
    """Draw the report's figures into ``out``; returns ``[(file name, caption), ...]`` in report order (learning
    curves, difficulty buckets when logged, final score when any run has a final value, paired differences when
    comparisons were declared)."""
    colors = arm_colors(runs.arms)
    figures = [_curves_figure(runs, colors, out, opts)]
    diff = _difficulty_figure(runs, num, colors, out, opts)
    if diff is not None:
        figures.append(diff)
    final = _final_figure(runs, num, colors, out, opts)
    if final is not None:
        figures.append(final)
    paired = _paired_figure(runs, num, colors, out, opts)
    if paired is not None:
        figures.append(paired)
    return figures


def _smoothed(smooth: int | None) -> str:
    return f", smoothed (rolling mean of {smooth} points)" if smooth and smooth > 1 else ""


def _curves_figure(runs: Runs, colors, out: Path, opts: dict) -> tuple[str, str]:
    x, smooth, seed = opts["x"], opts["smooth"], opts["seed"]
    curves = panel_curves(runs, TRAINING_PANELS, x=x, smooth=smooth, seed=seed)
    fig, _ = plot_panels(curves, colors, x=x, ncols=MAX_COLUMNS,
                         title=f"{runs.sweep['name']}: learning curves per arm (mean over seeds, {_BAND}"
                               f"{_smoothed(smooth)})",
                         ylims=[p.ylim for p in TRAINING_PANELS],
                         markers=[p.source == "evals" for p in TRAINING_PANELS],
                         bounds=[metric_bounds(p.keys[0]) for p in TRAINING_PANELS])
    name = f"curves_{x}.png"
    save_figure(fig, out, name, opts["dpi"])
    return name, (f"Learning curves per arm: mean over seeds, shaded 95% CI over seeds (a t interval where "
                  f"fewer than {MIN_BOOTSTRAP_N} runs cover a point, BCa bootstrap from {MIN_BOOTSTRAP_N}; "
                  "no band where a single run covers that point; bands are clipped to the metric's range, "
                  f"0 to 1 for accuracies){_caption_smoothing(smooth)}")


def _caption_smoothing(smooth: int | None) -> str:
    if smooth and smooth > 1:
        return (f"; each run smoothed by a trailing rolling mean of {smooth} points before the mean over seeds "
                "(the tables use the raw values).")
    return "; not smoothed."


def _difficulty_rows(runs: Runs, num: ReportNumbers, opts: dict) -> list[list[tuple]]:
    """One row of panels per key family with difficulty buckets (greedy eval accuracy, the primary metric if it is
    another eval key with buckets, training accuracy): ``(title, ylabel, curves, markers, bounds)`` per bucket."""
    families = [("evals", "eval/acc", "eval accuracy")]
    if num.source == "evals" and num.primary != "eval/acc":
        families.append(("evals", num.primary, f"eval {num.primary.removeprefix('eval/')}"))
    families.append(("metrics", "reward/acc", "training accuracy"))
    rows: list[list[tuple]] = []
    for src, prefix, label in families:
        fr = runs.evals if src == "evals" else runs.metrics
        names = runs.eval_names if src == "evals" else runs.metric_names
        row = []
        for k in bucket_keys(names, prefix):
            c = mean_ci_over_seeds(fr[fr["metric"] == k], x=opts["x"], smooth=opts["smooth"], seed=opts["seed"])
            row.append((f"{label}, difficulty {k.rsplit('_d', 1)[1]}\n({k})", "accuracy (fraction)", c, src == "evals",
                        metric_bounds(k)))
        if row:
            rows.append(row)
    return rows


def _difficulty_figure(runs: Runs, num: ReportNumbers, colors, out: Path, opts: dict) -> tuple[str, str] | None:
    """Accuracy per difficulty bucket; rows padded so bucket k sits in the same column. None: no buckets logged."""
    rows = _difficulty_rows(runs, num, opts)
    if not rows:
        return None
    x = opts["x"]
    ncols = min(MAX_COLUMNS, max(len(r) for r in rows))
    cells = [c for r in rows for c in r + [None] * (-len(r) % ncols)]  # each family starts a row
    fig, _ = plot_panels([c[:3] if c else None for c in cells], colors, x=x, ncols=ncols,
                         title=f"{runs.sweep['name']}: accuracy per difficulty bucket (mean over seeds, {_BAND}"
                               f"{_smoothed(opts['smooth'])})",
                         ylims=[ACC_LIM] * len(cells), markers=[bool(c and c[3]) for c in cells],
                         bounds=[c[4] if c else None for c in cells])
    name = f"difficulty_{x}.png"
    save_figure(fig, out, name, opts["dpi"])
    return name, "Accuracy per difficulty bucket (d1 = easiest)" + _caption_smoothing(opts["smooth"])


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_")


def _is_fraction(key: str) -> bool:
    """Accuracy-like keys (acc, acc_d2, pass@4, pass@1_d3): values are fractions in [0, 1]."""
    name = key.rsplit("/", 1)[-1]
    return bool(re.fullmatch(r"(acc|pass@\d+)(_d\d+)?", name))


def _final_figure(runs: Runs, num: ReportNumbers, colors, out: Path, opts: dict) -> tuple[str, str] | None:
    """Final primary metric per arm: mean, 95% CI, one dot per seed. None: no run has a final value."""
    primary, frame = num.primary, num.frame
    fs = final_scores(frame, primary, opts["last_k"])
    if fs.empty:
        return None
    ft = num.final.data
    summ = ft[ft["metric"] == primary]
    xlabel = f"final {primary}" + (" (accuracy, fraction)" if _is_fraction(primary) else "")
    start = shared_start(frame, primary)
    ref = (start, f"start policy (step 0): {start:.3f}, mean over seeds") if start is not None else None
    methods = sorted(set(summ["interval"]) - {"none"})
    fig, _ = plot_final(fs, summ, colors, xlabel=xlabel, reference=ref, bounds=metric_bounds(primary),
                        title=f"{runs.sweep['name']}: final {primary} per arm\n(bar: 95% CI of the mean, "
                              f"{' / '.join(methods) or 'none'}; tick: mean; dots: seeds)")
    name = f"final_{_slug(primary)}.png"
    save_figure(fig, out, name, opts["dpi"])
    return name, (f"Final {primary} per arm ({num.final_def})"
                  + ("; bars clipped to the metric's range" if metric_bounds(primary) else "")
                  + ("; dashed line: the shared start policy (step 0), mean over seeds." if ref else "."))


def _paired_figure(runs: Runs, num: ReportNumbers, colors, out: Path, opts: dict) -> tuple[str, str] | None:
    """The declared comparisons' per-seed differences and intervals, one panel per endpoint. None: nothing
    declared."""
    table = num.comparisons.declared_table.data
    if table.empty:
        return None
    conf = 100 * float(table["adj_confidence"].iloc[0])
    fig, _ = plot_paired_differences(table, colors, title=f"{runs.sweep['name']}: declared comparisons, a - b per "
                                                          "seed")
    name = "paired_differences.png"
    save_figure(fig, out, name, opts["dpi"])
    return name, (f"Declared comparisons: each dot is one seed's difference a - b (same seed = same warm start and "
                  f"prompts); thin black bar: 95% t interval of the mean; thick bar: the family-adjusted {conf:.4g}% "
                  "t interval the verdict uses; tick: mean; dashed line: no difference.")

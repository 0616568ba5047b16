"""Figures. Every function here only draws numbers computed elsewhere (analysis.stats, analysis.report) and
returns ``(fig, ax)`` or ``(fig, axes)``.

- Colours and line styles: one colour per arm, fixed by the arm order of the sweep (``arm_colors``), so an arm has
  the same colour in every figure of a report, also when some arm has no runs; lines also cycle through four
  dash styles in that order (``LINE_STYLES``), so arms stay apart in greyscale and for colour-blind readers.
- Layout: grids of at most :data:`MAX_COLUMNS` columns of panels :data:`PANEL_SIZE` inches each, so a panel stays
  readable printed 3.3 inches wide; ``save_figure`` writes a PDF next to every PNG.
- Figures are built with ``matplotlib.figure.Figure`` and never through ``pyplot``: they render with the Agg
  (PNG) canvas whatever backend the session uses, need no display, do not switch a notebook's backend, and are
  not kept alive by pyplot's figure manager (no leak over many calls). ``fig.savefig(path)`` writes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, MaxNLocator
from matplotlib.transforms import ScaledTranslation

__all__ = [
    "MAX_COLUMNS",
    "PANEL_SIZE",
    "LINE_STYLES",
    "save_figure",
    "grid_figure",
    "plot_paired_differences",
    "Panel",
    "TRAINING_PANELS",
    "X_LABELS",
    "arm_colors",
    "draw_curves",
    "plot_curves",
    "plot_panels",
    "plot_final",
    "ScorePanel",
    "plot_score_panels",
]

X_LABELS = {"step": "training step", "tokens": "generated tokens"}
"""Axis label (with unit) for each x column."""
MAX_COLUMNS = 3
"""Most panels side by side in a grid figure."""
PANEL_SIZE = (3.3, 2.4)
"""Width and height of one grid panel, inches (a journal column is about 3.3 inches)."""
LINE_STYLES = ("-", "--", "-.", ":")
"""Dash styles the arms cycle through, in arm order."""


def save_figure(fig, out_dir, name: str, dpi: int) -> None:
    """Write ``fig`` as ``name`` (a .png) and as the same name with .pdf (vector, for papers), both byte-identical
    from run to run (the PDF without its creation date)."""
    from pathlib import Path

    path = Path(out_dir) / name
    fig.savefig(path, dpi=dpi)
    fig.savefig(path.with_suffix(".pdf"), metadata={"CreationDate": None})


@dataclass(frozen=True)
class Panel:
    """One learning-curve panel: the first of ``keys`` that was logged is drawn.

    Attributes:
        title: panel title (the metric key actually drawn is appended).
        keys: candidate metric keys, in order of preference (e.g. exact KL, else the k3 estimate).
        ylabel: y-axis label with unit.
        source: ``"metrics"`` (metrics.jsonl, every step) or ``"evals"`` (eval.jsonl).
        ylim: fixed y limits, or None for automatic.
    """

    title: str
    keys: tuple[str, ...]
    ylabel: str
    source: str = "metrics"
    ylim: tuple[float, float] | None = None


ACC_LIM = (-0.02, 1.02)
TRAINING_PANELS: tuple[Panel, ...] = (
    Panel("training reward accuracy", ("reward/acc",), "accuracy (fraction)", ylim=ACC_LIM),
    Panel("eval accuracy (held-out, greedy)", ("eval/acc",), "accuracy (fraction)", "evals", ACC_LIM),
    Panel("eval pass@1 (held-out, sampled)", ("eval/pass@1",), "accuracy (fraction)", "evals", ACC_LIM),
    Panel("length of correct responses", ("length/correct",), "length (tokens)"),
    Panel("length of incorrect responses", ("length/incorrect",), "length (tokens)"),
    Panel("policy entropy", ("policy/entropy",), "entropy (nats/token)"),
    Panel("KL to reference", ("kl/exact", "kl/k3", "kl/k1", "kl/k2"), "KL (nats/token)"),
    Panel("clipped tokens, ratio < 1 - eps_low", ("policy/clipfrac_low",), "fraction of tokens"),
    Panel("clipped tokens, ratio > 1 + eps_high", ("policy/clipfrac_high",), "fraction of tokens"),
    Panel("groups with zero reward variance", ("rollout/zero_var_frac", "adv/zero_var_frac"), "fraction of groups"),
)
"""The default learning-curve panels of the report."""


def arm_colors(arms: Sequence[str]) -> dict[str, tuple]:
    """Fixed colour per arm from its position in ``arms`` (the sweep's arm order): tab10, or tab20 beyond 10."""
    cmap = matplotlib.colormaps["tab10" if len(arms) <= 10 else "tab20"]
    return {a: cmap(i % cmap.N) for i, a in enumerate(arms)}


def _legend_label(arm: str, n: int | None) -> str:
    return f"{arm} (n={n})" if n is not None else arm


UNIT = (0.0, 1.0)       # fractions
NONNEG = (0.0, None)    # lengths, entropies


NONNEG_KL = ("kl/exact", "kl/exact_fwd", "kl/k2", "kl/k3")  # exact KL, 0.5 log(r)^2, r - 1 - log r: never negative


SIGNED_SUFFIXES = ("_gap", "_diff", "_delta", "_change")
"""Metric names ending so are differences (length/filler_gap = wrong minus right): signed, never clipped."""


def metric_bounds(metric: str) -> tuple[float | None, float | None] | None:
    """The range a logged metric can take, where the name tells: accuracies, pass@k and fractions [0, 1]; lengths,
    entropies, the exact KL and the k2 / k3 estimates >= 0; None otherwise (k1, which can be negative, a loss, an
    advantage, and any difference: a name ending in one of ``SIGNED_SUFFIXES``, whatever its prefix). Figures clip
    CI bands and bars to it: a t interval over a few seeds can reach past it (accuracy above 1, a KL below 0)."""
    if metric.endswith(SIGNED_SUFFIXES):
        return None
    if metric.startswith(("eval/acc", "eval/pass@", "reward/acc", "adv/weight_share")) or metric.endswith(
            ("_frac", "clipfrac_low", "clipfrac_high")):
        return UNIT
    if metric.startswith(("length/", "eval/length", "policy/entropy")) or metric in NONNEG_KL:
        return NONNEG
    return None


def draw_curves(ax, curves: pd.DataFrame, colors: Mapping[str, tuple], x: str = "step", by: str = "arm",
                markers: bool = False, band_alpha: float | None = None,
                bounds: tuple[float | None, float | None] | None = None) -> dict:
    """Draw mean lines and CI bands on ``ax``; returns ``{group: (line handle, max n)}``.

    Data contract: ``curves`` has columns ``[by, x, "mean", "low", "high", "n"]`` (the output of
    ``analysis.stats.mean_ci_over_seeds``); groups are drawn in the order of ``colors`` with the dash style of
    their position there, groups missing from ``colors`` after them in grey. Bands are drawn where n >= 2, clipped
    to ``bounds`` (the metric's range); ``band_alpha`` None: 0.2 for up to 3 groups, 0.1 for more.
    """
    handles = {}
    groups = [g for g in colors if g in set(curves[by])] + [g for g in pd.unique(curves[by]) if g not in colors]
    style = {g: LINE_STYLES[i % len(LINE_STYLES)] for i, g in enumerate(colors)}
    if band_alpha is None:  # many overlapping bands hide each other: lighter ones
        band_alpha = 0.2 if len(groups) <= 3 else 0.1
    for g in groups:
        c = curves[curves[by] == g].sort_values(x)
        color = colors.get(g, (0.5, 0.5, 0.5, 1.0))
        (line,) = ax.plot(c[x], c["mean"], color=color, lw=1.4, ls=style.get(g, "-"),
                          marker="o" if markers else None, ms=3, label=_legend_label(str(g), int(c["n"].max())))
        band = c[c["n"] >= 2]
        if not band.empty:
            lo, hi = band["low"], band["high"]
            if bounds is not None:
                lo, hi = lo.clip(lower=bounds[0], upper=bounds[1]), hi.clip(lower=bounds[0], upper=bounds[1])
            ax.fill_between(band[x], lo, hi, color=color, alpha=band_alpha, lw=0)
        handles[g] = (line, int(c["n"].max()))
    return handles


def _style_x(ax, x: str) -> None:
    ax.set_xlabel(X_LABELS.get(x, x))
    if x == "tokens":
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.grid(True, alpha=0.3)


def plot_curves(curves: pd.DataFrame, colors: Mapping[str, tuple], x: str = "step", ylabel: str = "",
                title: str = "", by: str = "arm", ax=None, markers: bool = False):
    """One learning-curve panel (mean over seeds and CI band per arm). Returns ``(fig, ax)``.

    Data contract: as :func:`draw_curves`.
    """
    if ax is None:
        fig = Figure(figsize=(5.5, 3.8), layout="constrained")
        ax = fig.subplots()
    else:
        fig = ax.figure
    draw_curves(ax, curves, colors, x=x, by=by, markers=markers)
    _style_x(ax, x)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small", frameon=False)
    return fig, ax


def _not_logged(ax, title: str) -> None:
    ax.set_title(title, fontsize="medium", y=1.0)
    ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="0.45",
            fontsize="large")
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_color("0.8")


def plot_panels(panels: Sequence[tuple[str, str, pd.DataFrame | None] | None], colors: Mapping[str, tuple],
                x: str = "step", ncols: int = MAX_COLUMNS, title: str = "", by: str = "arm",
                ylims: Sequence[tuple[float, float] | None] | None = None, markers: Sequence[bool] | None = None,
                panel_size: tuple[float, float] = PANEL_SIZE, sharey: bool = False,
                bounds: Sequence[tuple[float | None, float | None] | None] | None = None):
    """A grid of learning-curve panels (at most :data:`MAX_COLUMNS` columns) with one legend for the figure.
    Returns ``(fig, axes)`` (axes 2-D).

    Args:
        panels: ``(title, ylabel, curves)`` per panel; ``curves`` as in :func:`draw_curves`, or None / empty for
            a metric that was not logged (the panel then says "not logged"). A panel that is None leaves its grid
            cell empty (to start a new row).
        colors: arm -> colour (:func:`arm_colors`); fixes the drawing and legend order.
        x: x column (``"step"`` or ``"tokens"``), which also picks the x label.
        ylims: optional fixed y limits per panel.
        markers: optional per panel: mark each point (for sparse eval curves).
        bounds: optional per panel: the metric's range, to which the CI bands are clipped.
    """
    n = len(panels)
    if n == 0:
        raise ValueError("plot_panels: no panels")
    ncols = max(1, min(ncols, n, MAX_COLUMNS))
    nrows = -(-n // ncols)
    per_row = legend_per_row(colors, ncols * panel_size[0])
    legend_rows = max(1, -(-len(colors) // per_row))  # room below the panels for every legend row
    title, title_lines = wrap_title(title, grid_width(ncols, panel_size[0]), LARGE_CHAR_IN)
    fig, axes = grid_figure(nrows, ncols, panel_size, top_in=0.95 + 0.22 * (title_lines - 1) if title else 0.55,
                             bottom_in=0.95 + 0.28 * (legend_rows - 1), sharey=sharey)
    seen: dict[str, tuple] = {}  # arm -> (handle, largest n in any panel)
    for i, panel in enumerate(panels):
        ax = axes.flat[i]
        if panel is None:
            ax.set_visible(False)
            continue
        ptitle, ylabel, curves = panel
        if curves is None or len(curves) == 0:
            _not_logged(ax, ptitle)
            continue
        drawn = draw_curves(ax, curves, colors, x=x, by=by, markers=bool(markers and markers[i]),
                            bounds=bounds[i] if bounds else None)
        for g, (h, n_g) in drawn.items():
            seen[g] = (seen.get(g, (h, 0))[0], max(n_g, seen.get(g, (h, 0))[1]))
        _style_x(ax, x)
        ax.set_ylabel(ylabel)
        ax.set_title(ptitle, fontsize="small", y=1.0)  # fixed y: skips the auto-placement pass (no top ticks)
        if ylims and ylims[i] is not None:
            ax.set_ylim(*ylims[i])
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize="large", y=1 - 0.12 / fig.get_figheight(), va="top")
    if seen:
        # one legend for the whole figure, below the panels, one entry per arm in colour order
        order = [g for g in colors if g in seen] + [g for g in seen if g not in colors]
        fig.legend([seen[g][0] for g in order], [_legend_label(str(g), seen[g][1]) for g in order],
                   loc="lower center", bbox_to_anchor=(0.5, 0.0), ncols=min(len(order), per_row), frameon=False,
                   fontsize="medium")
    return fig, axes


def legend_per_row(arms, width_in: float) -> int:
    """Legend entries that fit in a row of a figure ``width_in`` inches wide (at most 6): each entry is a colour
    patch and "<arm> (n=NN)" in the medium font, about 0.085 in per character plus 0.6 in."""
    longest = max((len(str(a)) for a in arms), default=0) + len(" (n=10)")
    return max(1, min(6, int(width_in // (0.6 + 0.085 * longest))))


LARGE_CHAR_IN = 0.095  # width of a character of a "large" (12 pt) title, inches: a typical title measured 0.086
MEDIUM_CHAR_IN = 0.08  # the same at "medium" (10 pt), measured 0.072; both ~10% above, for wide letters


def wrap_title(title: str, width_in: float, char_in: float) -> tuple[str, int]:
    """(title broken into lines that fit ``width_in`` inches at ``char_in`` inches per character, line count): a
    figure one panel wide otherwise cuts a long title off at both edges."""
    import textwrap

    if not title:
        return title, 0
    lines = textwrap.wrap(title, max(20, int((width_in - 0.2) / char_in)), break_on_hyphens=False)
    return "\n".join(lines), len(lines)


def grid_width(ncols: int, panel_width: float, left: float = 0.85, wgap: float = 0.95) -> float:
    """Width in inches of :func:`grid_figure`'s figure (0.25 in right margin)."""
    return left + 0.25 + ncols * panel_width + (ncols - 1) * wgap


def grid_figure(nrows: int, ncols: int, panel_size: tuple[float, float], top_in: float, bottom_in: float,
                 sharey: bool = False, left: float = 0.85, wgap: float = 0.95, hgap: float = 1.05):
    """Figure with a grid of axes and fixed margins in inches (room for y labels, two-line titles, x labels and a
    legend row below; ``left``, ``wgap``, ``hgap``: the left margin and the gaps between panels). Fixed margins
    instead of a layout engine: constrained layout measures every tick label and made saving a 9-panel figure
    about 3x slower."""
    right = 0.25  # inches
    pw, ph = panel_size
    width = grid_width(ncols, pw, left, wgap)
    height = top_in + bottom_in + nrows * ph + (nrows - 1) * hgap
    fig = Figure(figsize=(width, height))
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey)
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom_in / height,
                        top=1 - top_in / height, wspace=wgap / pw, hspace=hgap / ph)
    return fig, axes


def plot_final(per_run: pd.DataFrame, summary: pd.DataFrame, colors: Mapping[str, tuple], xlabel: str,
               title: str = "", by: str = "arm", ax=None, xlim: tuple[float, float] | None = None,
               reference: tuple[float, str] | None = None,
               bounds: tuple[float | None, float | None] | None = None):
    """Final score per arm: mean with its CI as a bar, one dot per run (seed). Returns ``(fig, ax)``.

    ``bounds``: the metric's range; the CI bar is clipped to it (see :func:`metric_bounds`).

    ``reference``: optional ``(value, label)`` drawn as a dashed grey vertical line with a legend entry (e.g. the
    start policy's score).

    Data contract:
        ``per_run``: columns ``[by, "value"]``, one row per run (the final score of that run).
        ``summary``: columns ``[by, "mean", "ci_low", "ci_high"]``, one row per arm.
        Arms are drawn top to bottom in the order of ``colors``.
    """
    arms = [a for a in colors if a in set(summary[by])]
    if ax is None:
        fig = Figure(figsize=(6.4, 0.45 * len(arms) + 1.5), layout="constrained")
        ax = fig.subplots()
    else:
        fig = ax.figure
    for i, arm in enumerate(arms):
        y = len(arms) - 1 - i
        row = summary[summary[by] == arm].iloc[0]
        color = colors[arm]
        lo, hi = row["ci_low"], row["ci_high"]
        if bounds is not None:
            lo, hi = (float(np.clip(v, bounds[0], bounds[1])) for v in (lo, hi))
        if np.isfinite(lo) and np.isfinite(hi):
            ax.plot([lo, hi], [y, y], color=color, lw=11, alpha=0.4, solid_capstyle="butt")
        ax.plot([row["mean"]], [y], marker="|", ms=20, mew=3, color=color)
        vals = per_run.loc[per_run[by] == arm, "value"].to_numpy(dtype=float)
        jitter = np.linspace(-0.2, 0.2, len(vals)) if len(vals) > 1 else np.zeros(len(vals))
        ax.scatter(vals, y + jitter, s=16, color=color, edgecolor="black", linewidth=0.4, zorder=3)
    ax.set_yticks(range(len(arms)), [f"{a} (n={(per_run[by] == a).sum()})" for a in reversed(arms)])
    ax.set_ylim(-0.6, len(arms) - 0.4)
    if reference is not None:
        ax.axvline(reference[0], color="0.35", ls="--", lw=1.2, zorder=1, label=reference[1])
        below_xlabel = ax.transAxes + ScaledTranslation(0, -0.48, fig.dpi_scale_trans)  # 0.48 in under the axes
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=below_xlabel, frameon=False,
                  fontsize="small")
    ax.margins(x=0.08)
    ax.set_xlabel(xlabel)
    if xlim is not None:
        ax.set_xlim(*xlim)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title, fontsize="medium")
    return fig, ax


def plot_paired_differences(table: pd.DataFrame, colors: Mapping[str, tuple], title: str = ""):
    """The per-seed paired differences of declared comparisons: one panel per endpoint (at most
    :data:`MAX_COLUMNS` columns), one row per comparison a - b: a dot per seed, a thin black bar for the 95%
    interval, a thick one for the family-adjusted interval, a tick at the mean, a dashed line at 0. Returns
    ``(fig, axes)``.

    Data contract: ``table`` has the columns of ``analysis.report_stats.comparison_table(declared=True)``: a,
    comparison, endpoint, d (space-separated per-seed differences), mean, t_low, t_high, t_adj_low, t_adj_high.
    The adjusted interval drawn is the t one (the BCa one is in the tables). Every endpoint has the same
    comparisons (the declared family is endpoints x pairs), so their names label the first column only; rows keep
    the table's order, top to bottom; dots take arm a's colour."""
    endpoints = list(pd.unique(table["endpoint"]))
    names = list(pd.unique(table["comparison"]))
    ncols = min(MAX_COLUMNS, len(endpoints))
    nrows = -(-len(endpoints) // ncols)
    left = 0.25 + 0.068 * max(len(n) for n in names)
    title, title_lines = wrap_title(title, grid_width(ncols, PANEL_SIZE[0], left, 0.35), MEDIUM_CHAR_IN)
    fig, axes = grid_figure(nrows, ncols, (PANEL_SIZE[0], 0.4 * len(names) + 0.5),
                             top_in=0.7 + 0.18 * (title_lines - 1) if title else 0.4, bottom_in=0.6, left=left,
                             wgap=0.35, hgap=0.95)
    for i, (ax, endpoint) in enumerate(zip(axes.flat, endpoints)):
        rows = table[table["endpoint"] == endpoint].set_index("comparison").reindex(names).reset_index()
        _draw_paired(ax, rows, colors, labels=i % ncols == 0)
        ax.set_title(endpoint, fontsize="small", y=1.0)
    for ax in axes.flat[len(endpoints):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize="medium", y=1 - 0.1 / fig.get_figheight(), va="top")
    return fig, axes


def _draw_paired(ax, rows: pd.DataFrame, colors: Mapping[str, tuple], labels: bool) -> None:
    k = len(rows)
    for i, r in enumerate(rows.itertuples(index=False)):
        y = k - 1 - i
        color = colors.get(r.a, (0.3, 0.3, 0.3, 1.0))
        d = np.array([float(v) for v in r.d.split()]) if isinstance(r.d, str) else np.array([])
        if np.isfinite(r.t_adj_low) and np.isfinite(r.t_adj_high):
            ax.plot([r.t_adj_low, r.t_adj_high], [y, y], color=color, lw=7, alpha=0.35, solid_capstyle="butt")
        if np.isfinite(r.t_low) and np.isfinite(r.t_high):
            ax.plot([r.t_low, r.t_high], [y, y], color="black", lw=1.2)
        if np.isfinite(r.mean):
            ax.plot([r.mean], [y], marker="|", ms=14, mew=2.5, color="black")
        if d.size:
            jitter = np.linspace(-0.18, 0.18, d.size) if d.size > 1 else np.zeros(1)
            ax.scatter(d, y + jitter, s=12, color=color, edgecolor="black", linewidth=0.3, zorder=3)
    ax.axvline(0.0, color="0.4", ls="--", lw=1)
    ax.set_yticks(range(k), list(reversed(list(rows["comparison"]))) if labels else [""] * k, fontsize="small")
    ax.set_ylim(-0.6, k - 0.4)
    ax.set_xlabel("a - b, per seed", fontsize="small")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # long tick labels (-0.00125) must not run together
    ax.tick_params(axis="x", labelsize="small")
    ax.grid(True, axis="x", alpha=0.3)


@dataclass(frozen=True)
class ScorePanel:
    """One panel of a score grid (the score card's figure): one measure, a row per card.

    Attributes:
        title: the panel's title.
        rows: ``(label, row)`` per card, top to bottom; ``row`` a mapping with ``score``, ``low`` and ``high`` (the
            95% interval), or None where that card lacks the measure. The first row is the card under test.
        signed: the measure is signed (a paired difference, a change): a dotted line at 0.
        muted: the title in grey (the measure's controls did not separate).
    """

    title: str
    rows: list
    signed: bool = False
    muted: bool = False


def plot_score_panels(panels: Sequence[ScorePanel], labels: Sequence[str], colors: Mapping[str, tuple],
                      title: str = "") -> Figure:
    """A grid of :class:`ScorePanel` (at most :data:`MAX_COLUMNS` across, :data:`PANEL_SIZE` inches each; fixed
    margins from :func:`grid_figure`, the left one wide enough for the longest of ``labels``, the row labels, which
    only the first column shows). The first row of each panel is black and larger, every other row takes its label's
    colour in ``colors``; each row a dot at the score and a bar over its interval."""
    ncols = min(MAX_COLUMNS, max(1, len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    label_chars = max(len(label) for label in labels)
    fig, axes = grid_figure(nrows, ncols, PANEL_SIZE, top_in=0.75 if title else 0.5, bottom_in=0.4,
                            left=0.25 + 0.068 * label_chars, wgap=0.35, hgap=0.9)
    for k, ax in enumerate(axes.flat):
        if k >= len(panels):
            ax.set_visible(False)
            continue
        panel = panels[k]
        _draw_score_rows(ax, panel.rows, colors, k % ncols == 0, panel.signed)
        ax.set_title(panel.title, fontsize=8, color="0.45" if panel.muted else "black")
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.1 / fig.get_figheight(), va="top")
    return fig


def _draw_score_rows(ax, rows, colors, first_column: bool, signed: bool) -> None:
    n = len(rows)
    if all(row is None or not math.isfinite(row["score"]) for _, row in rows):
        ax.text(0.5, 0.5, "not measured\n(no seed has a value)", transform=ax.transAxes, ha="center", va="center",
                fontsize=8, color="0.4")
    for i, (label, row) in enumerate(rows):
        y = n - 1 - i
        if row is None or not math.isfinite(row["score"]):
            continue
        color = "black" if i == 0 else colors[label]
        lo, hi = row["low"], row["high"]
        if math.isfinite(lo) and math.isfinite(hi):
            ax.plot([lo, hi], [y, y], color=color, lw=2.2 if i == 0 else 1.4, solid_capstyle="butt")
        ax.plot([row["score"]], [y], marker="o" if i == 0 else "D", ms=6 if i == 0 else 4.5, color=color)
    if signed:
        ax.axvline(0.0, color="0.5", lw=0.8, ls=":")
    ax.set_yticks(np.arange(n))
    ax.set_yticklabels([lab for lab, _ in rows][::-1] if first_column else [])
    ax.set_ylim(-0.6, n - 0.4)
    ax.grid(axis="x", alpha=0.3)
    ax.tick_params(labelsize=7)

"""The score card's figure: one panel per measure, the objective under test on the top row (black, with its 95%
interval), each reference card on a row of its own below (its colour, its interval), the same rows in every panel,
so a reader scans down a column to compare objectives on one diagnostic. Signed measures (paired differences,
changes) get a dotted line at 0."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from objbench.analysis.plots import MAX_COLUMNS, PANEL_SIZE, arm_colors, grid_figure


def _rows(table: pd.DataFrame, refs: Mapping[str, pd.DataFrame], name: str) -> list[tuple[str, pd.Series | None]]:
    """(label, row) for the card and each reference, for one measure (None where a reference lacks it)."""
    out = [("this card", table.set_index("name").loc[name])]
    for ref, r in refs.items():
        r = r.set_index("name")
        out.append((ref, r.loc[name] if name in r.index else None))
    return out


def _draw_panel(ax, rows, colors, first_column: bool, signed: bool) -> None:
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


def plot_card(table: pd.DataFrame, refs: Mapping[str, pd.DataFrame], title: str = "",
              unvalidated: set[str] = frozenset()) -> Figure:
    """The card's grid (at most MAX_COLUMNS panels across, PANEL_SIZE inches each; analysis.plots.grid_figure's
    fixed margins, the left one wide enough for the row labels). Measures in ``unvalidated`` (their controls did
    not separate in the battery's validation) say so in their panel's title."""
    names = list(table["name"])
    ncols = min(MAX_COLUMNS, max(1, len(names)))
    nrows = math.ceil(len(names) / ncols)
    colors = arm_colors(list(refs))
    label_chars = max(len(label) for label in ["this card", *refs])
    fig, axes = grid_figure(nrows, ncols, PANEL_SIZE, top_in=0.75 if title else 0.5, bottom_in=0.4,
                            left=0.25 + 0.068 * label_chars, wgap=0.35, hgap=0.9)
    by_name = table.set_index("name")
    for k, ax in enumerate(axes.flat):
        if k >= len(names):
            ax.set_visible(False)
            continue
        name = names[k]
        row = by_name.loc[name]
        _draw_panel(ax, _rows(table, refs, name), colors, k % ncols == 0, bool(row["signed"]))
        mark = "\n(controls not separated)" if name in unvalidated else ""
        ax.set_title(f"{row['diagnostic']}: {name}{mark}", fontsize=8, color="0.45" if mark else "black")
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.1 / fig.get_figheight(), va="top")
    return fig

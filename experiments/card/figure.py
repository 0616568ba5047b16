"""The score card's figure: one panel per measure, the objective under test on the top row (black, with its 95%
interval), each reference card on a row of its own below (its colour, its interval), the same rows in every panel,
so a reader scans down a column to compare objectives on one diagnostic. Signed measures (paired differences,
changes) get a dotted line at 0. This module picks the rows from the card tables; analysis.plots draws them
(``plot_score_panels``)."""

from __future__ import annotations

from typing import Mapping

import pandas as pd

from objbench.analysis.plots import ScorePanel, arm_colors, plot_score_panels


def _rows(table: pd.DataFrame, refs: Mapping[str, pd.DataFrame], name: str) -> list[tuple[str, pd.Series | None]]:
    """(label, row) for the card and each reference, for one measure (None where a reference lacks it)."""
    out = [("this card", table.set_index("name").loc[name])]
    for ref, r in refs.items():
        r = r.set_index("name")
        out.append((ref, r.loc[name] if name in r.index else None))
    return out


def plot_card(table: pd.DataFrame, refs: Mapping[str, pd.DataFrame], title: str = "",
              unvalidated: set[str] = frozenset()):
    """The card's grid (analysis.plots.plot_score_panels: at most MAX_COLUMNS panels across, PANEL_SIZE inches
    each), a matplotlib Figure. Measures in ``unvalidated`` (their controls did not separate in the battery's
    validation) say so in their panel's title."""
    by_name = table.set_index("name")
    panels = []
    for name in table["name"]:
        row = by_name.loc[name]
        mark = "\n(controls not separated)" if name in unvalidated else ""
        panels.append(ScorePanel(f"{row['diagnostic']}: {name}{mark}", _rows(table, refs, name),
                                 signed=bool(row["signed"]), muted=bool(mark)))
    return plot_score_panels(panels, ["this card", *refs], arm_colors(list(refs)), title)

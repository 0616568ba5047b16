"""Scoring the card's control pairs (issue 32 item 2): per measure, the per-seed difference between the configuration
expected higher and the one expected lower, its 95% t interval and exact sign-flip permutation p over all seeds, and
the same interval over the card's own seed count. A measure is validated when the all-seeds interval lies above 0.

The validation sweep names its arms ``<battery arm>__<config label>``; a measure's terms are read from the arms of
its two configurations (analysis.card.seed_values on a copy of the measure with its arms renamed).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import pandas as pd

from objbench.analysis.inference import permutation_test, t_interval
from objbench.experiments.card.measures import Measure, format_score, seed_values

VALIDATION_COLUMNS = ["measure", "diagnostic", "low", "high", "low_mean", "high_mean", "difference", "ci_low",
                      "ci_high", "p_permutation", "seeds", "validated", "card_seeds", "card_ci_low", "card_ci_high",
                      "card_separates"]


def arm_name(arm: str, label: str) -> str:
    return f"{arm}__{label}"


def for_config(m: Measure, label: str) -> Measure:
    """``m`` reading the arms of configuration ``label``."""
    term = dataclasses.replace(m.term, arm=arm_name(m.term.arm, label))
    minus = None if m.minus is None else dataclasses.replace(m.minus, arm=arm_name(m.minus.arm, label))
    return dataclasses.replace(m, term=term, minus=minus)


def control_row(runs, m: Measure, low: str, high: str, card_seeds: int) -> dict:
    lo, hi = seed_values(runs, for_config(m, low)), seed_values(runs, for_config(m, high))
    seeds = lo.index.intersection(hi.index)
    d = (hi.loc[seeds] - lo.loc[seeds]).sort_index()
    iv = t_interval(d.to_numpy())
    first = d[d.index.isin(sorted(seeds)[:card_seeds])]
    card_iv = t_interval(first.to_numpy())
    p = permutation_test(d.to_numpy()).p if len(d) else float("nan")
    return {"measure": m.name, "diagnostic": m.diagnostic, "low": low, "high": high,
            "low_mean": float(lo.loc[seeds].mean()) if len(seeds) else math.nan,
            "high_mean": float(hi.loc[seeds].mean()) if len(seeds) else math.nan,
            "difference": iv.point, "ci_low": iv.low, "ci_high": iv.high, "p_permutation": p, "seeds": iv.n,
            "validated": bool(math.isfinite(iv.low) and iv.low > 0), "card_seeds": card_iv.n,
            "card_ci_low": card_iv.low, "card_ci_high": card_iv.high,
            "card_separates": bool(math.isfinite(card_iv.low) and card_iv.low > 0)}


def score_controls(runs, measures: Sequence[Measure], controls: Sequence[dict], card_seeds: int) -> pd.DataFrame:
    by_name = {m.name: m for m in measures}
    rows = [control_row(runs, by_name[c["measure"]], c["low"], c["high"], card_seeds) for c in controls]
    return pd.DataFrame(rows, columns=VALIDATION_COLUMNS)


def render_validation(table: pd.DataFrame, provenance: Sequence[str], card_seeds: int) -> str:
    f = format_score
    ok = int(table["validated"].sum())
    diags = table.groupby("diagnostic")["validated"].any()
    lines = ["# Card battery validation", "", *provenance, "",
             f"{ok} of {len(table)} measures separate their controls over all seeds (95% t interval of high - low "
             f"above 0); {int(diags.sum())} of {len(diags)} diagnostics have at least one validated measure. "
             f"Separation at the card's {card_seeds} seeds: {int(table['card_separates'].sum())} of {len(table)}.",
             "", "| diagnostic | measure | expected low | expected high | low mean | high mean | high - low "
             "[95% t] | permutation p | seeds | validated | first "
             f"{card_seeds} seeds [95% t] |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {r['diagnostic']} | {r['measure']} | {r['low']} | {r['high']} | {f(r['low_mean'])} | "
                     f"{f(r['high_mean'])} | {f(r['difference'])} [{f(r['ci_low'])}, {f(r['ci_high'])}] | "
                     f"{f(r['p_permutation'])} | {r['seeds']} | {'yes' if r['validated'] else '**no**'} | "
                     f"[{f(r['card_ci_low'])}, {f(r['card_ci_high'])}]"
                     f"{'' if r['card_separates'] else ' (not separated)'} |")
    return "\n".join(lines) + "\n"

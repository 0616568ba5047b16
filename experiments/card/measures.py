"""The score card's numbers (issue 32): one value per seed for each declared measure, then its mean and 95% t interval.

A measure is declared in the battery file (experiments/cards/battery.yaml) before any card is made::

    - name: stale4_loss                    # a column name of card.csv
      diagnostic: off-policy robustness    # the panel group it belongs to
      arm: standard                        # the battery arm whose runs it reads
      metric: eval/pass@1
      window: auc                          # analysis.prereg windows: final, auc, {last: K}, {steps: [lo, hi]}, ...
      minus: {arm: stale4}                 # optional: minus another term of the same seed (arm, metric, window
                                           #   default to the measure's own), i.e. a per-seed paired difference
      unit: held-out pass@1 (mean height over the run)
      high: what a high value means, in words

Each seed gives one value (the term, or the term minus its ``minus`` term, both from the runs of that seed); the
score is the mean over seeds with a Student t interval (analysis.inference.t_interval, 95%): a t interval because a
card has few seeds (a percentile bootstrap is never used below 10). A seed missing either term is left out and the
card says how many seeds each score has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from objbench.analysis.inference import t_interval
from objbench.analysis.prereg import Window, parse_window, per_run_values, schedule_ends

CARD_COLUMNS = ["name", "diagnostic", "score", "low", "high", "seeds", "unit", "high_means", "signed"]
"""The columns of card.csv, in order (``signed``: a difference or a change, whose sign is its meaning)."""


@dataclass(frozen=True)
class Term:
    """One number per run: ``metric`` over ``window`` in the runs of ``arm``."""

    arm: str
    metric: str
    window: Window

    def label(self) -> str:
        return f"{self.arm}: {self.metric} ({self.window.label()})"


@dataclass(frozen=True)
class Measure:
    name: str
    diagnostic: str
    term: Term
    minus: Term | None
    unit: str
    high: str

    @property
    def signed(self) -> bool:
        """A paired difference or a change over the run: 0 is the line that matters."""
        return self.minus is not None or self.term.window.kind == "change"

    def definition(self) -> str:
        return self.term.label() + (f" minus {self.minus.label()}" if self.minus else "")


def _text(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: '{key}' must be a non-empty string, got {value!r}")
    return value.strip()


def parse_measure(item: Any, arms: Sequence[str], where: str) -> Measure:
    """A Measure from its battery-file form; ValueError naming the problem (unknown keys, arms or windows)."""
    if not isinstance(item, dict):
        raise ValueError(f"{where}: a measure is a mapping, got {item!r}")
    known = {"name", "diagnostic", "arm", "metric", "window", "minus", "unit", "high"}
    unknown = sorted(set(item) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; a measure has {sorted(known)}")
    name = _text(item, "name", where)
    where = f"{where} ({name})"
    term = Term(_arm(item.get("arm"), arms, where), _text(item, "metric", where), parse_window(item.get("window")))
    minus = item.get("minus")
    if minus is not None:
        if not isinstance(minus, dict) or not set(minus) <= {"arm", "metric", "window"} or not minus:
            raise ValueError(f"{where}: minus is a mapping of arm, metric and/or window, got {minus!r}")
        minus = Term(_arm(minus.get("arm", term.arm), arms, where), str(minus.get("metric", term.metric)),
                     parse_window(minus["window"]) if "window" in minus else term.window)
        if minus == term:
            raise ValueError(f"{where}: minus repeats the measure's own term ({term.label()})")
    return Measure(name, _text(item, "diagnostic", where), term, minus, _text(item, "unit", where),
                   _text(item, "high", where))


def _arm(arm: Any, arms: Sequence[str], where: str) -> str:
    if arm not in arms:
        raise ValueError(f"{where}: arm {arm!r} is not one of the battery's arms {list(arms)}")
    return str(arm)


def parse_measures(items: Any, arms: Sequence[str], where: str = "measures") -> list[Measure]:
    if not isinstance(items, list) or not items:
        raise ValueError(f"{where}: a non-empty list of measures is required")
    out = [parse_measure(item, arms, f"{where}[{i}]") for i, item in enumerate(items)]
    names = [m.name for m in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{where}: measure names must be unique; repeated: {dup}")
    return out


def term_values(runs, term: Term) -> pd.Series:
    """One value per seed of ``term`` (index: seed), from ``runs`` (analysis.load.Runs)."""
    frame = runs.evals if term.metric.startswith("eval/") else runs.metrics
    frame = frame[frame["arm"] == term.arm]
    values = per_run_values(frame, term.metric, term.window, schedule_ends(runs.configs))
    return values.set_index("seed")["value"].astype(float)


def seed_values(runs, m: Measure) -> pd.Series:
    """The measure's value per seed (index: seed): its term, minus its ``minus`` term where it has one; seeds
    missing a term are left out."""
    values = term_values(runs, m.term)
    if m.minus is not None:
        other = term_values(runs, m.minus)
        seeds = values.index.intersection(other.index)
        values = values.loc[seeds] - other.loc[seeds]
    return values[np.isfinite(values)].sort_index()


def per_seed_table(runs, measures: Sequence[Measure]) -> pd.DataFrame:
    """Every measure's value per seed, long form (measure, seed, value): the card's own data, kept beside it."""
    parts = [pd.DataFrame({"measure": m.name, "seed": v.index.astype(int), "value": v.to_numpy()})
             for m in measures for v in [seed_values(runs, m)]]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["measure", "seed", "value"])


def score_table(per_seed: pd.DataFrame, measures: Sequence[Measure]) -> pd.DataFrame:
    """card.csv's table from :func:`per_seed_table`'s: per measure its mean over seeds, the 95% t interval and the
    seed count."""
    rows = []
    for m in measures:
        iv = t_interval(per_seed.loc[per_seed["measure"] == m.name, "value"].to_numpy(dtype=float))
        rows.append({"name": m.name, "diagnostic": m.diagnostic, "score": iv.point, "low": iv.low, "high": iv.high,
                     "seeds": iv.n, "unit": m.unit, "high_means": m.high, "signed": m.signed})
    return pd.DataFrame(rows, columns=CARD_COLUMNS)


def score_card(runs, measures: Sequence[Measure]) -> pd.DataFrame:
    """card.csv's table straight from the runs."""
    return score_table(per_seed_table(runs, measures), measures)


def format_score(x: float) -> str:
    """A score for card.md and validation.md: 3 significant digits, 1e-4 style below 0.001, n/a when not finite."""
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.1e}"

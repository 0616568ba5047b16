"""The Markdown tables the study sections share: start/end window tables, end-window tables and exploratory paired
tables (no verdict, p-values unadjusted), with their number formats."""

from __future__ import annotations

import math

import pandas as pd

__all__ = ["fmt", "fmt_p", "md_paired", "md_window", "md_end"]


def fmt(v, d=3):
    """``v`` with ``d`` decimals; "n/a" for None and non-finite floats."""
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{d}f}"


def fmt_p(p) -> str:
    """A p-value to 3 significant digits; "n/a" for None and non-finite values."""
    return "n/a" if p is None or not math.isfinite(p) else f"{p:.3g}"


def md_paired(rows: list[dict], what: str, digits: int = 3, declared_left_out: int = 0) -> list[str]:
    """An exploratory paired table of analysis.studies.measures.paired_diff rows (no verdict, p-values unadjusted);
    declared comparisons are left out and counted in a note."""
    L = []
    if declared_left_out:
        L += [f"{declared_left_out} of these comparisons are declared in the sweep spec: their verdicts are in "
              "'Pre-registered comparisons' above.", ""]
    if not rows:
        return L + ["(Every comparison of this table is declared in the sweep spec.)"]
    L += ["*Exploratory: not pre-registered, no verdict, p-values not adjusted for multiplicity.*", "",
          f"| {what} | metric | seeds | mean difference | 95% CI | interval | seeds with a > b | sign p | "
          "permutation p |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = (f"[{r['lo']:+.{digits}f}, {r['hi']:+.{digits}f}]" if math.isfinite(r["lo"]) and math.isfinite(r["hi"])
              else "n/a (n<2)")
        mean = f"{r['mean']:+.{digits}f}" if math.isfinite(r["mean"]) else "n/a"
        L.append(f"| {r['a']} - {r['b']} | {r['metric']} | {r['n']} | {mean} | {ci} | {r['interval']} | "
                 f"{r.get('wins', 0)}/{r['n']} | {fmt_p(r['sign_p'])} | {fmt_p(r['perm_p'])} |")
    return L


def md_window(df: pd.DataFrame, digits: int = 3) -> list[str]:
    """The start/end table of analysis.studies.measures.window_table."""
    L = ["| metric | arm | seeds | start (steps 1-20) | end (last 50 steps) | change | 95% CI of change | interval |",
         "|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        ci = (f"[{r.ci_low:+.{digits}f}, {r.ci_high:+.{digits}f}]" if math.isfinite(r.ci_low) else "n/a (n<2)")
        L.append(f"| {r.metric} | {r.arm} | {r.n} | {fmt(r.start, digits)} | {fmt(r.end, digits)} | "
                 f"{r.change:+.{digits}f} | {ci} | {r.interval} |")
    return L


def md_end(df: pd.DataFrame, digits: int = 3) -> list[str]:
    """The end-window table of analysis.studies.measures.end_table."""
    L = ["| metric | arm | seeds | mean, last 50 steps | 95% CI | interval |", "|---|---|---|---|---|---|"]
    for r in df.itertuples():
        L.append(f"| {r.metric} | {r.arm} | {r.n} | {fmt(r.mean, digits)} | "
                 f"[{fmt(r.ci_low, digits)}, {fmt(r.ci_high, digits)}] | {r.interval} |")
    return L

"""Tables of final results, rendered as Markdown, LaTeX and CSV, each stamped with its provenance.

What "final" means: the final score of a run is the mean of its last ``last_k`` evaluation points (by step;
default ``last_k=1``, i.e. the evaluation at the last evaluated step). Step 0 (the start policy) is never
counted as final unless it is the only point. The table says which k and which steps were used.

Statistics per arm (analysis.stats): mean over runs with a 95% CI over runs, the IQM over runs, and the number
of runs (seeds). The CI is a Student t interval below 10 runs and a BCa bootstrap (10 000 resamples, seed 0) from
10 on; never a percentile bootstrap on few seeds (at n = 3 it is exactly [min, max]). Every numeric table has an
``interval`` column naming the method of each row ("t", "BCa", "none"). The pairwise table gives P(X > Y)
(Mann-Whitney probability of improvement, ties 1/2), with a two-sample BCa CI only when both arms have >= 10
runs. The improvement table pairs each run's final score with its own step-0 score (the start policy): the
interval is over the per-seed differences.

Provenance (the numbers' origin and the command that remakes them) is attached to every output:
- Markdown: a ``Provenance:`` line directly under the table (hash, commit and commands as code spans).
- LaTeX: ``%`` comment lines above the table and the same text in the caption.
- CSV: a sidecar file ``<name>.provenance.json`` next to ``<name>.csv``. The CSV itself stays plain (a header
  line, then data) so ``pandas.read_csv`` and spreadsheets read it without options; ``#`` comment lines would
  break both.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from objbench.analysis.stats import (CI, DEFAULT_RESAMPLES, MIN_BOOTSTRAP_N, iqm, mean_ci, prob_improvement,
                            stratified_bootstrap_ci)

__all__ = [
    "Provenance",
    "final_scores",
    "final_table",
    "pairwise_table",
    "bucket_aggregate_table",
    "improvement_table",
    "format_final_table",
    "format_pairwise_table",
    "format_aggregate_table",
    "format_improvement_table",
    "to_markdown",
    "to_latex",
    "write_table",
]


# ---------------------------------------------------------------------------------------------- provenance


@dataclass(frozen=True)
class Provenance:
    """Where a table's numbers come from and how to regenerate them.

    Attributes:
        sweep: sweep name.
        spec_hash: sha256 prefix of the sweep spec (None without sweep.json).
        commit: git commit of the code that produced the runs (sweep.json, else the runs' meta.json).
        seeds: seeds of the runs in the table.
        runs_command: command that regenerates the runs (sweep.json ``command``), or None.
        report_command: command that regenerates this table from the runs.
        notes: how the numbers were computed (final definition, CI method, resamples, bootstrap seed).
        run_commits: distinct commits in the runs' meta.json, when they differ from ``commit``.
    """

    sweep: str
    spec_hash: str | None
    commit: str | None
    seeds: tuple[int, ...]
    runs_command: str | None
    report_command: str
    notes: str = ""
    run_commits: tuple[str, ...] = field(default_factory=tuple)

    def stamp(self, markdown: bool = False) -> str:
        """One line naming every field; with ``markdown`` the hash, commit and commands are code spans."""
        code = (lambda t: f"`{t}`") if markdown else (lambda t: t)
        commit = code(self.commit) if self.commit else "unknown"
        others = [c for c in self.run_commits if c != self.commit]
        if others:
            commit += f" (runs also at {', '.join(code(c[:12]) for c in others)})"
        parts = [
            f"sweep {self.sweep}",
            f"spec {code(self.spec_hash) if self.spec_hash else 'n/a (no sweep.json)'}",
            f"commit {commit}",
            f"seeds {','.join(str(s) for s in self.seeds)}",
        ]
        if self.notes:
            parts.append(self.notes)
        parts.append(f"runs: {code(self.runs_command) if self.runs_command else 'n/a'}")
        parts.append(f"table: {code(self.report_command)}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["seeds"] = list(self.seeds)
        d["run_commits"] = list(self.run_commits)
        return d


# ---------------------------------------------------------------------------------------------- computing


def _check(df: pd.DataFrame, required: Sequence[str], what: str) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: missing column(s) {missing}; got {list(df.columns)}")


def final_scores(frame: pd.DataFrame, metric: str, last_k: int = 1) -> pd.DataFrame:
    """Final score of each run for one metric: the mean of its last ``last_k`` points (by step).

    Data contract: ``frame`` is long-format (``Runs.evals`` or ``Runs.metrics``) with columns run, arm, seed,
    step, metric, value. Step 0 is excluded when the run has later points.

    Returns:
        DataFrame with columns run, arm, seed, value, first_step, last_step (the steps averaged), in the row order
        of ``frame``; empty if the metric is absent.
    """
    _check(frame, ["run", "arm", "seed", "step", "metric", "value"], "final_scores")
    if last_k < 1:
        raise ValueError(f"last_k must be >= 1, got {last_k}")
    d = frame[(frame["metric"] == metric) & frame["value"].notna()]
    rows = []
    for run, g in d.groupby("run", sort=False):
        g = g.sort_values("step")
        if len(g) > 1:
            g = g[g["step"] > 0]
        tail = g.tail(last_k)
        rows.append({"run": run, "arm": g["arm"].iloc[0], "seed": int(g["seed"].iloc[0]),
                     "value": float(tail["value"].mean()), "first_step": int(tail["step"].iloc[0]),
                     "last_step": int(tail["step"].iloc[-1])})
    return pd.DataFrame(rows, columns=["run", "arm", "seed", "value", "first_step", "last_step"])


def _arm_order(arms: Sequence[str] | None, present: Sequence[str]) -> list[str]:
    if arms is None:
        return list(dict.fromkeys(present))
    return [a for a in arms if a in set(present)] + [a for a in dict.fromkeys(present) if a not in set(arms)]


def final_table(frame: pd.DataFrame, metrics: Sequence[str], arms: Sequence[str] | None = None, last_k: int = 1,
                confidence: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """Final metrics per arm: mean, CI, IQM, n.

    Args:
        frame: long-format runs table (see :func:`final_scores`).
        metrics: metric keys, one block of rows each (absent metrics are left out).
        arms: arm order (default: order of appearance).
        last_k: final = mean of the last ``last_k`` points of each run.
        confidence, n_resamples, seed: bootstrap settings for the CI of the mean over runs.

    Returns:
        Numeric DataFrame, columns metric, arm, n, mean, ci_low, ci_high, interval (the CI's method: "t" below 10
        runs, "BCa" from 10, "none" for one run), iqm, std, steps (the range of final steps over runs, e.g. "200" or
        "150-200").
    """
    rows = []
    for metric in metrics:
        fs = final_scores(frame, metric, last_k)
        if fs.empty:
            continue
        for arm in _arm_order(arms, fs["arm"].tolist()):
            v = fs.loc[fs["arm"] == arm, "value"].to_numpy(dtype=float)
            ci = mean_ci(v, confidence=confidence, n_resamples=n_resamples, seed=seed)
            last = fs.loc[fs["arm"] == arm, "last_step"]
            first = fs.loc[fs["arm"] == arm, "first_step"]
            lo, hi = int(first.min()), int(last.max())
            rows.append({"metric": metric, "arm": arm, "n": len(v), "mean": ci.point, "ci_low": ci.low,
                         "ci_high": ci.high, "interval": ci.method, "iqm": iqm(v), "std": float(np.std(v, ddof=1)) if len(v) > 1 else np.nan,
                         "steps": str(lo) if lo == hi else f"{lo}-{hi}"})
    return pd.DataFrame(rows, columns=["metric", "arm", "n", "mean", "ci_low", "ci_high", "interval", "iqm", "std",
                                       "steps"])


def pairwise_table(frame: pd.DataFrame, metric: str, arms: Sequence[str] | None = None, last_k: int = 1,
                   confidence: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """P(X > Y) on the final ``metric`` for every ordered pair of distinct arms (descriptive: no test, no verdict).

    Returns:
        DataFrame with columns metric, x, y, p, ci_low, ci_high, interval ("BCa" when both arms have >= 10 runs,
        else "none": no interval), n_x, n_y; rows in arm order (x-major).
    """
    fs = final_scores(frame, metric, last_k)
    cols = ["metric", "x", "y", "p", "ci_low", "ci_high", "interval", "n_x", "n_y"]
    if fs.empty:
        return pd.DataFrame(columns=cols)
    order = _arm_order(arms, fs["arm"].tolist())
    vals = {a: fs.loc[fs["arm"] == a, "value"].to_numpy(dtype=float) for a in order}
    rows = []
    for a in order:
        for b in order:
            if a == b:
                continue
            p = prob_improvement(vals[a], vals[b], confidence=confidence, n_resamples=n_resamples, seed=seed)
            rows.append({"metric": metric, "x": a, "y": b, "p": p.point, "ci_low": p.low, "ci_high": p.high,
                         "interval": p.method, "n_x": len(vals[a]), "n_y": len(vals[b])})
    return pd.DataFrame(rows, columns=cols)


def bucket_aggregate_table(frame: pd.DataFrame, bucket_metrics: Sequence[str], arms: Sequence[str] | None = None,
                           last_k: int = 1, confidence: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES,
                           seed: int = 0) -> pd.DataFrame:
    """Aggregate over buckets (e.g. difficulty levels), rliable-style: IQM and mean over the (runs x buckets)
    matrix of final scores.

    Intervals: with >= 10 runs, stratified BCa bootstrap (runs resampled within each bucket) for both. With fewer,
    no bootstrap: the mean gets a t interval over the runs' own bucket means (for a rectangular matrix the mean of
    the matrix is the mean of those), and the IQM no interval.

    Only runs that logged every bucket are used (the matrix must be rectangular).

    Returns:
        DataFrame with columns arm, n, buckets, iqm, iqm_low, iqm_high, iqm_interval, mean, mean_low, mean_high,
        mean_interval (methods: "BCa", "t" or "none").
    """
    cols = ["arm", "n", "buckets", "iqm", "iqm_low", "iqm_high", "iqm_interval", "mean", "mean_low", "mean_high",
            "mean_interval"]
    parts = [final_scores(frame, m, last_k).assign(metric=m) for m in bucket_metrics]
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame(columns=cols)
    fs = pd.concat(parts, ignore_index=True)
    wide = fs.pivot_table(index=["arm", "run"], columns="metric", values="value", sort=False).dropna()
    used = [m for m in bucket_metrics if m in wide.columns]
    rows = []
    for arm in _arm_order(arms, wide.index.get_level_values("arm").tolist()):
        mat = wide.loc[arm, used].to_numpy(dtype=float)  # (n_runs, n_buckets)
        if mat.shape[0] >= MIN_BOOTSTRAP_N:
            q = stratified_bootstrap_ci(mat, "iqm", confidence=confidence, n_resamples=n_resamples, seed=seed)
            m = stratified_bootstrap_ci(mat, "mean", confidence=confidence, n_resamples=n_resamples, seed=seed)
        else:
            m = mean_ci(mat.mean(axis=1), confidence=confidence)
            q = CI(iqm(mat), float("nan"), float("nan"), "none")
        rows.append({"arm": arm, "n": mat.shape[0], "buckets": ",".join(used), "iqm": q.point, "iqm_low": q.low,
                     "iqm_high": q.high, "iqm_interval": q.method, "mean": m.point, "mean_low": m.low,
                     "mean_high": m.high, "mean_interval": m.method})
    return pd.DataFrame(rows, columns=cols)


def improvement_table(frame: pd.DataFrame, metric: str, arms: Sequence[str] | None = None, last_k: int = 1,
                      confidence: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES,
                      seed: int = 0) -> pd.DataFrame:
    """Start -> final per arm: did the runs improve on the policy they started from?

    A run's start value is its point at step 0 (the start policy, which every arm of a seed shares); its final
    value is as in :func:`final_scores` (step 0 excluded). Only runs that have both are used ("paired runs"), so
    ``final_mean - start_mean == diff_mean`` holds exactly. The CI is over the per-seed differences: a t interval
    below 10 seeds, BCa bootstrap from 10 (the ``interval`` column says which).

    Returns:
        DataFrame with columns metric, arm, n (paired runs), start_mean, final_mean, diff_mean, diff_low,
        diff_high, interval, n_improved (runs with final > start), steps (range of final steps); arms without a paired run
        are left out.
    """
    cols = ["metric", "arm", "n", "start_mean", "final_mean", "diff_mean", "diff_low", "diff_high", "interval",
            "n_improved", "steps"]
    _check(frame, ["run", "arm", "seed", "step", "metric", "value"], "improvement_table")
    d = frame[(frame["metric"] == metric) & frame["value"].notna()]
    start = d[d["step"] == 0].groupby("run", sort=False)["value"].last()
    fs = final_scores(frame, metric, last_k)
    if fs.empty or start.empty:
        return pd.DataFrame(columns=cols)
    fs = fs[fs["run"].isin(start.index) & (fs["last_step"] > 0)]  # paired: a start and a later point
    fs = fs.assign(start=fs["run"].map(start).astype(float))
    rows = []
    for arm in _arm_order(arms, fs["arm"].tolist()):
        g = fs[fs["arm"] == arm]
        s, f = g["start"].to_numpy(dtype=float), g["value"].to_numpy(dtype=float)
        ci = mean_ci(f - s, confidence=confidence, n_resamples=n_resamples, seed=seed)
        lo, hi = int(g["first_step"].min()), int(g["last_step"].max())
        rows.append({"metric": metric, "arm": arm, "n": len(g), "start_mean": float(s.mean()),
                     "final_mean": float(f.mean()), "diff_mean": ci.point, "diff_low": ci.low, "diff_high": ci.high,
                     "interval": ci.method, "n_improved": int((f > s).sum()), "steps": str(lo) if lo == hi else f"{lo}-{hi}"})
    return pd.DataFrame(rows, columns=cols)


# ---------------------------------------------------------------------------------------------- formatting


def _fmt(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if isinstance(v, (float, np.floating)):
        return f"{v:.{digits}f}"
    return str(v)


def _fmt_ci(lo, hi, digits: int = 3, na: str = "n/a (n<2)") -> str:
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return na
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"


INTERVAL_WORDS = {"t": "t", "BCa": "BCa bootstrap", "none": "none", "percentile": "percentile bootstrap",
                  "basic": "basic bootstrap"}
"""How the ``interval`` column reads in Markdown/LaTeX."""


def _interval_words(methods) -> list[str]:
    return [INTERVAL_WORDS.get(str(m), str(m)) for m in methods]


def format_final_table(df: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """Display form of :func:`final_table`: strings, the CI in one column."""
    return pd.DataFrame({
        "metric": df["metric"],
        "arm": df["arm"],
        "n seeds": df["n"].astype(str),
        "mean": [_fmt(v, digits) for v in df["mean"]],
        "95% CI": [_fmt_ci(lo, hi, digits) for lo, hi in zip(df["ci_low"], df["ci_high"])],
        "interval": _interval_words(df["interval"]),
        "IQM": [_fmt(v, digits) for v in df["iqm"]],
        "final steps": df["steps"],
    })


def format_pairwise_table(df: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """Display form of :func:`pairwise_table`."""
    return pd.DataFrame({
        "X": df["x"],
        "Y": df["y"],
        "P(X > Y)": [_fmt(v, digits) for v in df["p"]],
        "95% CI": [_fmt_ci(lo, hi, digits, na=f"n/a (< {MIN_BOOTSTRAP_N} seeds)")
                   for lo, hi in zip(df["ci_low"], df["ci_high"])],
        "interval": _interval_words(df["interval"]),
        "n X / n Y": [f"{a} / {b}" for a, b in zip(df["n_x"], df["n_y"])],
    })


def format_aggregate_table(df: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """Display form of :func:`bucket_aggregate_table`."""
    return pd.DataFrame({
        "arm": df["arm"],
        "n seeds": df["n"].astype(str),
        "IQM": [_fmt(v, digits) for v in df["iqm"]],
        "IQM 95% CI": [_fmt_ci(lo, hi, digits, na=f"n/a (< {MIN_BOOTSTRAP_N} seeds)")
                       for lo, hi in zip(df["iqm_low"], df["iqm_high"])],
        "IQM interval": _interval_words(df["iqm_interval"]),
        "mean": [_fmt(v, digits) for v in df["mean"]],
        "mean 95% CI": [_fmt_ci(lo, hi, digits) for lo, hi in zip(df["mean_low"], df["mean_high"])],
        "mean interval": _interval_words(df["mean_interval"]),
    })


def format_improvement_table(df: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """Display form of :func:`improvement_table` (the difference signed, e.g. ``+0.233``)."""
    def signed(v) -> str:
        return "n/a" if v is None or not np.isfinite(v) else f"{v:+.{digits}f}"

    def ci(lo, hi) -> str:
        return f"[{signed(lo)}, {signed(hi)}]" if np.isfinite(lo) and np.isfinite(hi) else _fmt_ci(lo, hi, digits)

    return pd.DataFrame({
        "arm": df["arm"],
        "n seeds": df["n"].astype(str),
        "start (step 0)": [_fmt(v, digits) for v in df["start_mean"]],
        "final": [_fmt(v, digits) for v in df["final_mean"]],
        "final - start": [signed(v) for v in df["diff_mean"]],
        "95% CI": [ci(lo, hi) for lo, hi in zip(df["diff_low"], df["diff_high"])],
        "interval": _interval_words(df["interval"]),
        "improved": [f"{k}/{n}" for k, n in zip(df["n_improved"], df["n"])],
        "final steps": df["steps"],
    })


# ---------------------------------------------------------------------------------------------- rendering


def _cells(df: pd.DataFrame, digits: int) -> list[list[str]]:
    return [[_fmt(v, digits) for v in row] for row in df.itertuples(index=False, name=None)]


def to_markdown(df: pd.DataFrame, provenance: Provenance | None = None, digits: int = 3) -> str:
    """GitHub-flavoured Markdown table (floats with ``digits`` decimals), then a ``Provenance:`` line."""
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|")

    header = [esc(c) for c in df.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in _cells(df, digits)]
    if provenance is not None:
        lines += ["", "Provenance: " + provenance.stamp(markdown=True)]
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "<": r"\textless{}", ">": r"\textgreater{}"}


def _tex(s: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(s))


def to_latex(df: pd.DataFrame, provenance: Provenance | None = None, caption: str = "", label: str = "",
             digits: int = 3) -> str:
    """A ``table`` environment with a booktabs ``tabular``; provenance as ``%`` comments and in the caption."""
    lines = []
    if provenance is not None:
        lines += [f"% {line}" for line in provenance.stamp().split("; ")]
    lines += ["\\begin{table}[t]", "\\centering", "\\small"]
    lines.append("\\begin{tabular}{" + "l" * len(df.columns) + "}")
    lines.append("\\toprule")
    lines.append(" & ".join(_tex(c) for c in df.columns) + " \\\\")
    lines.append("\\midrule")
    lines += [" & ".join(_tex(c) for c in row) + " \\\\" for row in _cells(df, digits)]
    lines += ["\\bottomrule", "\\end{tabular}"]
    cap = caption
    if provenance is not None:
        cap = f"{caption} " if caption else ""
        cap = _tex(cap) + "{\\footnotesize " + _tex(provenance.stamp()) + "}"
    else:
        cap = _tex(cap)
    if cap:
        lines.append("\\caption{" + cap + "}")
    if label:
        lines.append("\\label{" + label + "}")
    lines.append("\\end{table}")
    return "\n".join(lines) + "\n"


def write_table(numeric: pd.DataFrame, path_stem: str | Path, provenance: Provenance,
                display: pd.DataFrame | None = None, caption: str = "", digits: int = 3) -> dict[str, Path]:
    """Write ``<stem>.md``, ``<stem>.tex``, ``<stem>.csv`` and ``<stem>.provenance.json``.

    Args:
        numeric: the numbers (written to CSV as they are, full precision).
        path_stem: output path without extension.
        provenance: stamp for every format.
        display: the human-readable form for Markdown/LaTeX (default: ``numeric``).
        caption: LaTeX caption (the provenance is appended).

    Returns:
        {"md": path, "tex": path, "csv": path, "provenance": path}.
    """
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    shown = numeric if display is None else display
    paths = {
        "md": stem.with_name(stem.name + ".md"),
        "tex": stem.with_name(stem.name + ".tex"),
        "csv": stem.with_name(stem.name + ".csv"),
        "provenance": stem.with_name(stem.name + ".provenance.json"),
    }
    paths["md"].write_text(to_markdown(shown, provenance, digits))
    paths["tex"].write_text(to_latex(shown, provenance, caption=caption, label=f"tab:{stem.name}", digits=digits))
    numeric.to_csv(paths["csv"], index=False, lineterminator="\n")
    prov = {**provenance.to_dict(), "stamp": provenance.stamp(), "table": paths["csv"].name,
            "columns": list(numeric.columns)}
    paths["provenance"].write_text(json.dumps(prov, indent=1) + "\n")
    return paths

"""report.md for a folder of runs: figures (PNG), tables (Markdown, LaTeX, CSV) and their provenance.

``write_report(runs_dir)`` is what ``objbench report RUNS_DIR`` and the end of ``objbench sweep`` call. The output
is a function of the run folders and the arguments only: bootstrap seeds are fixed, nothing is timestamped, so
the same runs give the same report byte for byte.

Output (default ``<runs_dir>/report/``)::

    report.md                 provenance, tables, figures, skipped runs, the regenerating commands
    curves_<x>.png            learning curves per arm (mean over seeds, 95% bootstrap band)
    difficulty_<x>.png        accuracy per difficulty bucket
    final_<metric>.png        final score per arm: mean, 95% CI, one dot per seed
    final.{md,tex,csv}        final metrics per arm (+ final.provenance.json)
    pairwise.{md,tex,csv}     P(X > Y) for every pair of arms (+ .provenance.json)
    difficulty.{md,tex,csv}   IQM / mean over seeds x difficulty buckets, stratified bootstrap (+ .provenance.json)
"""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path
from typing import Sequence

import pandas as pd

from analysis.load import Runs, load_runs
from analysis.plots import ACC_LIM, TRAINING_PANELS, Panel, arm_colors, plot_final, plot_panels
from analysis.stats import CURVE_RESAMPLES, DEFAULT_RESAMPLES, mean_ci_over_seeds
from analysis.tables import (
    Provenance,
    bucket_aggregate_table,
    final_scores,
    final_table,
    format_aggregate_table,
    format_final_table,
    format_pairwise_table,
    pairwise_table,
    to_markdown,
    write_table,
)

__all__ = ["write_report", "panel_curves", "bucket_keys", "final_metrics", "report_command"]

PRIMARY_METRICS = ("eval/acc", "reward/acc")
"""The headline metric: held-out accuracy if evaluated, else training accuracy."""


def bucket_keys(names: Sequence[str], prefix: str) -> list[str]:
    """Per-difficulty keys ``<prefix>_d<k>`` among ``names``, sorted by k (e.g. eval/acc_d1, eval/acc_d2)."""
    pat = re.compile(re.escape(prefix) + r"_d(\d+)$")
    found = [(int(m.group(1)), n) for n in names if (m := pat.match(n))]
    return [n for _, n in sorted(found)]


def final_metrics(runs: Runs) -> tuple[str, list[str], str]:
    """Which metrics the final table shows: (source, metric keys, primary key).

    Evaluations if any were logged: eval/acc, eval/acc_d*, eval/pass@k (by k), then other eval/* keys.
    Otherwise training metrics: reward/acc and reward/acc_d*.
    """
    if not runs.evals.empty:
        names = runs.eval_names
        acc = [n for n in ("eval/acc",) if n in names]
        buckets = bucket_keys(names, "eval/acc")
        passk = sorted((n for n in names if re.fullmatch(r"eval/pass@\d+", n)), key=lambda n: int(n.split("@")[1]))
        rest = [n for n in names if n not in set(acc + buckets + passk)]
        keys = acc + buckets + passk + rest
        return "evals", keys, keys[0]
    names = runs.metric_names
    keys = [n for n in ("reward/acc",) if n in names] + bucket_keys(names, "reward/acc")
    if not keys:
        raise ValueError("no eval.jsonl data and no reward/acc in metrics.jsonl: nothing to put in a final table")
    return "metrics", keys, keys[0]


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


def report_command(runs_dir, out_dir=None, x: str = "step", **options) -> str:
    """The command that regenerates the report: ``objbench report`` when its flags suffice, else a python call."""
    non_default = {k: v for k, v in options.items() if v is not None}
    if out_dir is None and not non_default:
        return f"objbench report {shlex.quote(str(runs_dir))}" + (f" --x {x}" if x != "step" else "")
    args = [repr(str(runs_dir))]
    if out_dir is not None:
        args.append(f"out_dir={str(out_dir)!r}")
    if x != "step":
        args.append(f"x={x!r}")
    args += [f"{k}={v!r}" for k, v in non_default.items()]
    return f'python -c "from analysis.report import write_report; write_report({", ".join(args)})"'


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_")


def write_report(runs_dir, out_dir=None, x: str = "step", *, last_k: int = 1, smooth: int | None = None,
                 include_incomplete: bool = False, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                 dpi: int = 120) -> Path:
    """Write figures, tables and report.md for the runs under ``runs_dir``; returns the path of report.md.

    Args:
        runs_dir: a sweep folder (or any folder of run folders).
        out_dir: where to write (default ``<runs_dir>/report``).
        x: x axis of the learning curves, ``"step"`` or ``"tokens"`` (generated tokens).
        last_k: final score of a run = mean of its last ``last_k`` evaluation points.
        smooth: optional trailing rolling-mean window for the curves (off by default).
        include_incomplete: also use runs without a ``done`` file (listed as such).
        n_resamples, seed: bootstrap settings of the tables (curves use 2 000 resamples with the same seed).
        dpi: PNG resolution.
    """
    if x not in ("step", "tokens"):
        raise ValueError(f"x must be 'step' or 'tokens', got {x!r}")
    runs_dir = Path(runs_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(runs_dir, include_incomplete=include_incomplete)
    notes = []
    for w in caught:  # pass them on, and list them in the report
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        notes.append(str(w.message))
    out = Path(out_dir) if out_dir is not None else runs_dir / "report"
    out.mkdir(parents=True, exist_ok=True)

    colors = arm_colors(runs.arms)
    sweep = runs.sweep
    opts = {"last_k": last_k if last_k != 1 else None, "smooth": smooth,
            "include_incomplete": include_incomplete or None,
            "n_resamples": n_resamples if n_resamples != DEFAULT_RESAMPLES else None,
            "seed": seed or None, "dpi": dpi if dpi != 120 else None}
    command = report_command(runs_dir, out_dir, x, **opts)
    source, keys, primary = final_metrics(runs)
    frame = runs.evals if source == "evals" else runs.metrics
    point = "evaluation" if source == "evals" else "training step"
    final_def = (f"final = the last {point} of each run" if last_k == 1
                 else f"final = mean of the last {last_k} {point} points of each run")
    stat_def = f"95% percentile bootstrap over seeds, {n_resamples} resamples, bootstrap seed {seed}"
    seeds = tuple(runs.seeds)

    def prov(what: str, stat: str = stat_def) -> Provenance:
        return Provenance(sweep=str(sweep["name"]), spec_hash=sweep.get("spec_hash"), commit=sweep.get("commit"),
                          seeds=seeds, runs_command=sweep.get("command"), report_command=command,
                          notes=f"{what}; {stat}", run_commits=tuple(sweep.get("run_commits", ())))

    # ---------------------------------------------------------------- tables
    arms = runs.arms
    ft = final_table(frame, keys, arms=arms, last_k=last_k, n_resamples=n_resamples, seed=seed)
    p_final = prov(final_def)
    write_table(ft, out / "final", p_final, display=format_final_table(ft),
                caption=f"Final metrics per arm ({final_def}).")
    pw = pairwise_table(frame, primary, arms=arms, last_k=last_k, n_resamples=n_resamples, seed=seed)
    p_pair = prov(f"P(X > Y) on final {primary} (Mann-Whitney, ties 1/2); {final_def}")
    write_table(pw, out / "pairwise", p_pair, display=format_pairwise_table(pw),
                caption=f"Probability that a run of X ends above a run of Y on {primary}.")
    buckets = bucket_keys(runs.eval_names if source == "evals" else runs.metric_names, primary)
    agg, p_agg = None, None
    if len(buckets) >= 2:
        agg = bucket_aggregate_table(frame, buckets, arms=arms, last_k=last_k, n_resamples=n_resamples, seed=seed)
        p_agg = prov(f"IQM and mean over (seeds x {len(buckets)} difficulty buckets) of final {primary}; {final_def}",
                     f"95% stratified percentile bootstrap (seeds resampled within each bucket), {n_resamples} "
                     f"resamples, bootstrap seed {seed}")
        write_table(agg, out / "difficulty", p_agg, display=format_aggregate_table(agg),
                    caption="Aggregate over difficulty buckets.")

    # ---------------------------------------------------------------- figures
    figures: list[tuple[str, str]] = []  # (file name, caption)
    sm = f", smoothed (rolling mean of {smooth} points)" if smooth and smooth > 1 else ""
    curves = panel_curves(runs, TRAINING_PANELS, x=x, smooth=smooth, seed=seed)
    fig, _ = plot_panels(curves, colors, x=x, ncols=5,
                         title=f"{sweep['name']}: learning curves per arm (mean over seeds, 95% bootstrap band{sm})",
                         ylims=[p.ylim for p in TRAINING_PANELS], markers=[p.source == "evals" for p in TRAINING_PANELS])
    name = f"curves_{x}.png"
    fig.savefig(out / name, dpi=dpi)
    figures.append((name, "Learning curves per arm: mean over seeds, shaded 95% bootstrap CI over seeds "
                          "(no band where a single run covers that point)."))

    diff_rows = []
    for src, prefix, label in (("evals", "eval/acc", "eval"), ("metrics", "reward/acc", "training")):
        fr = runs.evals if src == "evals" else runs.metrics
        names = runs.eval_names if src == "evals" else runs.metric_names
        for k in bucket_keys(names, prefix):
            d = fr[fr["metric"] == k]
            c = mean_ci_over_seeds(d, x=x, smooth=smooth, seed=seed)
            diff_rows.append((f"{label} accuracy, difficulty {k.rsplit('_d', 1)[1]}\n({k})",
                              "accuracy (fraction)", c, src == "evals"))
    if diff_rows:
        n_ev = sum(1 for r in diff_rows if r[3])
        ncols = max(n_ev, len(diff_rows) - n_ev) or len(diff_rows)
        fig, _ = plot_panels([r[:3] for r in diff_rows], colors, x=x, ncols=ncols,
                             title=f"{sweep['name']}: accuracy per difficulty bucket (mean over seeds, 95% bootstrap band{sm})",
                             ylims=[ACC_LIM] * len(diff_rows), markers=[r[3] for r in diff_rows])
        name = f"difficulty_{x}.png"
        fig.savefig(out / name, dpi=dpi)
        figures.append((name, "Accuracy per difficulty bucket (d1 = easiest)."))

    fs = final_scores(frame, primary, last_k)
    if not fs.empty:
        summ = ft[ft["metric"] == primary]
        xlabel = f"final {primary}" + (" (accuracy, fraction)" if "acc" in primary else "")
        fig, _ = plot_final(fs, summ, colors, xlabel=xlabel,
                            title=f"{sweep['name']}: final {primary} per arm\n(bar: 95% bootstrap CI of the mean; "
                                  f"tick: mean; dots: seeds)")
        name = f"final_{_slug(primary)}.png"
        fig.savefig(out / name, dpi=dpi)
        figures.append((name, f"Final {primary} per arm ({final_def})."))

    # ---------------------------------------------------------------- report.md
    md = _report_markdown(runs, runs_dir, ft, pw, agg, primary, final_def, stat_def, figures, notes, command, p_final,
                          p_pair, p_agg, x)
    path = out / "report.md"
    path.write_text(md)
    return path


def _report_markdown(runs: Runs, runs_dir: Path, ft, pw, agg, primary, final_def, stat_def, figures, notes, command,
                     p_final, p_pair, p_agg, x) -> str:
    sweep = runs.sweep
    cfg = runs.configs
    L = [f"# Report: {sweep['name']}", ""]
    L += ["## Provenance", ""]
    L.append(f"- runs folder: `{runs_dir}`")
    L.append(f"- sweep spec hash: `{sweep.get('spec_hash')}`" if sweep.get("spec_hash")
             else "- sweep spec hash: n/a (no sweep.json: a plain folder of runs)")
    L.append(f"- commit: `{sweep.get('commit')}`" if sweep.get("commit") else "- commit: unknown")
    others = [c for c in sweep.get("run_commits", []) if c != sweep.get("commit")]
    if others:
        L.append(f"- runs were produced at other commits too: {', '.join(f'`{c}`' for c in others)}")
    if sweep.get("base_config"):
        L.append(f"- base config: `{sweep['base_config']}`")
    L.append(f"- seeds: {', '.join(str(s) for s in runs.seeds)}")
    L.append("- arms (colour order of every figure):")
    for arm in runs.arms:
        sub = cfg[cfg["arm"] == arm]
        if sub.empty:
            L.append(f"  - {arm}: no runs loaded")
        else:
            incomplete = int((~sub["complete"].astype(bool)).sum())
            extra = f", {incomplete} without `done` (included on request)" if incomplete else ""
            L.append(f"  - {arm}: {len(sub)} run(s), seeds {', '.join(str(s) for s in sorted(sub['seed']))}{extra}")
    L.append(f"- statistics: {stat_def}; IQM = mean of the middle 50% of seeds (`scipy.stats.trim_mean`, 0.25); "
             f"{final_def}")
    L.append("")
    if runs.skipped:
        L += ["### Skipped runs", ""]
        L += [f"- `{s.run}`: {s.reason}" for s in runs.skipped]
        L.append("")
    if notes:
        L += ["<details><summary>Loading notes ({} warning{})</summary>".format(len(notes), "s" * (len(notes) != 1)),
              ""]
        L += [f"- {n}" for n in notes]
        L += ["", "</details>", ""]

    start = (" (step 0, the start policy, counts only when a run has no later evaluation)"
             if primary.startswith("eval/") else "")
    L += ["## Final performance", "", f"`{primary}`, {final_def}{start}.", ""]
    L.append(to_markdown(format_final_table(ft[ft["metric"] == primary]), p_final).rstrip())
    L.append("")
    others = ft[ft["metric"] != primary]
    if not others.empty:
        L += ["<details><summary>All final metrics</summary>", ""]
        L.append(to_markdown(format_final_table(others), p_final).rstrip())
        L += ["", "</details>", ""]
    L += ["All final metrics also in [final.md](final.md), [final.csv](final.csv) "
          "(provenance: [final.provenance.json](final.provenance.json)), [final.tex](final.tex).", ""]
    final_fig = [f for f in figures if f[0].startswith("final_")]
    for name, cap in final_fig:
        L += [f"![{cap}]({name})", "", f"*{cap}*", ""]

    L += ["## Probability of improvement", "",
          f"P(X > Y): chance that a random seed of X ends above a random seed of Y on final `{primary}` "
          "(ties count 1/2); 0.5 = no difference.", ""]
    if pw.empty:
        L += ["Fewer than two arms: nothing to compare.", ""]
    else:
        L.append(to_markdown(format_pairwise_table(pw), p_pair).rstrip())
        L += ["", "Also in [pairwise.csv](pairwise.csv) (provenance: [pairwise.provenance.json](pairwise.provenance.json)), "
              "[pairwise.tex](pairwise.tex).", ""]

    if agg is not None and not agg.empty:
        L += ["## Aggregate over difficulty buckets", ""]
        L += [f"Final `{primary}` pooled over seeds and difficulty buckets; stratified bootstrap (seeds resampled "
              "within each bucket).", ""]
        L.append(to_markdown(format_aggregate_table(agg), p_agg).rstrip())
        L += ["", "Also in [difficulty.csv](difficulty.csv) (provenance: "
              "[difficulty.provenance.json](difficulty.provenance.json)), [difficulty.tex](difficulty.tex).", ""]

    L += ["## Learning curves", "", f"x axis: {'training step' if x == 'step' else 'generated tokens'}.", ""]
    for name, cap in figures:
        if name.startswith("final_"):
            continue
        L += [f"![{cap}]({name})", "", f"*{cap}*", ""]

    L += ["## Regenerate", ""]
    L += ["Runs (training):", "", "```", sweep.get("command") or "n/a (no sweep.json)", "```", ""]
    L += ["This report:", "", "```", command, "```", ""]
    return "\n".join(L)


if __name__ == "__main__":  # python -m analysis.report RUNS_DIR [--x tokens]
    import argparse

    ap = argparse.ArgumentParser(description="write report.md, figures and tables for a folder of runs")
    ap.add_argument("runs_dir")
    ap.add_argument("--x", choices=("step", "tokens"), default="step")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    print(write_report(a.runs_dir, out_dir=a.out, x=a.x))

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
    improvement.{md,tex,csv}  start (step 0) -> final of the primary metric per arm, seed-paired (+ .provenance.json)
    pairwise.{md,tex,csv}     P(X > Y) for every pair of arms (+ .provenance.json)
    difficulty.{md,tex,csv}   IQM / mean over seeds x difficulty buckets, stratified bootstrap (+ .provenance.json);
                              only when ``<primary>_d<k>`` keys were logged

The primary metric (main final table, improvement table, P(X > Y), final-score figure, difficulty aggregate) is,
in this order: the ``primary`` argument (``objbench report DIR --primary eval/pass@1``); else sweep.json's
``"report": {"primary": ...}`` (copied there from the sweep spec's ``report:`` mapping); else eval/acc when
evaluations were logged, reward/acc otherwise.
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
    format_improvement_table,
    format_pairwise_table,
    improvement_table,
    pairwise_table,
    to_markdown,
    write_table,
)

__all__ = ["write_report", "panel_curves", "bucket_keys", "final_metrics", "resolve_primary", "report_command"]

PRIMARY_METRICS = ("eval/acc", "reward/acc")
"""The default headline metric: held-out accuracy if evaluated, else training accuracy."""


def bucket_keys(names: Sequence[str], prefix: str) -> list[str]:
    """Per-difficulty keys ``<prefix>_d<k>`` among ``names``, sorted by k (e.g. eval/acc_d1, eval/acc_d2)."""
    pat = re.compile(re.escape(prefix) + r"_d(\d+)$")
    found = [(int(m.group(1)), n) for n in names if (m := pat.match(n))]
    return [n for _, n in sorted(found)]


def _default_metrics(runs: Runs) -> tuple[str, list[str]]:
    """(source, keys) of the final table without a chosen primary metric; keys[0] is the default primary."""
    if not runs.evals.empty:
        names = runs.eval_names
        passk = sorted((n for n in names if re.fullmatch(r"eval/pass@\d+", n)), key=lambda n: int(n.split("@")[1]))
        keys = []
        for base in [n for n in ("eval/acc",) if n in names] + passk:  # each headline key, then its buckets
            keys += [base] + bucket_keys(names, base)
        keys += [n for n in names if n not in set(keys)]
        return "evals", keys
    names = runs.metric_names
    keys = [n for n in ("reward/acc",) if n in names] + bucket_keys(names, "reward/acc")
    if not keys:
        raise ValueError("no eval.jsonl data and no reward/acc in metrics.jsonl: nothing to put in a final table")
    return "metrics", keys


def resolve_primary(runs: Runs, primary: str | None = None) -> tuple[str, str]:
    """The primary metric and where it came from: ``(key, origin)``, origin one of "argument", "sweep.json",
    "default".

    Order: ``primary``; else sweep.json ``{"report": {"primary": ...}}``; else the first key of the default final
    table (eval/acc when evaluated, else reward/acc). A chosen key must have been logged by some loaded run
    (eval.jsonl or metrics.jsonl), else ValueError naming it and listing the eval keys.
    """
    origin = "argument"
    if primary is None:
        report_cfg = runs.sweep.get("report") or {}
        if not isinstance(report_cfg, dict):
            raise ValueError(f"sweep.json 'report' must be a mapping like {{\"primary\": \"eval/pass@1\"}}, "
                             f"got {report_cfg!r}")
        primary, origin = report_cfg.get("primary"), "sweep.json"
    if primary is None:
        return _default_metrics(runs)[1][0], "default"
    if not isinstance(primary, str) or not primary:
        raise ValueError(f"primary metric must be a metric name such as 'eval/pass@1', got {primary!r} ({origin})")
    if primary not in set(runs.eval_names) and primary not in set(runs.metric_names):
        where = "the primary argument" if origin == "argument" else "sweep.json report.primary"
        evals = ", ".join(runs.eval_names) or "none (no eval.jsonl data)"
        raise ValueError(f"primary metric {primary!r} (from {where}) was not logged by any loaded run; "
                         f"eval keys: {evals} (training keys from metrics.jsonl, e.g. reward/acc, work too)")
    return primary, origin


def final_metrics(runs: Runs, primary: str | None = None) -> tuple[str, list[str], str]:
    """Which metrics the final table shows: (source, metric keys, primary key).

    Evaluations if any were logged: eval/acc, eval/acc_d*, eval/pass@k (by k, each followed by its
    eval/pass@k_d* buckets), then other eval/* keys. Otherwise training metrics: reward/acc and reward/acc_d*.
    ``primary`` (a key logged somewhere, see :func:`resolve_primary`) picks the source: a training key with
    evaluations present gives the training table, with that key and its buckets added if missing.
    """
    if primary is None:
        source, keys = _default_metrics(runs)
        return source, keys, keys[0]
    if primary in set(runs.eval_names):
        source, keys = "evals", _default_metrics(runs)[1]
    else:  # a metrics.jsonl key
        source, names = "metrics", runs.metric_names
        keys = [n for n in ("reward/acc",) if n in names] + bucket_keys(names, "reward/acc")
    names = runs.eval_names if source == "evals" else runs.metric_names
    if primary not in keys:
        keys = keys + [primary] + [b for b in bucket_keys(names, primary) if b not in keys]
    return source, keys, primary


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


def report_command(runs_dir, out_dir=None, x: str = "step", primary: str | None = None, **options) -> str:
    """The command that regenerates the report: ``objbench report DIR [--x X] [--out OUT] [--primary KEY]`` when
    those flags suffice, else a python call. ``options`` are further write_report keywords (None = default)."""
    non_default = {k: v for k, v in options.items() if v is not None}
    if not non_default:
        cmd = ["objbench", "report", str(runs_dir)]
        if x != "step":
            cmd += ["--x", x]
        if out_dir is not None:
            cmd += ["--out", str(out_dir)]
        if primary is not None:
            cmd += ["--primary", primary]
        return " ".join(shlex.quote(c) for c in cmd)
    args = [repr(str(runs_dir))]
    if out_dir is not None:
        args.append(f"out_dir={str(out_dir)!r}")
    if x != "step":
        args.append(f"x={x!r}")
    if primary is not None:
        args.append(f"primary={primary!r}")
    args += [f"{k}={v!r}" for k, v in non_default.items()]
    return f'python -c "from analysis.report import write_report; write_report({", ".join(args)})"'


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_")


def _is_fraction(key: str) -> bool:
    """Accuracy-like keys (acc, acc_d2, pass@4, pass@1_d3): values are fractions in [0, 1]."""
    name = key.rsplit("/", 1)[-1]
    return bool(re.fullmatch(r"(acc|pass@\d+)(_d\d+)?", name))


def _start_spread(frame: pd.DataFrame, metric: str) -> tuple[float | None, int]:
    """Step-0 values per seed across arms: (largest max - min over seeds, number of seeds with a step 0).
    0.0 means every arm of a seed started from the same measured value; None: no step 0 logged."""
    d = frame[(frame["metric"] == metric) & (frame["step"] == 0) & frame["value"].notna()]
    if d.empty:
        return None, 0
    by_seed = d.groupby("seed")["value"]
    return float((by_seed.max() - by_seed.min()).max()), int(by_seed.ngroups)


def _shared_start(frame: pd.DataFrame, metric: str, tol: float = 1e-9) -> float | None:
    """Mean over seeds of the step-0 value when every arm of each seed has the same one, else None."""
    spread, _ = _start_spread(frame, metric)
    if spread is None or spread > tol:
        return None
    d = frame[(frame["metric"] == metric) & (frame["step"] == 0) & frame["value"].notna()]
    return float(d.groupby("seed")["value"].first().mean())


def _remove_table(stem: Path) -> None:
    for ext in (".md", ".tex", ".csv", ".provenance.json"):
        stem.with_name(stem.name + ext).unlink(missing_ok=True)


def write_report(runs_dir, out_dir=None, x: str = "step", *, primary: str | None = None, last_k: int = 1,
                 smooth: int | None = None, include_incomplete: bool = False, n_resamples: int = DEFAULT_RESAMPLES,
                 seed: int = 0, dpi: int = 120) -> Path:
    """Write figures, tables and report.md for the runs under ``runs_dir``; returns the path of report.md.

    Args:
        runs_dir: a sweep folder (or any folder of run folders).
        out_dir: where to write (default ``<runs_dir>/report``).
        x: x axis of the learning curves, ``"step"`` or ``"tokens"`` (generated tokens).
        primary: the metric of the main final table, the start -> final table, P(X > Y), the final-score figure and
            the difficulty aggregate (over ``<primary>_d<k>``), e.g. ``"eval/pass@1"``. Default: sweep.json's
            ``report.primary``, else eval/acc (reward/acc without evaluations); see :func:`resolve_primary`.
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
    primary, primary_origin = resolve_primary(runs, primary)  # fails before anything is written
    out = Path(out_dir) if out_dir is not None else runs_dir / "report"
    out.mkdir(parents=True, exist_ok=True)

    colors = arm_colors(runs.arms)
    sweep = runs.sweep
    opts = {"last_k": last_k if last_k != 1 else None, "smooth": smooth,
            "include_incomplete": include_incomplete or None,
            "n_resamples": n_resamples if n_resamples != DEFAULT_RESAMPLES else None,
            "seed": seed or None, "dpi": dpi if dpi != 120 else None}
    command = report_command(runs_dir, out_dir, x, primary=None if primary_origin == "default" else primary, **opts)
    source, keys, primary = final_metrics(runs, primary)
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
    imp = improvement_table(frame, primary, arms=arms, last_k=last_k, n_resamples=n_resamples, seed=seed)
    p_imp = prov(f"start -> final of {primary}: start = step 0 (the start policy), {final_def}; "
                 "runs with both a start and a later point",
                 f"95% percentile bootstrap of the mean of the per-seed differences final - start (seeds resampled "
                 f"with their pairs), {n_resamples} resamples, bootstrap seed {seed}")
    if imp.empty:
        _remove_table(out / "improvement")
    else:
        write_table(imp, out / "improvement", p_imp, display=format_improvement_table(imp),
                    caption=f"Start (step 0) and final {primary} per arm, and the seed-paired difference final - "
                            f"start.")
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
                    caption=f"Final {primary}: aggregate over difficulty buckets.")
    else:  # no stale table of an earlier report (e.g. another primary metric) left to be mistaken for this one
        _remove_table(out / "difficulty")

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

    # difficulty buckets: one row of panels per key family (greedy eval accuracy, the primary metric if it is
    # another eval key with buckets, training accuracy); rows padded so bucket k sits in the same column
    families = [("evals", "eval/acc", "eval accuracy")]
    if source == "evals" and primary != "eval/acc":
        families.append(("evals", primary, f"eval {primary.removeprefix('eval/')}"))
    families.append(("metrics", "reward/acc", "training accuracy"))
    diff_rows: list[list[tuple]] = []
    for src, prefix, label in families:
        fr = runs.evals if src == "evals" else runs.metrics
        names = runs.eval_names if src == "evals" else runs.metric_names
        row = []
        for k in bucket_keys(names, prefix):
            c = mean_ci_over_seeds(fr[fr["metric"] == k], x=x, smooth=smooth, seed=seed)
            row.append((f"{label}, difficulty {k.rsplit('_d', 1)[1]}\n({k})", "accuracy (fraction)", c, src == "evals"))
        if row:
            diff_rows.append(row)
    if diff_rows:
        ncols = max(len(r) for r in diff_rows)
        cells = [c for r in diff_rows for c in r + [None] * (ncols - len(r))]
        fig, _ = plot_panels([c[:3] if c else None for c in cells], colors, x=x, ncols=ncols,
                             title=f"{sweep['name']}: accuracy per difficulty bucket (mean over seeds, 95% bootstrap "
                                   f"band{sm})",
                             ylims=[ACC_LIM] * len(cells), markers=[bool(c and c[3]) for c in cells])
        name = f"difficulty_{x}.png"
        fig.savefig(out / name, dpi=dpi)
        figures.append((name, "Accuracy per difficulty bucket (d1 = easiest)."))

    fs = final_scores(frame, primary, last_k)
    if not fs.empty:
        summ = ft[ft["metric"] == primary]
        xlabel = f"final {primary}" + (" (accuracy, fraction)" if _is_fraction(primary) else "")
        start = _shared_start(frame, primary)
        ref = (start, f"start policy (step 0): {start:.3f}, mean over seeds") if start is not None else None
        fig, _ = plot_final(fs, summ, colors, xlabel=xlabel, reference=ref,
                            title=f"{sweep['name']}: final {primary} per arm\n(bar: 95% bootstrap CI of the mean; "
                                  f"tick: mean; dots: seeds)")
        name = f"final_{_slug(primary)}.png"
        fig.savefig(out / name, dpi=dpi)
        figures.append((name, f"Final {primary} per arm ({final_def})"
                              + ("; dashed line: the shared start policy (step 0), mean over seeds." if ref else ".")))

    # ---------------------------------------------------------------- report.md
    md = _report_markdown(runs, runs_dir, ft, pw, agg, primary, final_def, stat_def, figures, notes, command, p_final,
                          p_pair, p_agg, x, imp=imp, p_imp=p_imp, primary_origin=primary_origin, frame=frame,
                          buckets=buckets)
    study = (sweep.get("report") or {}).get("study")
    if study:
        from analysis.studies import study_section
        md = md.rstrip("\n") + "\n\n" + "\n".join(study_section(study, runs, out, dpi)) + "\n"
    path = out / "report.md"
    path.write_text(md)
    return path


def _report_markdown(runs: Runs, runs_dir: Path, ft, pw, agg, primary, final_def, stat_def, figures, notes, command,
                     p_final, p_pair, p_agg, x, *, imp, p_imp, primary_origin, frame, buckets) -> str:
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
    why = {"argument": "chosen for this report", "sweep.json": "from the sweep spec (sweep.json report.primary)",
           "default": "the default"}[primary_origin]
    L.append(f"- primary metric: `{primary}` ({why})")
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

    L += ["### Start -> final", ""]
    if imp.empty:
        L += [f"No run has both a step-0 (start policy) and a later point of `{primary}`: nothing to pair.", ""]
    else:
        L += [f"How far each arm moved from where it started: `{primary}` of the start policy (step 0) and at the "
              f"end ({final_def}), means over seeds; final - start is the mean of the per-seed differences, with a 95% "
              "bootstrap CI over seeds (each seed's difference resampled as a unit); improved = seeds whose "
              f"final value is above their start. With {int(imp['n'].max())} seeds the percentile bootstrap CI is "
              "coarse: read it together with the count.", ""]
        L.append(to_markdown(format_improvement_table(imp), p_imp).rstrip())
        L.append("")
        spread, n_start = _start_spread(frame, primary)
        if spread is not None and spread <= 1e-9:
            L += [f"Every arm of a seed starts from the same step-0 value ({n_start} seed(s)): one shared start "
                  "policy per seed, so the start column is the same for every arm.", ""]
        elif spread is not None:
            L += [f"**The step-0 values differ between arms of the same seed** (largest spread {spread:.3g}): the "
                  "arms did not start from the same measured policy, so their final values are not directly "
                  "comparable; final - start accounts for each run's own start.", ""]
        L += ["Also in [improvement.csv](improvement.csv) (provenance: "
              "[improvement.provenance.json](improvement.provenance.json)), [improvement.tex](improvement.tex).", ""]

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

    if agg is None or agg.empty:
        L += ["## Aggregate over difficulty buckets", "",
              "Not computed: " + (f"no per-difficulty keys `{primary}_d<k>` were logged." if not buckets else
                                  f"only one difficulty bucket of `{primary}` was logged (`{buckets[0]}`)."
                                  if len(buckets) == 1 else "no run logged every difficulty bucket."), ""]
    else:
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


if __name__ == "__main__":  # python -m analysis.report RUNS_DIR [--x tokens] [--out DIR] [--primary KEY]
    import argparse

    ap = argparse.ArgumentParser(description="write report.md, figures and tables for a folder of runs")
    ap.add_argument("runs_dir")
    ap.add_argument("--x", choices=("step", "tokens"), default="step")
    ap.add_argument("--out", default=None)
    ap.add_argument("--primary", default=None, help="metric of the main tables, e.g. eval/pass@1")
    a = ap.parse_args()
    print(write_report(a.runs_dir, out_dir=a.out, x=a.x, primary=a.primary))

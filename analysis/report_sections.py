"""report.md from numbers computed elsewhere: one function per section, each returning its Markdown lines.

:func:`render_report` takes the numbers (analysis.report_stats.ReportNumbers) and a :class:`ReportContext` (where
the data came from, the report's provenance, its figures, the regenerating commands) and computes nothing but
display strings. :func:`format_comparison_table` is the display form of a comparison table, shared with the
comparisons.{md,tex} files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from objbench.analysis import data as rdata
from objbench.analysis import prereg
from objbench.analysis.inference import INCONCLUSIVE, MIN_BOOTSTRAP_N, Comparison
from objbench.analysis.load import Runs
from objbench.analysis.provenance import format_seconds
from objbench.analysis.report_stats import ReportNumbers, start_spread
from objbench.analysis.tables import (
    format_aggregate_table,
    format_final_table,
    format_improvement_table,
    format_pairwise_table,
    to_markdown,
)

__all__ = ["ReportContext", "render_report", "format_comparison_table"]


@dataclass(frozen=True, eq=False)
class ReportContext:
    """What report.md says besides the numbers."""

    runs: Runs
    plan: prereg.Plan
    primary_origin: str
    """Where the primary metric came from: "argument", "sweep.json" or "default"."""
    x: str
    """x axis of the learning curves: "step" or "tokens"."""
    notes: list[str]
    """Warnings raised while loading the run folders."""
    spec_notes: list[str]
    """How far the declared report section can be trusted to predate the runs."""
    rprov: dict
    """The report's own provenance (report.provenance.json)."""
    figures: list[tuple[str, str]]
    """``(file name, caption)`` of each figure, in drawing order."""
    data_file: Path
    source_runs_dir: str | None
    from_data: bool
    """Made from a data file (True) or from run folders."""
    stamp_cmd: str
    """The command that remakes every table and figure from the data file."""
    folder_cmd: str | None
    """The command that remakes this report from the run folders; None when it was made from a data file."""


def render_report(ctx: ReportContext, num: ReportNumbers) -> str:
    """The text of report.md (without a study's section)."""
    L = _header(ctx)
    L += _provenance_section(ctx, num)
    L += _skipped_and_notes(ctx.runs, ctx.notes)
    L += _comparisons_section(ctx, num)
    L += _exploratory_section(ctx.plan, num)
    L += _final_section(num)
    L += _improvement_section(num)
    L += _figure_lines([f for f in ctx.figures if f[0].startswith("final_")])
    L += _pairwise_section(num)
    L += _aggregate_section(num)
    L += _curves_section(ctx)
    L += _regenerate_section(ctx)
    return "\n".join(L)


def _figure_lines(figures: list[tuple[str, str]]) -> list[str]:
    L = []
    for name, cap in figures:
        L += [f"![{cap}]({name})", "", f"*{cap}*", ""]
    return L


def _table_md(df: pd.DataFrame, prov) -> str:
    return to_markdown(df, prov).rstrip()


# ---------------------------------------------------------------------------------------------- provenance


def _header(ctx: ReportContext) -> list[str]:
    rprov = ctx.rprov
    L = [f"# Report: {ctx.runs.sweep['name']}", ""]
    if rprov["dirty"]:
        changed = ", ".join(f"`{c}`" for c in rprov["changed"][:10]) + (" ..." if len(rprov["changed"]) > 10 else "")
        L += [f"> **Made from a dirty tree**{' (forced)' if rprov['forced'] else ''}: the code at commit "
              f"`{rprov['commit']}` had uncommitted changes ({changed}), so no commit holds the code that made "
              "these numbers.", ""]
    return L


def _provenance_section(ctx: ReportContext, num: ReportNumbers) -> list[str]:
    L = ["## Provenance", ""]
    L += _source_lines(ctx)
    L += _arm_lines(ctx.runs)
    why = {"argument": "chosen for this report", "sweep.json": "from the sweep spec (sweep.json report.primary)",
           "default": "the default"}[ctx.primary_origin]
    L.append(f"- primary metric: `{num.primary}` ({why})")
    L.append(f"- statistics: {num.stat_def}; IQM = mean of the middle 50% of seeds (`scipy.stats.trim_mean`, 0.25); "
             f"{num.final_def}")
    L += _warm_start_lines(ctx.runs.meta.get("runs", []))
    for item in ctx.rprov["run_versions"]:
        L.append(f"- libraries of the runs ({item['runs']} run(s), meta.json): {_versions_text(item['versions'])}")
    L.append(_wall_time_line(ctx.rprov["wall_time"]))
    L += _this_report_lines(ctx)
    L.append("")
    return L


def _source_lines(ctx: ReportContext) -> list[str]:
    """Where the runs came from: data file or runs folder, spec hash, commits of the runs, base config, seeds."""
    sweep = ctx.runs.sweep
    if ctx.from_data:
        L = [f"- made from the data file `{ctx.data_file}` (the run folders were at `{ctx.source_runs_dir}`)"]
    else:
        L = [f"- runs folder: `{ctx.source_runs_dir}`"]
    L.append(f"- sweep spec hash: `{sweep.get('spec_hash')}`" if sweep.get("spec_hash")
             else "- sweep spec hash: n/a (no sweep.json: a plain folder of runs)")
    L.append(f"- commit of the runs: `{sweep.get('commit')}`" if sweep.get("commit")
             else "- commit of the runs: unknown")
    others = [c for c in sweep.get("run_commits", []) if c != sweep.get("commit")]
    if others:
        L.append(f"- runs were produced at other commits too: {', '.join(f'`{c}`' for c in others)}")
    dirty_runs = [c for c in sweep.get("run_commits", []) if str(c).endswith("-dirty")]
    if dirty_runs:
        L.append(f"- **runs made from a dirty tree**: {', '.join(f'`{c}`' for c in dirty_runs)}")
    if sweep.get("base_config"):
        L.append(f"- base config: `{sweep['base_config']}`")
    seeds = ctx.runs.seeds  # the count first: a lone seed 10 read "seeds: 10", like a count
    L.append(f"- seeds ({len(seeds)}): {', '.join(str(s) for s in seeds)}")
    return L


def _arm_lines(runs: Runs) -> list[str]:
    cfg = runs.configs
    L = ["- arms (colour order of every figure):"]
    for arm in runs.arms:
        sub = cfg[cfg["arm"] == arm] if not cfg.empty else cfg
        if sub.empty:
            L.append(f"  - {arm}: no runs loaded")
        else:
            incomplete = int((~sub["complete"].astype(bool)).sum())
            extra = f", {incomplete} without `done` (included on request)" if incomplete else ""
            L.append(f"  - {arm}: {len(sub)} run(s), seeds {', '.join(str(s) for s in sorted(sub['seed']))}{extra}")
    return L


def _warm_start_lines(run_recs: list[dict]) -> list[str]:
    """Whether every arm of a seed started from the same warm start (meta.json sft.weights_sha256)."""
    warm = {}
    for r in run_recs:
        warm.setdefault(r["seed"], set()).add(r.get("warm_start_sha256"))
    if not any(None not in v for v in warm.values()):
        return []
    shared = all(len(v) == 1 for v in warm.values())
    hashes = "; ".join(f"seed {s} `{'`, `'.join(sorted(str(h) for h in v))}`" for s, v in sorted(warm.items()))
    return ["- warm start (meta.json sft.weights_sha256): " + (
        "one per seed, shared by every arm of the seed: " + hashes if shared else
        "**differs between arms of the same seed** for seed(s) "
        + ", ".join(str(s) for s, v in warm.items() if len(v) > 1) + ": " + hashes)]


def _wall_time_line(wt: dict) -> str:
    if not wt["runs_timed"]:
        return "- wall time of the runs: not recorded (no meta.json start/end)"
    resumed = (f"; {wt['runs_resumed']} run(s) were resumed, their meta.json times cover the last segment only"
               if wt["runs_resumed"] else "")
    untimed = f"; {wt['runs_untimed']} run(s) without start/end" if wt["runs_untimed"] else ""
    return (f"- wall time of the runs (meta.json start/end): {format_seconds(wt['total_s'])} summed over "
            f"{wt['runs_timed']} run(s), longest {format_seconds(wt['longest_s'])}, first start to last end "
            f"{format_seconds(wt['span_s'])}{resumed}{untimed}")


def _this_report_lines(ctx: ReportContext) -> list[str]:
    """The commit, tree state, command and libraries of this report, and its data files."""
    rprov, runs, data_file = ctx.rprov, ctx.runs, ctx.data_file
    tree = ("clean tree" if rprov["dirty"] is False else "**dirty tree**" if rprov["dirty"] else "tree state unknown")
    size = data_file.stat().st_size if data_file.exists() else 0
    n_rows = int(runs.metrics[["run", "step"]].drop_duplicates().shape[0]) if not runs.metrics.empty else 0
    n_runs = len(runs.meta.get("runs", []))
    return [f"- this report: made at commit `{rprov['commit'] or 'unknown'}` ({tree}) by `{rprov['command']}`",
            f"- libraries of this report: {_versions_text(rprov['versions'])}",
            f"- data: [{rdata.DATA_FILE}]({rdata.DATA_FILE}) ({size / 1024:.0f} KiB; {n_runs} runs, "
            f"{n_rows} training steps) and [{rdata.META_FILE}]({rdata.META_FILE}); every table and figure here can be "
            f"remade from them alone: `{ctx.stamp_cmd}`"]


def _versions_text(v: dict) -> str:
    return ", ".join(f"{k} {val}" for k, val in v.items()) or "not recorded"


def _skipped_and_notes(runs: Runs, notes: list[str]) -> list[str]:
    L = []
    if runs.skipped:
        L += ["### Skipped runs", ""]
        L += [f"- `{s.run}`: {s.reason}" for s in runs.skipped]
        L.append("")
    if notes:
        L += ["<details><summary>Loading notes ({} warning{})</summary>".format(len(notes), "s" * (len(notes) != 1)),
              ""]
        L += [f"- {n}" for n in notes]
        L += ["", "</details>", ""]
    return L


# ---------------------------------------------------------------------------------------------- comparisons


def _comparisons_section(ctx: ReportContext, num: ReportNumbers) -> list[str]:
    plan, comps = ctx.plan, num.comparisons
    L = ["## Pre-registered comparisons", ""]
    L += [f"- {n}" for n in ctx.spec_notes] + ([""] if ctx.spec_notes else [])
    if not plan.declared:
        return L + ["**No comparisons were declared** in the sweep spec's `report:` section (`comparisons:` or "
                    "`baseline:`) before the runs, so this report gives no verdict on any difference between arms. "
                    "The table below is exploratory.", ""]
    L += _declared_rule(plan)
    L += [f"- {n}" for n in comps.endpoint_notes] + ([""] if comps.endpoint_notes else [])
    t = comps.declared_table
    L.append(_table_md(format_comparison_table(t.data, True, plan.alpha), t.prov))
    L += ["", "Verdicts:", ""]
    L += _floor_lines(comps.declared, plan)
    L += [_verdict_line(c, plan) for c in comps.declared]
    L += ["", "Also in [comparisons.csv](comparisons.csv) (with the per-seed differences; provenance: "
          "[comparisons.provenance.json](comparisons.provenance.json)), [comparisons.tex](comparisons.tex).", ""]
    return L


def _declared_rule(plan: prereg.Plan) -> list[str]:
    """What was declared, and the rule that resolves a comparison."""
    m = plan.family_size
    return [f"Declared in the sweep spec before the runs: endpoints "
            f"{', '.join(f'`{e.metric}` ({e.window.describe()})' for e in plan.endpoints)}; comparisons "
            f"{', '.join(f'{a} - {b}' for a, b in plan.comparisons)}; alpha = {plan.alpha:g}; min_seeds = "
            f"{plan.min_seeds}. Each comparison is the mean over seeds of the per-seed difference a - b (same seed = "
            f"same warm start and prompts). Family: {m} comparison(s) (endpoints x pairs).", "",
            f"Rule: a comparison is **resolved** only when its Bonferroni-adjusted interval (confidence "
            f"1 - {plan.alpha:g}/{m}; t, and BCa too from {MIN_BOOTSTRAP_N} seeds) excludes 0 *and* its "
            f"Holm-adjusted exact permutation p is <= {plan.alpha:g}; otherwise it is **not resolved**. The sign "
            "test and the unadjusted 95% interval are shown for reference. *80%-power MDD*: the smallest true "
            f"difference a paired t test at level {plan.alpha:g}/{m} detects with 80% probability, from the seeds "
            "and the sd of the per-seed differences: smaller effects could easily have been missed."
            + _control_rule(plan), ""]


def _control_rule(plan: prereg.Plan) -> str:
    if not plan.positive_control:
        return ""
    a, b = plan.positive_control
    return (f" Positive control (declared): {a} - {b} on `{plan.endpoints[0].label()}` must resolve as {a} > {b}; "
            f"when it does not, every other unresolved comparison is **{INCONCLUSIVE}**.")


def _floor_lines(declared: list[Comparison], plan: prereg.Plan) -> list[str]:
    """Seed counts at which no declared comparison can be resolved, whatever the data."""
    m = plan.family_size
    floor = sorted({c.n for c in declared if prereg.cannot_resolve(plan, c.n)})
    return [f"- With {n_} seeds the smallest attainable exact permutation p is 2/2^{n_} = {2.0 / 2 ** n_:.3g}, "
            f"above alpha/m = {plan.alpha:g}/{m}: at this number of seeds no declared comparison can be "
            "resolved, whatever the data." for n_ in floor]


def _verdict_line(c: Comparison, plan: prereg.Plan) -> str:
    if c.verdict in ("not resolved", INCONCLUSIVE):
        why = []
        if c.n < 2:
            why.append(f"{c.n} paired seed(s)")
        else:
            if not c.t_adj.excludes(0) or (c.bca_adj is not None and not c.bca_adj.excludes(0)):
                why.append("the adjusted interval includes 0")
            if not c.p_holm <= plan.alpha:
                why.append(f"Holm p = {c.p_holm:.3g} > {plan.alpha:g}")
            if np.isfinite(c.mdd):
                why.append(f"detectable with 80% power: |a - b| >= {c.mdd:.3g}")
        if "positive control failed" in c.reason:
            why.append("the positive control failed" if c.verdict != INCONCLUSIVE else
                       f"the positive control {plan.positive_control[0]} - {plan.positive_control[1]} was not "
                       "resolved as predicted, so this study could not have shown the effect")
        line = f"- {c.a} - {c.b} on `{c.label}`: **{c.verdict}** ({'; '.join(why)})."
    else:
        line = (f"- {c.a} - {c.b} on `{c.label}`: **resolved, {c.verdict}** (mean {c.mean:+.4g}, adjusted "
                f"interval [{c.t_adj.low:+.4g}, {c.t_adj.high:+.4g}], Holm p = {c.p_holm:.3g}).")
    if c.underpowered:
        line += f" {c.underpowered[0].upper() + c.underpowered[1:]}."
    return line


def _exploratory_section(plan: prereg.Plan, num: ReportNumbers) -> list[str]:
    if not num.comparisons.explore:
        return []
    t = num.comparisons.explore_table
    which = "Pairs of arms not declared above" if plan.declared else "Every pair of arms"
    return ["### Exploratory (not pre-registered)", "",
            f"{which}, on `{plan.endpoints[0].label()}`, per-seed differences a - b. **No verdicts; p-values are "
            "not adjusted for multiplicity**: read these as leads for a future pre-registered study, not as "
            "findings.", "",
            _table_md(format_comparison_table(t.data, False, plan.alpha), t.prov),
            "", "Also in [exploratory.csv](exploratory.csv).", ""]


def _signed(v, digits: int) -> str:
    return "n/a" if v is None or not np.isfinite(v) else f"{v:+.{digits}g}" if abs(v) < 1e-3 and v != 0 \
        else f"{v:+.{digits}f}"


def _ci_text(lo, hi, digits: int) -> str:
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "n/a (n<2)"
    return f"[{_signed(lo, digits)}, {_signed(hi, digits)}]"


def _mdd_text(v, digits: int) -> str:
    return _signed(v, digits).lstrip("+")  # an MDD is >= 0: the signed form without its "+"


def _p_text(p) -> str:
    return "n/a" if p is None or not np.isfinite(p) else f"{p:.3g}"


def format_comparison_table(df: pd.DataFrame, declared: bool, alpha: float = 0.05, digits: int = 3) -> pd.DataFrame:
    """Display form of :func:`analysis.report_stats.comparison_table`; interval columns name their method and level,
    BCa columns only when some row has >= 10 seeds."""
    pct = f"{100 * (1 - alpha):.4g}%"
    out = {"a - b": df["comparison"], "endpoint": df["endpoint"], "seeds": df["n"].astype(str),
           "mean a - b": [_signed(v, digits) for v in df["mean"]],
           f"{pct} CI (t)": [_ci_text(lo, hi, digits) for lo, hi in zip(df["t_low"], df["t_high"])]}
    has_bca = bool(df["bca_low"].notna().any()) if len(df) else False
    if has_bca:
        out[f"{pct} CI (BCa)"] = [_ci_text(lo, hi, digits) for lo, hi in zip(df["bca_low"], df["bca_high"])]
    if declared and len(df):
        adj = f"{100 * float(df['adj_confidence'].iloc[0]):.4g}%"
        out[f"adjusted {adj} CI (t)"] = [_ci_text(lo, hi, digits) for lo, hi in zip(df["t_adj_low"], df["t_adj_high"])]
        if has_bca:
            out[f"adjusted {adj} CI (BCa)"] = [_ci_text(lo, hi, digits)
                                              for lo, hi in zip(df["bca_adj_low"], df["bca_adj_high"])]
    out["a > b"] = [f"{p}/{p + n}" + (f" ({z} tied)" if z else "") for p, n, z in
                    zip(df["n_pos"], df["n_neg"], df["n_zero"])]
    out["sign p"] = [_p_text(p) for p in df["sign_p"]]
    out["permutation p"] = [_p_text(p) + ("" if ex else f" (MC {n})") for p, ex, n in
                            zip(df["perm_p"], df["perm_exact"], df["perm_n"])]
    if declared:
        out["Holm p"] = [_p_text(p) for p in df["holm_p"]]
        out["80%-power MDD"] = [_mdd_text(v, digits) for v in df["mdd80"]]
        out["verdict"] = list(df["verdict"])
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------------------------- tables, figures


def _final_section(num: ReportNumbers) -> list[str]:
    primary, ft, p_final = num.primary, num.final.data, num.final.prov
    start = (" (step 0, the start policy, counts only when a run has no later evaluation)"
             if primary.startswith("eval/") else "")
    L = ["## Final performance", "", f"`{primary}`, {num.final_def}{start}.", ""]
    L.append(_table_md(format_final_table(ft[ft["metric"] == primary]), p_final))
    L.append("")
    others = ft[ft["metric"] != primary]
    if not others.empty:
        L += ["<details><summary>All final metrics</summary>", ""]
        L.append(_table_md(format_final_table(others), p_final))
        L += ["", "</details>", ""]
    L += ["All final metrics also in [final.md](final.md), [final.csv](final.csv) "
          "(provenance: [final.provenance.json](final.provenance.json)), [final.tex](final.tex).", ""]
    return L


def _improvement_section(num: ReportNumbers) -> list[str]:
    primary, imp = num.primary, num.improvement.data
    L = ["### Start -> final", ""]
    if imp.empty:
        return L + [f"No run has both a step-0 (start policy) and a later point of `{primary}`: nothing to pair.", ""]
    L += [f"How far each arm moved from where it started: `{primary}` of the start policy (step 0) and at the "
          f"end ({num.final_def}), means over seeds; final - start is the mean of the per-seed differences, with a "
          f"95% interval over seeds (the interval column says which); improved = seeds whose final value is above "
          f"their start. Descriptive: no verdict.", ""]
    L.append(_table_md(format_improvement_table(imp), num.improvement.prov))
    L.append("")
    spread, n_start = start_spread(num.frame, primary)
    if spread is not None and spread <= 1e-9:
        L += [f"Every arm of a seed starts from the same step-0 value ({n_start} seed(s)): one shared start "
              "policy per seed, so the start column is the same for every arm.", ""]
    elif spread is not None:
        L += [f"**The step-0 values differ between arms of the same seed** (largest spread {spread:.3g}): the "
              "arms did not start from the same measured policy, so their final values are not directly "
              "comparable; final - start accounts for each run's own start.", ""]
    L += ["Also in [improvement.csv](improvement.csv) (provenance: "
          "[improvement.provenance.json](improvement.provenance.json)), [improvement.tex](improvement.tex).", ""]
    return L


def _pairwise_section(num: ReportNumbers) -> list[str]:
    L = ["## Probability of improvement", "",
         f"P(X > Y): chance that a random seed of X ends above a random seed of Y on final `{num.primary}` "
         f"(ties count 1/2); 0.5 = no difference. Descriptive, no verdict; an interval only with >= "
         f"{MIN_BOOTSTRAP_N} seeds per arm.", ""]
    if num.pairwise.data.empty:
        return L + ["Fewer than two arms: nothing to compare.", ""]
    L.append(_table_md(format_pairwise_table(num.pairwise.data), num.pairwise.prov))
    L += ["", "Also in [pairwise.csv](pairwise.csv) (provenance: "
          "[pairwise.provenance.json](pairwise.provenance.json)), [pairwise.tex](pairwise.tex).", ""]
    return L


def _aggregate_section(num: ReportNumbers) -> list[str]:
    primary, buckets, agg = num.primary, num.buckets, num.aggregate
    L = ["## Aggregate over difficulty buckets", ""]
    if agg is None or agg.data.empty:
        return L + ["Not computed: " + (f"no per-difficulty keys `{primary}_d<k>` were logged." if not buckets else
                                        f"only one difficulty bucket of `{primary}` was logged (`{buckets[0]}`)."
                                        if len(buckets) == 1 else "no run logged every difficulty bucket."), ""]
    L += [f"Final `{primary}` pooled over seeds and difficulty buckets (the interval columns say how each interval "
          "was made).", ""]
    L.append(_table_md(format_aggregate_table(agg.data), agg.prov))
    L += ["", "Also in [difficulty.csv](difficulty.csv) (provenance: "
          "[difficulty.provenance.json](difficulty.provenance.json)), [difficulty.tex](difficulty.tex).", ""]
    return L


def _curves_section(ctx: ReportContext) -> list[str]:
    L = ["## Learning curves", "", f"x axis: {'training step' if ctx.x == 'step' else 'generated tokens'}.", ""]
    return L + _figure_lines([f for f in ctx.figures if not f[0].startswith("final_")])


def _regenerate_section(ctx: ReportContext) -> list[str]:
    L = ["## Regenerate", ""]
    L += ["Runs (training):", "", "```", ctx.runs.sweep.get("command") or "n/a (no sweep.json)", "```", ""]
    if ctx.folder_cmd is not None:
        L += ["This report from the run folders:", "", "```", ctx.folder_cmd, "```", ""]
    L += [f"This report from its data file alone ({rdata.DATA_FILE} and {rdata.META_FILE}):", "", "```",
          ctx.stamp_cmd, "```", ""]
    return L

"""The numbers of a report, computed before anything is written or drawn: the pre-registered and exploratory
comparisons, the final, start -> final, P(X > Y) and difficulty tables, each with the provenance stamped on its
files.

:func:`report_numbers` returns them as one :class:`ReportNumbers`; analysis.report writes the tables,
analysis.report_figures draws from the same numbers and analysis.report_sections renders them in report.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from objbench.analysis import prereg
from objbench.analysis.inference import (
    MIN_BOOTSTRAP_N,
    Comparison,
    apply_positive_control,
    compare_declared,
    compare_exploratory,
)
from objbench.analysis.load import Runs
from objbench.analysis.report_metrics import bucket_keys, final_metrics
from objbench.analysis.tables import (
    Provenance,
    bucket_aggregate_table,
    final_table,
    improvement_table,
    pairwise_table,
)

__all__ = ["ReportTable", "Comparisons", "ReportNumbers", "report_numbers", "stat_definition", "comparison_items",
           "comparison_table", "start_spread", "shared_start"]

_PAIRED_TESTS = "t intervals (BCa from 10 seeds), exact sign test, exact paired permutation test"


@dataclass(frozen=True, eq=False)
class ReportTable:
    """A table's numbers and the provenance stamped on each of its files."""

    data: pd.DataFrame
    prov: Provenance


@dataclass(frozen=True, eq=False)
class Comparisons:
    """The pre-registered family and the exploratory pairs (see :func:`comparison_items`)."""

    declared: list[Comparison]
    """The declared comparisons with verdicts; empty when the sweep spec declared none."""
    explore: list[Comparison]
    """Pairs of arms not declared, on the first endpoint: no verdict, p-values not adjusted."""
    endpoint_notes: list[str]
    """Endpoints that no run logged, and reach-endpoints with censored runs."""
    declared_table: ReportTable
    """:func:`comparison_table` of ``declared`` (declared columns: adjusted intervals, Holm p, verdict)."""
    explore_table: ReportTable
    """:func:`comparison_table` of ``explore``."""


@dataclass(frozen=True, eq=False)
class ReportNumbers:
    """Every number of a report's tables, with the words that say how each was made."""

    primary: str
    """The primary metric (main final table, start -> final, P(X > Y), final figure, difficulty aggregate)."""
    source: str
    """Where the final tables read their values: "evals" (eval.jsonl) or "metrics" (metrics.jsonl)."""
    keys: list[str]
    """The metrics of the final table (analysis.report_metrics.final_metrics)."""
    frame: pd.DataFrame
    """The long table of ``source`` (runs.evals or runs.metrics)."""
    final_def: str
    """How a run's final value is defined, e.g. "final = the last evaluation of each run"."""
    stat_def: str
    """How the intervals are made (t below 10 seeds, BCa from 10)."""
    comparisons: Comparisons
    final: ReportTable
    improvement: ReportTable
    """Start (step 0) -> final of the primary metric; empty data when no run has a step 0 and a later point."""
    pairwise: ReportTable
    buckets: list[str]
    """The ``<primary>_d<k>`` keys that were logged."""
    aggregate: ReportTable | None
    """The aggregate over difficulty buckets; None with fewer than two buckets."""


def report_numbers(runs: Runs, plan: prereg.Plan, primary: str, opts: dict, stamp_cmd: str) -> ReportNumbers:
    """Compute a report's comparisons and tables.

    ``opts`` holds write_report's options (last_k, n_resamples, seed are read here); ``stamp_cmd`` is the command
    that remakes the tables from the data file, written into every provenance stamp.
    """
    source, keys, primary = final_metrics(runs, primary)
    frame = runs.evals if source == "evals" else runs.metrics
    last_k, n_resamples, seed = opts["last_k"], opts["n_resamples"], opts["seed"]
    point = "evaluation" if source == "evals" else "training step"
    final_def = (f"final = the last {point} of each run" if last_k == 1
                 else f"final = mean of the last {last_k} {point} points of each run")
    stat_def = stat_definition(n_resamples, seed)
    prov = _stamper(runs, stamp_cmd, stat_def)
    comparisons = _comparisons(runs, plan, n_resamples, seed, prov)
    kw = dict(arms=runs.arms, last_k=last_k, n_resamples=n_resamples, seed=seed)
    final = ReportTable(final_table(frame, keys, **kw), prov(final_def))
    improvement = _improvement(frame, primary, final_def, kw, prov)
    pairwise = _pairwise(frame, primary, final_def, kw, prov)
    buckets = bucket_keys(runs.eval_names if source == "evals" else runs.metric_names, primary)
    aggregate = _aggregate(frame, primary, buckets, final_def, kw, prov) if len(buckets) >= 2 else None
    return ReportNumbers(primary=primary, source=source, keys=keys, frame=frame, final_def=final_def,
                         stat_def=stat_def, comparisons=comparisons, final=final, improvement=improvement,
                         pairwise=pairwise, buckets=buckets, aggregate=aggregate)


def stat_definition(n_resamples: int, seed: int) -> str:
    """How the intervals of mean values are made, for provenance stamps and report.md."""
    return (f"95% t interval over seeds below {MIN_BOOTSTRAP_N} seeds, BCa bootstrap from {MIN_BOOTSTRAP_N} "
            f"({n_resamples} resamples, bootstrap seed {seed}); never a percentile bootstrap on few seeds")


def _stamper(runs: Runs, stamp_cmd: str, stat_def: str) -> Callable[..., Provenance]:
    """``prov(what, stat=stat_def)``: the provenance of one table of this report."""
    sweep = runs.sweep
    seeds = tuple(runs.seeds)

    def prov(what: str, stat: str = stat_def) -> Provenance:
        return Provenance(sweep=str(sweep["name"]), spec_hash=sweep.get("spec_hash"), commit=sweep.get("commit"),
                          seeds=seeds, runs_command=sweep.get("command"), report_command=stamp_cmd,
                          notes=f"{what}; {stat}", run_commits=tuple(sweep.get("run_commits", ())))

    return prov


def _improvement(frame: pd.DataFrame, primary: str, final_def: str, kw: dict, prov) -> ReportTable:
    n_resamples, seed = kw["n_resamples"], kw["seed"]
    imp = improvement_table(frame, primary, **kw)
    return ReportTable(imp, prov(
        f"start -> final of {primary}: start = step 0 (the start policy), {final_def}; "
        "runs with both a start and a later point",
        f"95% interval of the mean of the per-seed differences final - start: t below {MIN_BOOTSTRAP_N} "
        f"seeds, BCa bootstrap from {MIN_BOOTSTRAP_N} ({n_resamples} resamples, bootstrap seed {seed})"))


def _pairwise(frame: pd.DataFrame, primary: str, final_def: str, kw: dict, prov) -> ReportTable:
    n_resamples, seed = kw["n_resamples"], kw["seed"]
    pw = pairwise_table(frame, primary, **kw)
    return ReportTable(pw, prov(
        f"P(X > Y) on final {primary} (Mann-Whitney, ties 1/2), descriptive; {final_def}",
        f"95% two-sample BCa bootstrap only when both arms have >= {MIN_BOOTSTRAP_N} seeds, else no "
        f"interval ({n_resamples} resamples, bootstrap seed {seed})"))


def _aggregate(frame: pd.DataFrame, primary: str, buckets: list[str], final_def: str, kw: dict,
               prov) -> ReportTable:
    n_resamples, seed = kw["n_resamples"], kw["seed"]
    agg = bucket_aggregate_table(frame, buckets, **kw)
    return ReportTable(agg, prov(
        f"IQM and mean over (seeds x {len(buckets)} difficulty buckets) of final {primary}; {final_def}",
        f"from {MIN_BOOTSTRAP_N} seeds: 95% stratified BCa bootstrap (seeds resampled within each bucket, "
        f"{n_resamples} resamples, bootstrap seed {seed}); below: t interval of the mean over the "
        "seeds' bucket means, no interval for the IQM"))


def start_spread(frame: pd.DataFrame, metric: str) -> tuple[float | None, int]:
    """Step-0 values per seed across arms: (largest max - min over seeds, number of seeds with a step 0).
    0.0 means every arm of a seed started from the same measured value; None: no step 0 logged."""
    d = frame[(frame["metric"] == metric) & (frame["step"] == 0) & frame["value"].notna()]
    if d.empty:
        return None, 0
    by_seed = d.groupby("seed")["value"]
    return float((by_seed.max() - by_seed.min()).max()), int(by_seed.ngroups)


def shared_start(frame: pd.DataFrame, metric: str, tol: float = 1e-9) -> float | None:
    """Mean over seeds of the step-0 value when every arm of each seed has the same one, else None."""
    spread, _ = start_spread(frame, metric)
    if spread is None or spread > tol:
        return None
    d = frame[(frame["metric"] == metric) & (frame["step"] == 0) & frame["value"].notna()]
    return float(d.groupby("seed")["value"].first().mean())


# ---------------------------------------------------------------------------------------------- comparisons


def _comparisons(runs: Runs, plan: prereg.Plan, n_resamples: int, seed: int, prov) -> Comparisons:
    declared_items, explore_items, endpoint_notes = comparison_items(runs, plan)
    declared = compare_declared(declared_items, plan.alpha, plan.min_seeds, n_resamples, seed) if plan.declared else []
    if declared and plan.positive_control:  # declared rows are endpoint-major: the first endpoint's come first
        declared = apply_positive_control(declared, plan.comparisons.index(plan.positive_control))
    explore = compare_exploratory(explore_items, plan.alpha, n_resamples, seed)
    p_cmp = prov(f"declared in the sweep spec: endpoints {', '.join(e.label() for e in plan.endpoints)}; "
                 f"comparisons a - b per seed; alpha {plan.alpha:g}, family of {plan.family_size}, Holm over the "
                 "permutation p, intervals at 1 - alpha and Bonferroni-adjusted 1 - alpha/m", _PAIRED_TESTS)
    p_exp = prov("exploratory (not pre-registered): no verdict, p-values not adjusted", _PAIRED_TESTS)
    return Comparisons(declared=declared, explore=explore, endpoint_notes=endpoint_notes,
                       declared_table=ReportTable(comparison_table(declared, declared=True), p_cmp),
                       explore_table=ReportTable(comparison_table(explore, declared=False), p_exp))


def _frame_for(runs: Runs, metric: str) -> pd.DataFrame:
    return runs.evals if metric in set(runs.eval_names) else runs.metrics


def _endpoint_values(runs: Runs, plan: prereg.Plan) -> tuple[dict, list[str]]:
    """Per-run values of each endpoint of ``plan``, and notes: how many points each run's value was computed from
    (windows over several points), endpoints without values, censored runs."""
    notes = []
    values = {}
    ends = prereg.schedule_ends(runs.configs)
    for e in plan.endpoints:
        frame = _frame_for(runs, e.metric)
        values[e] = prereg.per_run_values(frame, e.metric, e.window, ends)
        if not values[e].empty and e.window.kind not in ("final", "reach"):
            notes.append(prereg.points_note(values[e], e.label()))
        if values[e].empty:
            notes.append(f"endpoint `{e.metric}` has no value in any run (not logged, or its window "
                         f"{e.window.label()} is empty)")
        elif e.window.kind == "reach":  # censored runs: the value lies past the run's last point
            last = frame[frame["metric"] == e.metric].groupby("run")["step"].max()
            v = values[e].set_index("run")
            cens = v[v["value"] > last.reindex(v.index)]
            per_arm = ", ".join(f"{a} {int((cens['arm'] == a).sum())}" for a in runs.present_arms)
            notes.append(f"endpoint `{e.metric}` ({e.window.label()}): {len(cens)} of {len(v)} runs never reached "
                         f"{e.window.level:g} and count as reaching it one evaluation period after their last point "
                         f"(censored; per arm: {per_arm}), so differences involving them are bounds")
    return values, notes


def comparison_items(runs: Runs, plan: prereg.Plan) -> tuple[list[tuple], list[tuple], list[str]]:
    """The inputs of the declared family and of the exploratory table: ``(declared, exploratory, notes)``.

    declared: one ``(a, b, label, seeds, d)`` per (endpoint, comparison) of ``plan``, endpoint-major.
    exploratory: the pairs of arms with runs that ``plan`` does not compare (in either direction), on its first
    endpoint, a before b in arm order; every pair when nothing was declared.
    notes: endpoints that no run logged.
    """
    values, notes = _endpoint_values(runs, plan)
    declared = []
    for e in plan.endpoints:
        for a, b in plan.comparisons:
            seeds, d = prereg.paired_differences(values[e], a, b) if not values[e].empty else ([], [])
            declared.append((a, b, e.label(), seeds, d))
    exploratory = []
    if plan.endpoints:
        e = plan.endpoints[0]
        done = {frozenset(c) for c in plan.comparisons}
        arms = runs.present_arms
        for i, a in enumerate(arms):
            for b in arms[i + 1:]:
                if frozenset((a, b)) in done or values[e].empty:
                    continue
                seeds, d = prereg.paired_differences(values[e], a, b)
                exploratory.append((a, b, e.label(), seeds, d))
    return declared, exploratory, notes


_COMPARISON_COLUMNS = ["comparison", "endpoint", "a", "b", "n", "seeds", "d", "mean", "t_low", "t_high", "bca_low",
                       "bca_high", "n_pos", "n_neg", "n_zero", "sign_p", "perm_p", "perm_n", "perm_exact", "mdd80"]
_DECLARED_COLUMNS = ["adj_confidence", "t_adj_low", "t_adj_high", "bca_adj_low", "bca_adj_high", "holm_p", "verdict",
                     "reason", "underpowered"]


def comparison_table(comps: Sequence[Comparison], declared: bool) -> pd.DataFrame:
    """Numbers of :class:`Comparison` rows: one row each, every interval and test, the per-seed differences.

    Columns: comparison, endpoint, a, b, n, seeds, d (per-seed a - b, space-separated), mean, t_low, t_high,
    bca_low, bca_high (n >= 10, else empty), n_pos, n_neg, n_zero, sign_p, perm_p, perm_n, perm_exact, mdd80 (the
    difference detectable with 80% power at the row's level: alpha / family size when declared); declared
    tables add adj_confidence, t_adj_low, t_adj_high, bca_adj_low, bca_adj_high, holm_p, verdict, reason,
    underpowered.
    """
    rows = []
    for c in comps:
        r = {"comparison": f"{c.a} - {c.b}", "endpoint": c.label, "a": c.a, "b": c.b, "n": c.n,
             "seeds": " ".join(str(s) for s in c.seeds), "d": " ".join(repr(v) for v in c.d), "mean": c.mean,
             "t_low": c.t.low, "t_high": c.t.high,
             "bca_low": c.bca.low if c.bca else np.nan, "bca_high": c.bca.high if c.bca else np.nan,
             "n_pos": c.sign.n_pos, "n_neg": c.sign.n_neg, "n_zero": c.sign.n_zero, "sign_p": c.sign.p,
             "perm_p": c.perm.p, "perm_n": c.perm.n_permutations, "perm_exact": c.perm.exact, "mdd80": c.mdd}
        if declared:
            r.update({"adj_confidence": c.t_adj.confidence, "t_adj_low": c.t_adj.low, "t_adj_high": c.t_adj.high,
                      "bca_adj_low": c.bca_adj.low if c.bca_adj else np.nan,
                      "bca_adj_high": c.bca_adj.high if c.bca_adj else np.nan, "holm_p": c.p_holm,
                      "verdict": c.verdict, "reason": c.reason, "underpowered": c.underpowered})
        rows.append(r)
    cols = _COMPARISON_COLUMNS + (_DECLARED_COLUMNS if declared else [])
    return pd.DataFrame(rows, columns=cols)

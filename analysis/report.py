"""report.md for a folder of runs: pre-registered comparisons, figures (PNG), tables (Markdown, LaTeX, CSV), the
study's raw data, and their provenance.

``write_report(runs_dir)`` is what ``objbench report RUNS_DIR`` and the end of ``objbench sweep`` call;
``write_report(data=".../runs.csv.gz")`` (``objbench report --from-data FILE``) remakes every table and figure
from the data file a report writes next to itself, without the run folders. A report made from run folders first
writes that data file and then reads it back, so both paths compute from the very same numbers and give the same
tables byte for byte. Bootstrap seeds are fixed and nothing is timestamped; the provenance block records the code
state (commit, clean or dirty tree) and library versions of the machine that made the report.

Output (default ``<runs_dir>/report/``)::

    report.md                  provenance, verdicts, tables, figures, skipped runs, the regenerating commands
    runs.csv.gz, runs_meta.json  the runs' data (analysis.data); samples.csv.gz for studies that read samples
    report.provenance.json     commit, tree state, library versions, command, wall time of the runs
    comparisons.{md,tex,csv}   the comparisons declared in the sweep spec: intervals, tests, Holm, verdict
    exploratory.{md,tex,csv}   other pairs of arms on the first endpoint: no verdict, p-values not adjusted
    curves_<x>.png             learning curves per arm (mean over seeds, 95% CI band)
    difficulty_<x>.png         accuracy per difficulty bucket
    final_<metric>.png         final score per arm: mean, 95% CI, one dot per seed
    final.{md,tex,csv}         final metrics per arm (+ final.provenance.json)
    improvement.{md,tex,csv}   start (step 0) -> final of the primary metric per arm, seed-paired (+ .provenance.json)
    pairwise.{md,tex,csv}      P(X > Y) for every pair of arms (+ .provenance.json)
    difficulty.{md,tex,csv}    IQM / mean over seeds x difficulty buckets (+ .provenance.json); only when
                               ``<primary>_d<k>`` keys were logged

Intervals: a Student t interval below 10 seeds, a BCa bootstrap from 10 on; never a percentile bootstrap on few
seeds. Every table says which it shows (analysis.stats, analysis.inference).

The primary metric (main final table, improvement table, P(X > Y), final-score figure, difficulty aggregate) is,
in this order: the ``primary`` argument (``objbench report DIR --primary eval/pass@1``); else sweep.json's
``"report": {"primary": ...}`` (copied there from the sweep spec's ``report:`` mapping); else eval/acc when
evaluations were logged, reward/acc otherwise. The comparisons that get verdicts come only from the sweep spec
(analysis.prereg); no argument of this module can add one.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import sys
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import yaml

from objbench.analysis import data as rdata
from objbench.analysis import prereg
from objbench.analysis.inference import MIN_BOOTSTRAP_N, Comparison, compare_declared, compare_exploratory
from objbench.analysis.load import Runs, load_runs
from objbench.analysis.provenance import check_clean, format_seconds, library_versions, wall_time
from objbench.analysis.plots import ACC_LIM, TRAINING_PANELS, Panel, arm_colors, metric_bounds, plot_final, plot_panels
from objbench.analysis.stats import CURVE_RESAMPLES, DEFAULT_RESAMPLES, mean_ci_over_seeds
from objbench.analysis.tables import (
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

__all__ = ["write_report", "panel_curves", "bucket_keys", "final_metrics", "resolve_primary", "report_command",
           "comparison_items", "comparison_table", "format_comparison_table", "DEFAULTS"]

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


_CLI_OPTIONS = ("x", "primary")  # write_report options that `objbench report` has flags for (besides --out)
DEFAULTS = {"x": "step", "primary": None, "last_k": 1, "smooth": None, "n_resamples": DEFAULT_RESAMPLES, "seed": 0,
            "dpi": 120}
"""write_report's options and their built-in defaults (a data file stores the values its report used)."""


def report_command(runs_dir=None, out_dir=None, x: str = "step", primary: str | None = None, *, data=None,
                   **options) -> str:
    """The command that regenerates a report: ``objbench report DIR [--x X] [--out OUT] [--primary KEY]`` (from run
    folders) or ``objbench report --from-data FILE [...]`` (from a data file) when those flags suffice, else a
    python call. ``options`` are further write_report keywords (None = default, left out)."""
    non_default = {k: v for k, v in options.items() if v is not None}
    source = ["--from-data", str(data)] if data is not None else [str(runs_dir)]
    if not non_default:
        cmd = ["objbench", "report", *source]
        if x != "step":
            cmd += ["--x", x]
        if out_dir is not None:
            cmd += ["--out", str(out_dir)]
        if primary is not None:
            cmd += ["--primary", primary]
        return " ".join(shlex.quote(c) for c in cmd)
    args = [f"data={str(data)!r}"] if data is not None else [repr(str(runs_dir))]
    if out_dir is not None:
        args.append(f"out_dir={str(out_dir)!r}")
    if x != "step":
        args.append(f"x={x!r}")
    if primary is not None:
        args.append(f"primary={primary!r}")
    args += [f"{k}={v!r}" for k, v in non_default.items()]
    return f'python -c "from objbench.analysis.report import write_report; write_report({", ".join(args)})"'


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


# ---------------------------------------------------------------------------------------------- comparisons


def _frame_for(runs: Runs, metric: str) -> pd.DataFrame:
    return runs.evals if metric in set(runs.eval_names) else runs.metrics


def comparison_items(runs: Runs, plan: prereg.Plan) -> tuple[list[tuple], list[tuple], list[str]]:
    """The inputs of the declared family and of the exploratory table: ``(declared, exploratory, notes)``.

    declared: one ``(a, b, label, seeds, d)`` per (endpoint, comparison) of ``plan``, endpoint-major.
    exploratory: the pairs of arms with runs that ``plan`` does not compare (in either direction), on its first
    endpoint, a before b in arm order; every pair when nothing was declared.
    notes: endpoints that no run logged.
    """
    notes = []
    values = {}
    for e in plan.endpoints:
        frame = _frame_for(runs, e.metric)
        values[e] = prereg.per_run_values(frame, e.metric, e.window)
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


def comparison_table(comps: Sequence[Comparison], declared: bool) -> pd.DataFrame:
    """Numbers of :class:`Comparison` rows: one row each, every interval and test, the per-seed differences.

    Columns: comparison, endpoint, a, b, n, seeds, d (per-seed a - b, space-separated), mean, t_low, t_high,
    bca_low, bca_high (n >= 10, else empty), n_pos, n_neg, n_zero, sign_p, perm_p, perm_n, perm_exact; declared
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
             "perm_p": c.perm.p, "perm_n": c.perm.n_permutations, "perm_exact": c.perm.exact}
        if declared:
            r.update({"adj_confidence": c.t_adj.confidence, "t_adj_low": c.t_adj.low, "t_adj_high": c.t_adj.high,
                      "bca_adj_low": c.bca_adj.low if c.bca_adj else np.nan,
                      "bca_adj_high": c.bca_adj.high if c.bca_adj else np.nan, "holm_p": c.p_holm,
                      "verdict": c.verdict, "reason": c.reason, "underpowered": c.underpowered})
        rows.append(r)
    cols = ["comparison", "endpoint", "a", "b", "n", "seeds", "d", "mean", "t_low", "t_high", "bca_low", "bca_high",
            "n_pos", "n_neg", "n_zero", "sign_p", "perm_p", "perm_n", "perm_exact"]
    if declared:
        cols += ["adj_confidence", "t_adj_low", "t_adj_high", "bca_adj_low", "bca_adj_high", "holm_p", "verdict",
                 "reason", "underpowered"]
    return pd.DataFrame(rows, columns=cols)


def _signed(v, digits: int) -> str:
    return "n/a" if v is None or not np.isfinite(v) else f"{v:+.{digits}g}" if abs(v) < 1e-3 and v != 0 \
        else f"{v:+.{digits}f}"


def _ci_text(lo, hi, digits: int) -> str:
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "n/a (n<2)"
    return f"[{_signed(lo, digits)}, {_signed(hi, digits)}]"


def _p_text(p) -> str:
    return "n/a" if p is None or not np.isfinite(p) else f"{p:.3g}"


def format_comparison_table(df: pd.DataFrame, declared: bool, alpha: float = 0.05, digits: int = 3) -> pd.DataFrame:
    """Display form of :func:`comparison_table`; interval columns name their method and level, BCa columns only
    when some row has >= 10 seeds."""
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
        out["verdict"] = list(df["verdict"])
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------------------------- sources


def _spec_report_section(runs_dir: Path, sweep: dict, configs: pd.DataFrame) -> tuple[dict, list[str]]:
    """The report section that declares the comparisons, and notes on how far it can be trusted to predate the
    runs.

    It is the ``report:`` of the sweep.yaml copy in the runs folder when that file hashes to sweep.json's spec_hash
    (the spec the sweep was started with), else sweep.json's ``report``. A sweep.json edited afterwards, a sweep.yaml
    that no longer matches its hash, and runs whose meta.json spec_hash differs from sweep.json's (made under
    another version of the spec) are named in the notes.
    """
    section = sweep.get("report") or {}
    section = section if isinstance(section, dict) else {}
    notes = []
    spec_hash = sweep.get("spec_hash")
    spec_file = runs_dir / "sweep.yaml"
    if spec_hash and spec_file.is_file():
        text = spec_file.read_text(encoding="utf-8")
        if hashlib.sha256(text.encode()).hexdigest()[:12] != spec_hash:
            notes.append(f"sweep.yaml in the runs folder does not hash to the spec hash `{spec_hash}`: it was edited "
                         "after the sweep started; the comparisons come from sweep.json")
        else:
            try:
                spec = yaml.safe_load(text) or {}
            except yaml.YAMLError:
                spec = {}
            from_spec = (spec.get("report") or {}) if isinstance(spec, dict) else {}
            if isinstance(from_spec, dict):
                if from_spec != section:
                    notes.append("sweep.json's report section differs from the spec the sweep was started with "
                                 f"(sweep.yaml, hash `{spec_hash}`): the comparisons come from the spec")
                section = from_spec
    if spec_hash and "meta.spec_hash" in configs.columns:
        hashes = configs["meta.spec_hash"].dropna().astype(str)
        other = sorted(set(hashes) - {str(spec_hash)})
        if other:
            notes.append(f"**{int(hashes.isin(other).sum())} run(s) were made under another version of the sweep "
                         f"spec** (hash {', '.join(f'`{h}`' for h in other)}; now `{spec_hash}`): comparisons declared "
                         "now may not have been declared before those runs")
    return section, notes


def _runs_from_folders(runs_dir: Path, include_incomplete: bool) -> tuple[Runs, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(runs_dir, include_incomplete=include_incomplete)
    notes = []
    for w in caught:  # pass them on, and list them in the report
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        notes.append(str(w.message))
    return runs, notes


def _check_study(report_cfg) -> str | None:
    study = (report_cfg or {}).get("study") if isinstance(report_cfg, dict) else None
    if study:
        from objbench.analysis.studies import STUDIES

        if study not in STUDIES:
            raise ValueError(f"unknown study {study!r}; valid: {', '.join(STUDIES)}")
    return study


# ---------------------------------------------------------------------------------------------- write_report


def write_report(runs_dir=None, out_dir=None, x: str | None = None, *, data=None, primary: str | None = None,
                 last_k: int | None = None, smooth: int | None = None, include_incomplete: bool = False,
                 n_resamples: int | None = None, seed: int | None = None, dpi: int | None = None, force: bool = False,
                 command: str | None = None) -> Path:
    """Write report.md, its tables, figures and data for a folder of runs, or remake them from a data file; returns
    the path of report.md.

    Args:
        runs_dir: a sweep folder (or any folder of run folders). Exactly one of ``runs_dir`` and ``data``.
        out_dir: where to write (default ``<runs_dir>/report``; from data: the data file's folder).
        x: x axis of the learning curves, ``"step"`` or ``"tokens"`` (generated tokens).
        data: a ``runs.csv.gz`` written by an earlier report (or its folder): remake everything from it alone.
            Options not given are those stored with the data (the original report's), so ``write_report(data=F)``
            reproduces the original tables.
        primary: the metric of the main final table, the start -> final table, P(X > Y), the final-score figure and
            the difficulty aggregate (over ``<primary>_d<k>``), e.g. ``"eval/pass@1"``. Default: sweep.json's
            ``report.primary``, else eval/acc (reward/acc without evaluations); see :func:`resolve_primary`.
        last_k: final score of a run = mean of its last ``last_k`` evaluation points (default 1).
        smooth: optional trailing rolling-mean window for the curves (off by default).
        include_incomplete: also use runs without a ``done`` file (listed as such); run folders only.
        n_resamples, seed: bootstrap settings of intervals on >= 10 seeds (default 10 000, seed 0; curves use 2 000
            resamples with the same seed).
        dpi: PNG resolution (default 120).
        force: write into the committed results/ even from a dirty tree (the report then says so at its top).
        command: the command line that made this report, recorded in its provenance (``objbench report`` passes
            its own); default: the equivalent ``objbench report`` / python command.

    Raises:
        DirtyTreeError: ``out_dir`` is in the committed results/ and the tree has uncommitted changes (no force).
        ValueError: bad arguments, an unknown primary metric, a malformed report section (before writing anything).
    """
    if (runs_dir is None) == (data is None):
        raise ValueError("give exactly one of runs_dir (run folders) and data (a runs.csv.gz from a report)")
    given = {k: v for k, v in dict(x=x, primary=primary, last_k=last_k, smooth=smooth, n_resamples=n_resamples,
                                   seed=seed, dpi=dpi).items() if v is not None}
    if "x" in given and given["x"] not in ("step", "tokens"):
        raise ValueError(f"x must be 'step' or 'tokens', got {given['x']!r}")
    notes: list[str] = []
    if data is not None:
        data_file = rdata.data_paths(data)[0]
        runs = rdata.read_data(data_file)
        stored = {**DEFAULTS, **{k: v for k, v in runs.meta.get("report_options", {}).items() if k in DEFAULTS}}
        out = Path(out_dir) if out_dir is not None else data_file.parent
        src = runs.meta.get("source", {})
        source_runs_dir = src.get("runs_dir")
        notes = list(src.get("loading_notes", []))
        spec_notes = list(src.get("spec_notes", []))
        section = src.get("prereg", runs.sweep.get("report") or {})
    else:
        runs_dir = Path(runs_dir)
        folder_runs, notes = _runs_from_folders(runs_dir, include_incomplete)
        out = Path(out_dir) if out_dir is not None else runs_dir / "report"
        data_file = out / rdata.DATA_FILE
        source_runs_dir = str(runs_dir)
        section, spec_notes = _spec_report_section(runs_dir, folder_runs.sweep, folder_runs.configs)
        stored = {**DEFAULTS, **given}
    opts = {**stored, **given}
    if opts["x"] not in ("step", "tokens"):
        raise ValueError(f"x must be 'step' or 'tokens', got {opts['x']!r}")
    # everything that can fail on the inputs fails before anything is written
    probe = runs if data is not None else folder_runs
    report_cfg = probe.sweep.get("report") or {}
    primary_key, primary_origin = resolve_primary(probe, opts["primary"])
    plan = prereg.parse_plan(section, probe.arms, primary_key)
    study = _check_study(report_cfg)
    state = check_clean(out, force=force)
    out.mkdir(parents=True, exist_ok=True)

    if data is None:
        from objbench.analysis.studies import NEEDS_SAMPLES

        samples = rdata.read_samples_jsonl(folder_runs.configs) if study in NEEDS_SAMPLES else None
        rdata.write_data(folder_runs, out, samples=samples, report_options=opts,
                         source={"runs_dir": source_runs_dir, "loading_notes": notes, "spec_notes": spec_notes,
                                 "prereg": section})
        runs = rdata.read_data(data_file)  # from here on, exactly what a reader of the data file sees
    elif out.resolve() != data_file.parent.resolve():
        for f in rdata.data_paths(data_file):  # the new folder carries its data too
            if f.exists():
                shutil.copyfile(f, out / f.name)
    return _write(runs, out, opts, stored, primary_key, primary_origin, plan, study, data_file, source_runs_dir,
                  notes, spec_notes, state, force, command, from_data=data is not None,
                  out_given=out_dir is not None)


def _stat_def(n_resamples: int, seed: int) -> str:
    return (f"95% t interval over seeds below {MIN_BOOTSTRAP_N} seeds, BCa bootstrap from {MIN_BOOTSTRAP_N} "
            f"({n_resamples} resamples, bootstrap seed {seed}); never a percentile bootstrap on few seeds")


def _write(runs: Runs, out: Path, opts: dict, stored: dict, primary: str, primary_origin: str, plan: prereg.Plan,
           study: str | None, data_file: Path, source_runs_dir: str | None, notes: list[str], spec_notes: list[str],
           state: dict, force: bool, command: str | None, *, from_data: bool, out_given: bool) -> Path:
    x, last_k, smooth, n_resamples, seed, dpi = (opts[k] for k in ("x", "last_k", "smooth", "n_resamples", "seed",
                                                                   "dpi"))
    colors = arm_colors(runs.arms)
    sweep = runs.sweep
    # the table stamp: the data file, and only the options that differ from the ones stored with it
    changed = {k: opts[k] for k in DEFAULTS if opts[k] != stored[k]}
    stamp_cmd = report_command(data=data_file, x=changed.get("x", "step"), primary=changed.get("primary"),
                               **{k: v for k, v in changed.items() if k not in ("x", "primary")})
    source, keys, primary = final_metrics(runs, primary)
    frame = runs.evals if source == "evals" else runs.metrics
    point = "evaluation" if source == "evals" else "training step"
    final_def = (f"final = the last {point} of each run" if last_k == 1
                 else f"final = mean of the last {last_k} {point} points of each run")
    stat_def = _stat_def(n_resamples, seed)
    seeds = tuple(runs.seeds)

    def prov(what: str, stat: str = stat_def) -> Provenance:
        return Provenance(sweep=str(sweep["name"]), spec_hash=sweep.get("spec_hash"), commit=sweep.get("commit"),
                          seeds=seeds, runs_command=sweep.get("command"), report_command=stamp_cmd,
                          notes=f"{what}; {stat}", run_commits=tuple(sweep.get("run_commits", ())))

    # ---------------------------------------------------------------- pre-registered comparisons
    declared_items, explore_items, endpoint_notes = comparison_items(runs, plan)
    declared = compare_declared(declared_items, plan.alpha, plan.min_seeds, n_resamples, seed) if plan.declared else []
    explore = compare_exploratory(explore_items, plan.alpha, n_resamples, seed)
    p_cmp = prov(f"declared in the sweep spec: endpoints {', '.join(e.label() for e in plan.endpoints)}; "
                 f"comparisons a - b per seed; alpha {plan.alpha:g}, family of {plan.family_size}, Holm over the "
                 "permutation p, intervals at 1 - alpha and Bonferroni-adjusted 1 - alpha/m",
                 "t intervals (BCa from 10 seeds), exact sign test, exact paired permutation test")
    p_exp = prov("exploratory (not pre-registered): no verdict, p-values not adjusted",
                 "t intervals (BCa from 10 seeds), exact sign test, exact paired permutation test")
    cmp_df = comparison_table(declared, declared=True)
    exp_df = comparison_table(explore, declared=False)
    if declared:
        write_table(cmp_df, out / "comparisons", p_cmp, display=format_comparison_table(cmp_df, True, plan.alpha),
                    caption="Pre-registered comparisons: per-seed paired differences a - b.")
    else:
        _remove_table(out / "comparisons")
    if explore:
        write_table(exp_df, out / "exploratory", p_exp, display=format_comparison_table(exp_df, False, plan.alpha),
                    caption="Exploratory comparisons (not pre-registered; no verdict).")
    else:
        _remove_table(out / "exploratory")

    # ---------------------------------------------------------------- tables
    arms = runs.arms
    ft = final_table(frame, keys, arms=arms, last_k=last_k, n_resamples=n_resamples, seed=seed)
    p_final = prov(final_def)
    write_table(ft, out / "final", p_final, display=format_final_table(ft),
                caption=f"Final metrics per arm ({final_def}).")
    imp = improvement_table(frame, primary, arms=arms, last_k=last_k, n_resamples=n_resamples, seed=seed)
    p_imp = prov(f"start -> final of {primary}: start = step 0 (the start policy), {final_def}; "
                 "runs with both a start and a later point",
                 f"95% interval of the mean of the per-seed differences final - start: t below {MIN_BOOTSTRAP_N} "
                 f"seeds, BCa bootstrap from {MIN_BOOTSTRAP_N} ({n_resamples} resamples, bootstrap seed {seed})")
    if imp.empty:
        _remove_table(out / "improvement")
    else:
        write_table(imp, out / "improvement", p_imp, display=format_improvement_table(imp),
                    caption=f"Start (step 0) and final {primary} per arm, and the seed-paired difference final - "
                            f"start.")
    pw = pairwise_table(frame, primary, arms=arms, last_k=last_k, n_resamples=n_resamples, seed=seed)
    p_pair = prov(f"P(X > Y) on final {primary} (Mann-Whitney, ties 1/2), descriptive; {final_def}",
                  f"95% two-sample BCa bootstrap only when both arms have >= {MIN_BOOTSTRAP_N} seeds, else no "
                  f"interval ({n_resamples} resamples, bootstrap seed {seed})")
    write_table(pw, out / "pairwise", p_pair, display=format_pairwise_table(pw),
                caption=f"Probability that a run of X ends above a run of Y on {primary}.")
    buckets = bucket_keys(runs.eval_names if source == "evals" else runs.metric_names, primary)
    agg, p_agg = None, None
    if len(buckets) >= 2:
        agg = bucket_aggregate_table(frame, buckets, arms=arms, last_k=last_k, n_resamples=n_resamples, seed=seed)
        p_agg = prov(f"IQM and mean over (seeds x {len(buckets)} difficulty buckets) of final {primary}; {final_def}",
                     f"from {MIN_BOOTSTRAP_N} seeds: 95% stratified BCa bootstrap (seeds resampled within each bucket, "
                     f"{n_resamples} resamples, bootstrap seed {seed}); below: t interval of the mean over the "
                     "seeds' bucket means, no interval for the IQM")
        write_table(agg, out / "difficulty", p_agg, display=format_aggregate_table(agg),
                    caption=f"Final {primary}: aggregate over difficulty buckets.")
    else:  # no stale table of an earlier report (e.g. another primary metric) left to be mistaken for this one
        _remove_table(out / "difficulty")

    # ---------------------------------------------------------------- figures
    band = f"95% CI band: t below {MIN_BOOTSTRAP_N} runs, BCa from {MIN_BOOTSTRAP_N}"
    figures: list[tuple[str, str]] = []  # (file name, caption)
    sm = f", smoothed (rolling mean of {smooth} points)" if smooth and smooth > 1 else ""
    curves = panel_curves(runs, TRAINING_PANELS, x=x, smooth=smooth, seed=seed)
    fig, _ = plot_panels(curves, colors, x=x, ncols=5,
                         title=f"{sweep['name']}: learning curves per arm (mean over seeds, {band}{sm})",
                         ylims=[p.ylim for p in TRAINING_PANELS], markers=[p.source == "evals" for p in TRAINING_PANELS],
                         bounds=[metric_bounds(p.keys[0]) for p in TRAINING_PANELS])
    name = f"curves_{x}.png"
    fig.savefig(out / name, dpi=dpi)
    figures.append((name, f"Learning curves per arm: mean over seeds, shaded 95% CI over seeds (a t interval where "
                          f"fewer than {MIN_BOOTSTRAP_N} runs cover a point, BCa bootstrap from {MIN_BOOTSTRAP_N}; "
                          "no band where a single run covers that point; bands are clipped to the metric's range, "
                          "0 to 1 for accuracies)."))

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
            row.append((f"{label}, difficulty {k.rsplit('_d', 1)[1]}\n({k})", "accuracy (fraction)", c, src == "evals",
                        metric_bounds(k)))
        if row:
            diff_rows.append(row)
    if diff_rows:
        ncols = max(len(r) for r in diff_rows)
        cells = [c for r in diff_rows for c in r + [None] * (ncols - len(r))]
        fig, _ = plot_panels([c[:3] if c else None for c in cells], colors, x=x, ncols=ncols,
                             title=f"{sweep['name']}: accuracy per difficulty bucket (mean over seeds, {band}{sm})",
                             ylims=[ACC_LIM] * len(cells), markers=[bool(c and c[3]) for c in cells],
                             bounds=[c[4] if c else None for c in cells])
        name = f"difficulty_{x}.png"
        fig.savefig(out / name, dpi=dpi)
        figures.append((name, "Accuracy per difficulty bucket (d1 = easiest)."))

    fs = final_scores(frame, primary, last_k)
    if not fs.empty:
        summ = ft[ft["metric"] == primary]
        xlabel = f"final {primary}" + (" (accuracy, fraction)" if _is_fraction(primary) else "")
        start = _shared_start(frame, primary)
        ref = (start, f"start policy (step 0): {start:.3f}, mean over seeds") if start is not None else None
        methods = sorted(set(summ["interval"]) - {"none"})
        fig, _ = plot_final(fs, summ, colors, xlabel=xlabel, reference=ref, bounds=metric_bounds(primary),
                            title=f"{sweep['name']}: final {primary} per arm\n(bar: 95% CI of the mean, "
                                  f"{' / '.join(methods) or 'none'}; tick: mean; dots: seeds)")
        name = f"final_{_slug(primary)}.png"
        fig.savefig(out / name, dpi=dpi)
        figures.append((name, f"Final {primary} per arm ({final_def})"
                              + ("; bars clipped to the metric's range" if metric_bounds(primary) else "")
                              + ("; dashed line: the shared start policy (step 0), mean over seeds." if ref else ".")))

    # ---------------------------------------------------------------- provenance of the report itself
    run_recs = runs.meta.get("runs", [])
    versions = library_versions()
    exact = command or (report_command(data=data_file, out_dir=out if out_given else None,
                                       x=changed.get("x", "step"), primary=changed.get("primary"),
                                       **{k: v for k, v in changed.items() if k not in ("x", "primary")})
                        if from_data else
                        report_command(source_runs_dir, out if out_given else None, opts["x"],
                                       primary=None if primary_origin == "default" else primary,
                                       **_nondefault(opts)))
    rprov = {"commit": state.get("commit"), "dirty": state.get("dirty"), "changed": state.get("changed", []),
             "forced": bool(force and state.get("dirty")), "command": exact, "argv": list(sys.argv),
             "versions": versions, "run_versions": _distinct_versions(run_recs), "wall_time": wall_time(run_recs),
             "source": "data file" if from_data else "run folders", "data_file": str(data_file),
             "runs_dir": source_runs_dir}
    (out / "report.provenance.json").write_text(json.dumps(rprov, indent=1, default=str) + "\n")

    # ---------------------------------------------------------------- report.md
    md = _report_markdown(runs, ft, pw, agg, primary, final_def, stat_def, figures, notes, p_final, p_pair, p_agg,
                          x, imp=imp, p_imp=p_imp, primary_origin=primary_origin, frame=frame, buckets=buckets,
                          plan=plan, declared=declared, explore=explore, cmp_df=cmp_df, exp_df=exp_df, p_cmp=p_cmp,
                          p_exp=p_exp, endpoint_notes=endpoint_notes, spec_notes=spec_notes, rprov=rprov,
                          data_file=data_file, out=out, from_data=from_data, source_runs_dir=source_runs_dir,
                          opts=opts, stamp_cmd=stamp_cmd, out_given=out_given)
    if study:
        from objbench.analysis.studies import study_section
        md = md.rstrip("\n") + "\n\n" + "\n".join(study_section(study, runs, out, dpi, plan=plan)) + "\n"
    path = out / "report.md"
    path.write_text(md)
    return path


def _nondefault(opts: dict) -> dict:
    """Options other than x and primary that differ from the built-in defaults (for a regenerating command)."""
    return {k: (v if v != DEFAULTS[k] else None) for k, v in opts.items() if k not in ("x", "primary")}


def _distinct_versions(run_recs: list[dict]) -> list[dict]:
    """Distinct ``versions`` dicts of the runs with how many runs had each: [{"versions": {...}, "runs": n}]."""
    out: list[dict] = []
    for r in run_recs:
        v = r.get("versions") or {}
        for item in out:
            if item["versions"] == v:
                item["runs"] += 1
                break
        else:
            out.append({"versions": v, "runs": 1})
    return out


def _versions_text(v: dict) -> str:
    return ", ".join(f"{k} {val}" for k, val in v.items()) or "not recorded"


def _report_markdown(runs: Runs, ft, pw, agg, primary, final_def, stat_def, figures, notes, p_final, p_pair, p_agg,
                     x, *, imp, p_imp, primary_origin, frame, buckets, plan, declared, explore, cmp_df, exp_df, p_cmp,
                     p_exp, endpoint_notes, spec_notes, rprov, data_file, out, from_data, source_runs_dir, opts,
                     stamp_cmd, out_given) -> str:
    sweep = runs.sweep
    cfg = runs.configs
    L = [f"# Report: {sweep['name']}", ""]
    if rprov["dirty"]:
        changed = ", ".join(f"`{c}`" for c in rprov["changed"][:10]) + (" ..." if len(rprov["changed"]) > 10 else "")
        L += [f"> **Made from a dirty tree**{' (forced)' if rprov['forced'] else ''}: the code at commit "
              f"`{rprov['commit']}` had uncommitted changes ({changed}), so no commit holds the code that made "
              "these numbers.", ""]
    L += ["## Provenance", ""]
    if from_data:
        L.append(f"- made from the data file `{data_file}` (the run folders were at `{source_runs_dir}`)")
    else:
        L.append(f"- runs folder: `{source_runs_dir}`")
    L.append(f"- sweep spec hash: `{sweep.get('spec_hash')}`" if sweep.get("spec_hash")
             else "- sweep spec hash: n/a (no sweep.json: a plain folder of runs)")
    L.append(f"- commit of the runs: `{sweep.get('commit')}`" if sweep.get("commit") else "- commit of the runs: unknown")
    others = [c for c in sweep.get("run_commits", []) if c != sweep.get("commit")]
    if others:
        L.append(f"- runs were produced at other commits too: {', '.join(f'`{c}`' for c in others)}")
    dirty_runs = [c for c in sweep.get("run_commits", []) if str(c).endswith("-dirty")]
    if dirty_runs:
        L.append(f"- **runs made from a dirty tree**: {', '.join(f'`{c}`' for c in dirty_runs)}")
    if sweep.get("base_config"):
        L.append(f"- base config: `{sweep['base_config']}`")
    L.append(f"- seeds: {', '.join(str(s) for s in runs.seeds)}")
    L.append("- arms (colour order of every figure):")
    for arm in runs.arms:
        sub = cfg[cfg["arm"] == arm] if not cfg.empty else cfg
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
    run_recs = runs.meta.get("runs", [])
    warm = {}
    for r in run_recs:
        warm.setdefault(r["seed"], set()).add(r.get("warm_start_sha256"))
    if any(None not in v for v in warm.values()):
        shared = all(len(v) == 1 for v in warm.values())
        hashes = "; ".join(f"seed {s} `{'`, `'.join(sorted(str(h) for h in v))}`" for s, v in sorted(warm.items()))
        L.append("- warm start (meta.json sft.weights_sha256): " + (
            "one per seed, shared by every arm of the seed: " + hashes if shared else
            "**differs between arms of the same seed** for seed(s) "
            + ", ".join(str(s) for s, v in warm.items() if len(v) > 1) + ": " + hashes))
    for item in rprov["run_versions"]:
        L.append(f"- libraries of the runs ({item['runs']} run(s), meta.json): {_versions_text(item['versions'])}")
    wt = rprov["wall_time"]
    if wt["runs_timed"]:
        resumed = (f"; {wt['runs_resumed']} run(s) were resumed, their meta.json times cover the last segment only"
                   if wt["runs_resumed"] else "")
        untimed = f"; {wt['runs_untimed']} run(s) without start/end" if wt["runs_untimed"] else ""
        L.append(f"- wall time of the runs (meta.json start/end): {format_seconds(wt['total_s'])} summed over "
                 f"{wt['runs_timed']} run(s), longest {format_seconds(wt['longest_s'])}, first start to last end "
                 f"{format_seconds(wt['span_s'])}{resumed}{untimed}")
    else:
        L.append("- wall time of the runs: not recorded (no meta.json start/end)")
    tree = ("clean tree" if rprov["dirty"] is False else "**dirty tree**" if rprov["dirty"] else "tree state unknown")
    L.append(f"- this report: made at commit `{rprov['commit'] or 'unknown'}` ({tree}) by `{rprov['command']}`")
    L.append(f"- libraries of this report: {_versions_text(rprov['versions'])}")
    size = data_file.stat().st_size if data_file.exists() else 0
    n_rows = int(runs.metrics[["run", "step"]].drop_duplicates().shape[0]) if not runs.metrics.empty else 0
    L.append(f"- data: [{rdata.DATA_FILE}]({rdata.DATA_FILE}) ({size / 1024:.0f} KiB; {len(run_recs)} runs, "
             f"{n_rows} training steps) and [{rdata.META_FILE}]({rdata.META_FILE}); every table and figure here can be "
             f"remade from them alone: `{stamp_cmd}`")
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

    # ---------------------------------------------------------------- comparisons
    L += ["## Pre-registered comparisons", ""]
    for n in spec_notes:
        L += [f"- {n}"]
    if spec_notes:
        L.append("")
    if not plan.declared:
        L += ["**No comparisons were declared** in the sweep spec's `report:` section (`comparisons:` or "
              "`baseline:`) before the runs, so this report gives no verdict on any difference between arms. The "
              "table below is exploratory.", ""]
    else:
        m = plan.family_size
        L += [f"Declared in the sweep spec before the runs: endpoints "
              f"{', '.join(f'`{e.metric}` ({e.window.describe()})' for e in plan.endpoints)}; comparisons "
              f"{', '.join(f'{a} - {b}' for a, b in plan.comparisons)}; alpha = {plan.alpha:g}; min_seeds = "
              f"{plan.min_seeds}. Each comparison is the mean over seeds of the per-seed difference a - b (same seed = "
              f"same warm start and prompts). Family: {m} comparison(s) (endpoints x pairs).", "",
              f"Rule: a comparison is **resolved** only when its Bonferroni-adjusted interval (confidence "
              f"1 - {plan.alpha:g}/{m}; t, and BCa too from {MIN_BOOTSTRAP_N} seeds) excludes 0 *and* its "
              f"Holm-adjusted exact permutation p is <= {plan.alpha:g}; otherwise it is **not resolved**. The sign "
              "test and the unadjusted 95% interval are shown for reference.", ""]
        for n in endpoint_notes:
            L.append(f"- {n}")
        if endpoint_notes:
            L.append("")
        L.append(to_markdown(format_comparison_table(cmp_df, True, plan.alpha), p_cmp).rstrip())
        L += ["", "Verdicts:", ""]
        floor = sorted({c.n for c in declared if 1 <= c.n <= 20 and 2.0 / 2 ** c.n > plan.alpha / m})
        for n_ in floor:
            L += [f"- With {n_} seeds the smallest attainable exact permutation p is 2/2^{n_} = {2.0 / 2 ** n_:.3g}, "
                  f"above alpha/m = {plan.alpha:g}/{m}: at this number of seeds no declared comparison can be "
                  "resolved, whatever the data."]
        for c in declared:
            if c.verdict == "not resolved":
                why = []
                if c.n < 2:
                    why.append(f"{c.n} paired seed(s)")
                else:
                    if not c.t_adj.excludes(0) or (c.bca_adj is not None and not c.bca_adj.excludes(0)):
                        why.append("the adjusted interval includes 0")
                    if not c.p_holm <= plan.alpha:
                        why.append(f"Holm p = {c.p_holm:.3g} > {plan.alpha:g}")
                line = f"- {c.a} - {c.b} on `{c.label}`: **not resolved** ({'; '.join(why)})."
            else:
                line = (f"- {c.a} - {c.b} on `{c.label}`: **resolved, {c.verdict}** (mean {c.mean:+.4g}, adjusted "
                        f"interval [{c.t_adj.low:+.4g}, {c.t_adj.high:+.4g}], Holm p = {c.p_holm:.3g}).")
            if c.underpowered:
                line += f" {c.underpowered[0].upper() + c.underpowered[1:]}."
            L.append(line)
        L += ["", "Also in [comparisons.csv](comparisons.csv) (with the per-seed differences; provenance: "
              "[comparisons.provenance.json](comparisons.provenance.json)), [comparisons.tex](comparisons.tex).", ""]
    if explore:
        which = "Pairs of arms not declared above" if plan.declared else "Every pair of arms"
        L += ["### Exploratory (not pre-registered)", "",
              f"{which}, on `{plan.endpoints[0].label()}`, per-seed differences a - b. **No verdicts; p-values are "
              "not adjusted for multiplicity**: read these as leads for a future pre-registered study, not as "
              "findings.", ""]
        L.append(to_markdown(format_comparison_table(exp_df, False, plan.alpha), p_exp).rstrip())
        L += ["", "Also in [exploratory.csv](exploratory.csv).", ""]

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
              f"end ({final_def}), means over seeds; final - start is the mean of the per-seed differences, with a "
              f"95% interval over seeds (the interval column says which); improved = seeds whose final value is above "
              f"their start. Descriptive: no verdict.", ""]
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
          f"(ties count 1/2); 0.5 = no difference. Descriptive, no verdict; an interval only with >= "
          f"{MIN_BOOTSTRAP_N} seeds per arm.", ""]
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
        L += [f"Final `{primary}` pooled over seeds and difficulty buckets (the interval columns say how each interval "
              "was made).", ""]
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
    if source_runs_dir and not from_data:
        L += ["This report from the run folders:", "", "```",
              report_command(source_runs_dir, out if out_given else None, opts["x"],
                             primary=None if primary_origin == "default" else primary, **_nondefault(opts)),
              "```", ""]
    L += [f"This report from its data file alone ({rdata.DATA_FILE} and {rdata.META_FILE}):", "", "```", stamp_cmd,
          "```", ""]
    return "\n".join(L)


if __name__ == "__main__":  # python -m objbench.analysis.report RUNS_DIR | --from-data FILE [--x tokens] [--out DIR] ...
    import argparse

    ap = argparse.ArgumentParser(description="write report.md, figures and tables for a folder of runs")
    ap.add_argument("runs_dir", nargs="?")
    ap.add_argument("--from-data", default=None, help="remake the report from a runs.csv.gz written by a report")
    ap.add_argument("--x", choices=("step", "tokens"), default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--primary", default=None, help="metric of the main tables, e.g. eval/pass@1")
    ap.add_argument("--force", action="store_true", help="write into the committed results/ from a dirty tree")
    a = ap.parse_args()
    print(write_report(a.runs_dir, out_dir=a.out, x=a.x, data=a.from_data, primary=a.primary, force=a.force,
                       command=shlex.join(["python", "-m", "objbench.analysis.report", *sys.argv[1:]])))

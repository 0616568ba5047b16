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

Modules: this one holds the entry points (``write_report``, the command line below) and writes the files;
analysis.report_metrics picks the metrics, analysis.report_stats computes every number, analysis.report_figures
draws the figures and analysis.report_sections renders report.md, section by section.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from objbench.analysis import data as rdata
from objbench.analysis import prereg
from objbench.analysis.load import Runs, load_runs
from objbench.analysis.provenance import check_clean, library_versions, wall_time
from objbench.analysis.report_figures import panel_curves, save_figures
from objbench.analysis.report_metrics import (  # PRIMARY_METRICS: re-exported, it was defined here
    PRIMARY_METRICS,  # noqa: F401
    bucket_keys,
    final_metrics,
    resolve_primary,
)
from objbench.analysis.report_sections import ReportContext, format_comparison_table, render_report
from objbench.analysis.report_stats import (
    ReportNumbers,
    ReportTable,
    comparison_items,
    comparison_table,
    report_numbers,
)
from objbench.analysis.stats import DEFAULT_RESAMPLES
from objbench.analysis.tables import (
    format_aggregate_table,
    format_final_table,
    format_improvement_table,
    format_pairwise_table,
    write_table,
)

__all__ = ["write_report", "panel_curves", "bucket_keys", "final_metrics", "resolve_primary", "report_command",
           "comparison_items", "comparison_table", "format_comparison_table", "DEFAULTS"]


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
        from objbench.analysis.studies import STUDY_SECTIONS

        STUDY_SECTIONS.get(study)  # ValueError naming the registered studies
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
    src = (_sources_from_data(data, out_dir) if data is not None
           else _sources_from_folders(Path(runs_dir), out_dir, include_incomplete, given))
    opts = {**src.stored, **given}
    if opts["x"] not in ("step", "tokens"):
        raise ValueError(f"x must be 'step' or 'tokens', got {opts['x']!r}")
    # everything that can fail on the inputs fails before anything is written
    report_cfg = src.runs.sweep.get("report") or {}
    primary_key, primary_origin = resolve_primary(src.runs, opts["primary"])
    plan = prereg.parse_plan(src.section, src.runs.arms, primary_key)
    study = _check_study(report_cfg)
    state = check_clean(src.out, force=force)
    src.out.mkdir(parents=True, exist_ok=True)
    runs = _place_data(src, opts, study)
    job = _Job(src=src, runs=runs, opts=opts, primary=primary_key, primary_origin=primary_origin, plan=plan,
               study=study, out_given=out_dir is not None)
    return _write(job, state, force, command)


@dataclass(frozen=True, eq=False)
class _Sources:
    """What a report is made from, read and checked before anything is written."""

    runs: Runs
    """The data file's runs, or the loaded run folders (re-read from the data file once it is written)."""
    out: Path
    stored: dict
    """The options stored with the data (DEFAULTS completed); from run folders: DEFAULTS and the given options."""
    data_file: Path
    source_runs_dir: str | None
    notes: list[str]
    """Warnings raised while loading the run folders."""
    spec_notes: list[str]
    section: dict
    """The sweep spec's report section that declares the comparisons."""
    from_data: bool


@dataclass(frozen=True, eq=False)
class _Job:
    """One report to write: its sources and its resolved options."""

    src: _Sources
    runs: Runs
    """Exactly what a reader of the data file sees."""
    opts: dict
    primary: str
    primary_origin: str
    plan: prereg.Plan
    study: str | None
    out_given: bool


def _sources_from_data(data, out_dir) -> _Sources:
    data_file = rdata.data_paths(data)[0]
    runs = rdata.read_data(data_file)
    stored = {**DEFAULTS, **{k: v for k, v in runs.meta.get("report_options", {}).items() if k in DEFAULTS}}
    src = runs.meta.get("source", {})
    return _Sources(runs=runs, out=Path(out_dir) if out_dir is not None else data_file.parent, stored=stored,
                    data_file=data_file, source_runs_dir=src.get("runs_dir"),
                    notes=list(src.get("loading_notes", [])), spec_notes=list(src.get("spec_notes", [])),
                    section=src.get("prereg", runs.sweep.get("report") or {}), from_data=True)


def _sources_from_folders(runs_dir: Path, out_dir, include_incomplete: bool, given: dict) -> _Sources:
    runs, notes = _runs_from_folders(runs_dir, include_incomplete)
    out = Path(out_dir) if out_dir is not None else runs_dir / "report"
    section, spec_notes = _spec_report_section(runs_dir, runs.sweep, runs.configs)
    return _Sources(runs=runs, out=out, stored={**DEFAULTS, **given}, data_file=out / rdata.DATA_FILE,
                    source_runs_dir=str(runs_dir), notes=notes, spec_notes=spec_notes, section=section,
                    from_data=False)


def _place_data(src: _Sources, opts: dict, study: str | None) -> Runs:
    """Put the data file into the output folder; returns the runs as read back from it."""
    if not src.from_data:
        from objbench.analysis.studies import reads_samples

        samples = rdata.read_samples_jsonl(src.runs.configs) if reads_samples(study) else None
        rdata.write_data(src.runs, src.out, samples=samples, report_options=opts,
                         source={"runs_dir": src.source_runs_dir, "loading_notes": src.notes,
                                 "spec_notes": src.spec_notes, "prereg": src.section})
        return rdata.read_data(src.data_file)  # from here on, exactly what a reader of the data file sees
    if src.out.resolve() != src.data_file.parent.resolve():
        for f in rdata.data_paths(src.data_file):  # the new folder carries its data too
            if f.exists():
                shutil.copyfile(f, src.out / f.name)
    return src.runs


def _write(job: _Job, state: dict, force: bool, command: str | None) -> Path:
    """Compute the numbers, then write the tables, figures, report.provenance.json and report.md."""
    src, out = job.src, job.src.out
    # the table stamp: the data file, and only the options that differ from the ones stored with it
    changed = {k: job.opts[k] for k in DEFAULTS if job.opts[k] != src.stored[k]}
    stamp_cmd = _data_command(src.data_file, changed)
    num = report_numbers(job.runs, job.plan, job.primary, job.opts, stamp_cmd)
    _write_tables(num, out, job.plan.alpha)
    figures = save_figures(job.runs, num, out, job.opts)
    folder_cmd = None if src.from_data else _folder_command(job, num.primary)
    exact = command or (_data_command(src.data_file, changed, out if job.out_given else None) if src.from_data
                        else folder_cmd)
    rprov = _report_provenance(job, state, force, exact)
    (out / "report.provenance.json").write_text(json.dumps(rprov, indent=1, default=str) + "\n")
    ctx = ReportContext(runs=job.runs, plan=job.plan, primary_origin=job.primary_origin, x=job.opts["x"],
                        notes=src.notes, spec_notes=src.spec_notes, rprov=rprov, figures=figures,
                        data_file=src.data_file, source_runs_dir=src.source_runs_dir, from_data=src.from_data,
                        stamp_cmd=stamp_cmd, folder_cmd=folder_cmd)
    md = render_report(ctx, num)
    if job.study:
        from objbench.analysis.studies import study_section
        md = md.rstrip("\n") + "\n\n" + "\n".join(study_section(job.study, job.runs, out, job.opts["dpi"],
                                                                 plan=job.plan)) + "\n"
    path = out / "report.md"
    path.write_text(md)
    return path


def _data_command(data_file: Path, changed: dict, out_dir: Path | None = None) -> str:
    """``objbench report --from-data FILE`` with the options that differ from the ones stored with the data."""
    return report_command(data=data_file, out_dir=out_dir, x=changed.get("x", "step"), primary=changed.get("primary"),
                          **{k: v for k, v in changed.items() if k not in ("x", "primary")})


def _folder_command(job: _Job, primary: str) -> str:
    """The command that remakes this report from the run folders."""
    return report_command(job.src.source_runs_dir, job.src.out if job.out_given else None, job.opts["x"],
                          primary=None if job.primary_origin == "default" else primary, **_nondefault(job.opts))


def _report_provenance(job: _Job, state: dict, force: bool, command: str) -> dict:
    """report.provenance.json: the code state and libraries of this report, and the runs' versions and wall time."""
    run_recs = job.runs.meta.get("runs", [])
    return {"commit": state.get("commit"), "dirty": state.get("dirty"), "changed": state.get("changed", []),
            "forced": bool(force and state.get("dirty")), "command": command, "argv": list(sys.argv),
            "versions": library_versions(), "run_versions": _distinct_versions(run_recs),
            "wall_time": wall_time(run_recs), "source": "data file" if job.src.from_data else "run folders",
            "data_file": str(job.src.data_file), "runs_dir": job.src.source_runs_dir}


def _write_tables(num: ReportNumbers, out: Path, alpha: float) -> None:
    """Every table of the report as .md, .tex, .csv and .provenance.json; a table not made this time is removed, so
    that no stale table of an earlier report (e.g. another primary metric) is left to be mistaken for this one."""
    c, primary = num.comparisons, num.primary
    _put_table(c.declared_table if c.declared else None, out / "comparisons",
               lambda df: format_comparison_table(df, True, alpha),
               "Pre-registered comparisons: per-seed paired differences a - b.")
    _put_table(c.explore_table if c.explore else None, out / "exploratory",
               lambda df: format_comparison_table(df, False, alpha),
               "Exploratory comparisons (not pre-registered; no verdict).")
    _put_table(num.final, out / "final", format_final_table, f"Final metrics per arm ({num.final_def}).")
    _put_table(None if num.improvement.data.empty else num.improvement, out / "improvement", format_improvement_table,
               f"Start (step 0) and final {primary} per arm, and the seed-paired difference final - start.")
    _put_table(num.pairwise, out / "pairwise", format_pairwise_table,
               f"Probability that a run of X ends above a run of Y on {primary}.")
    _put_table(num.aggregate, out / "difficulty", format_aggregate_table,
               f"Final {primary}: aggregate over difficulty buckets.")


def _put_table(table: ReportTable | None, stem: Path, display, caption: str) -> None:
    if table is None:
        _remove_table(stem)
    else:
        write_table(table.data, stem, table.prov, display=display(table.data), caption=caption)


def _remove_table(stem: Path) -> None:
    for ext in (".md", ".tex", ".csv", ".provenance.json"):
        stem.with_name(stem.name + ext).unlink(missing_ok=True)


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


if __name__ == "__main__":  # python -m objbench.analysis.report RUNS_DIR | --from-data FILE [--x tokens] [--out DIR]
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

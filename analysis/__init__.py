"""Analysis of objbench runs, read from disk: DataFrames, statistics, figures, tables and report.md.

Imports nothing else from objbench but ``envs.passk`` (pass@k, which the training loop logs with; re-exported by
``stats``); it only knows the run-folder format (see ``analysis.load``), so it works on results copied from a
cluster.

    from objbench.analysis import load_runs, write_report
    runs = load_runs("results/runs/quickstart")       # long DataFrames: runs.metrics, runs.evals, runs.configs
    write_report("results/runs/quickstart")           # -> results/runs/quickstart/report/report.md (+ runs.csv.gz)
    write_report(data="results/quickstart/runs.csv.gz", out_dir="/tmp/q")   # the same tables from the data alone

Modules: ``load`` (reading), ``stats`` (intervals of a mean: t below 10 seeds, BCa from 10; IQM, P(X > Y), pass@k,
curve bands), ``inference`` (paired differences: t / BCa intervals, exact sign and permutation tests, Holm,
verdicts), ``windows`` (how a run's curve becomes one number, per-run values, paired differences), ``prereg`` (the
comparisons a sweep spec declares), ``data`` (the committed per-study data file), ``provenance`` (commit, tree
state, versions, wall time; no report into results/ from a dirty tree), ``plots`` (figures from precomputed numbers;
``plots_studies`` the studies' figures: the only modules that draw), ``tables`` (final tables with provenance),
``report`` (all of it into report.md: the entry points; ``report_metrics`` picks the metrics, ``report_stats``
computes the numbers, ``report_figures`` draws, ``report_sections`` renders the Markdown), ``studies`` (the study
sections, each registered once in ``studies.STUDY_SECTIONS``, and the KL-estimator study's verdicts and README),
``synthetic`` (fake sweeps for tests and demos).
"""

from objbench.analysis.load import Runs, load_runs

__all__ = ["Runs", "load_runs", "write_report"]


def __getattr__(name):  # write_report imports matplotlib: load it only when asked for
    if name == "write_report":
        from objbench.analysis.report import write_report

        return write_report
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")

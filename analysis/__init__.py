"""Analysis of objbench runs, read from disk: DataFrames, statistics, figures, tables and report.md.

Imports nothing else from objbench; it only knows the run-folder format (see ``analysis.load``), so it works on
results copied from a cluster.

    from analysis import load_runs, write_report
    runs = load_runs("results/runs/quickstart")       # long DataFrames: runs.metrics, runs.evals, runs.configs
    write_report("results/runs/quickstart")           # -> results/runs/quickstart/report/report.md

Modules: ``load`` (reading), ``stats`` (bootstrap CIs, IQM, P(X > Y), pass@k, curve bands), ``plots`` (figures
from precomputed numbers), ``tables`` (final tables with provenance), ``report`` (all of it into report.md),
``synthetic`` (a fake sweep for tests and demos).
"""

from analysis.load import Runs, load_runs

__all__ = ["Runs", "load_runs", "write_report"]


def __getattr__(name):  # write_report imports matplotlib: load it only when asked for
    if name == "write_report":
        from analysis.report import write_report

        return write_report
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")

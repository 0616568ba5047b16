"""Which metrics a report shows: the primary metric (and where it came from), the keys of the final table, the
per-difficulty bucket keys of a metric.

analysis.report re-exports these names; they live here so that the modules computing and drawing a report's
numbers (analysis.report_stats, analysis.report_figures) can use them without importing the entry point.
"""

from __future__ import annotations

import re
from typing import Sequence

from objbench.analysis.load import Runs

__all__ = ["PRIMARY_METRICS", "bucket_keys", "resolve_primary", "final_metrics"]

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

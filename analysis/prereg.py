"""Pre-registration: what a sweep spec's ``report:`` section declares before the runs (the ``Plan``), checked when
the spec is loaded.

Spec keys (all optional; ``objbench sweep`` copies the section into sweep.json, where the report reads it)::

    report:
      primary: eval/pass@1        # headline metric of the tables; also the endpoint when `endpoints` is absent
      window: final               # window of the primary endpoint (default final; see below)
      endpoints:                  # optional: the measures that get verdicts, when they are not (only) the primary
        - {metric: length/incorrect, window: {last: 50}}
      comparisons:                # [a, b] pairs: the per-seed difference a - b ...
        - [seq_mean_token_mean, token_mean]
      baseline: group_std         # ... or every other arm minus this one (both may be given; duplicates dropped)
      positive_control: [verdict_seq_mean, verdict_token_mean]   # optional: the comparison (one of the above,
                                  # on the first endpoint) that must resolve as a > b for the study to be able to
                                  # show the effect; when it does not, the other unresolved comparisons are
                                  # "inconclusive (positive control failed)" (analysis.inference)
      alpha: 0.05                 # family-wise error rate over endpoints x comparisons (Holm); default 0.05
      min_seeds: 10               # fewer paired seeds -> the report says "underpowered"; default 10
      study: length_bias          # a registered study section (analysis/studies/)

Windows, endpoints, per-run values and paired differences: analysis.windows (its docstring lists the forms a
``window:`` may take); re-exported here, where the report section's callers have always found them.

The Holm family is every (endpoint, comparison) pair; a report gives verdicts for those and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from objbench.analysis.windows import (Endpoint, Window, paired_differences, parse_window, per_run_values, points_note,
                                      schedule_ends)

__all__ = [
    "REPORT_KEYS",
    "DEFAULT_ALPHA",
    "DEFAULT_MIN_SEEDS",
    "Window",
    "Endpoint",
    "Plan",
    "parse_window",
    "parse_plan",
    "check_report_spec",
    "per_run_values",
    "schedule_ends",
    "points_note",
    "eval_window_problems",
    "paired_differences",
]

REPORT_KEYS = ("primary", "window", "endpoints", "comparisons", "baseline", "positive_control", "alpha", "min_seeds",
               "study")
"""Keys a sweep spec's ``report:`` section may hold."""
DEFAULT_ALPHA = 0.05
DEFAULT_MIN_SEEDS = 10


@dataclass(frozen=True)
class Plan:
    """What a report tests, as declared before the runs.

    Attributes:
        endpoints: the measures that get verdicts.
        comparisons: ``(a, b)`` arm pairs, difference a - b per seed; empty when nothing was declared.
        alpha, min_seeds: as in the spec.
        declared: True when the spec declared comparisons (else the report gives no verdicts).
        positive_control: the comparison ``(a, b)`` expected to resolve as a > b on the first endpoint, or None.
    """

    endpoints: tuple[Endpoint, ...]
    comparisons: tuple[tuple[str, str], ...]
    alpha: float = DEFAULT_ALPHA
    min_seeds: int = DEFAULT_MIN_SEEDS
    positive_control: tuple[str, str] | None = None

    @property
    def declared(self) -> bool:
        return bool(self.comparisons)

    @property
    def family_size(self) -> int:
        return len(self.endpoints) * len(self.comparisons)

    def to_spec(self) -> dict:
        spec = {"endpoints": [e.to_spec() for e in self.endpoints], "comparisons": [list(c) for c in self.comparisons],
                "alpha": self.alpha, "min_seeds": self.min_seeds}
        if self.positive_control:
            spec["positive_control"] = list(self.positive_control)
        return spec


def _comparisons(report: dict, arms: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    raw = report.get("comparisons")
    if raw is not None:
        if not isinstance(raw, list):
            raise ValueError(f"report.comparisons must be a list of [arm_a, arm_b] pairs, got {raw!r}")
        for c in raw:
            if (not isinstance(c, (list, tuple)) or len(c) != 2 or not all(isinstance(x, str) for x in c)
                    or c[0] == c[1]):
                raise ValueError(f"report.comparisons: each entry is [arm_a, arm_b] with two different arm names, "
                                 f"got {c!r}")
            pairs.append((c[0], c[1]))
    base = report.get("baseline")
    if base is not None:
        if not isinstance(base, str):
            raise ValueError(f"report.baseline must be an arm name, got {base!r}")
        if arms is None:
            raise ValueError("report.baseline needs the sweep's arm list")
        pairs += [(a, base) for a in arms if a != base]
    if arms is not None:
        unknown = sorted({x for p in pairs for x in p} - set(arms) | ({base} - set(arms) if base else set()))
        if unknown:
            raise ValueError(f"report comparisons name unknown arm(s) {unknown}; arms: {', '.join(arms)}")
    seen, out = set(), []
    for p in pairs:
        if p in seen:
            continue
        if (p[1], p[0]) in seen:
            raise ValueError(f"report comparisons declare both {list(p)} and {[p[1], p[0]]}: declare one direction")
        seen.add(p)
        out.append(p)
    return tuple(out)


def parse_plan(report: dict | None, arms: Sequence[str] | None = None, primary: str | None = None) -> Plan:
    """The :class:`Plan` of a ``report:`` section.

    Args:
        report: the section (sweep.json ``report``); None or {} = nothing declared.
        arms: the sweep's arms (checks the comparisons' names, expands ``baseline``); None skips the check.
        primary: the primary metric to use when the section names none (the report's resolved default).

    Raises:
        ValueError: unknown keys, malformed values, unknown arms; the message names the key.
    """
    report = report or {}
    if not isinstance(report, dict):
        raise ValueError(f"the report section must be a mapping, got {report!r}")
    unknown = sorted(set(report) - set(REPORT_KEYS))
    if unknown:
        raise ValueError(f"unknown report key(s) {unknown}; valid: {', '.join(REPORT_KEYS)}")
    alpha = report.get("alpha", DEFAULT_ALPHA)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"report.alpha must be a number in (0, 1), got {alpha!r}")
    min_seeds = report.get("min_seeds", DEFAULT_MIN_SEEDS)
    if isinstance(min_seeds, bool) or not isinstance(min_seeds, int) or min_seeds < 2:
        raise ValueError(f"report.min_seeds must be an integer >= 2, got {min_seeds!r}")
    window = parse_window(report.get("window"))
    eps = report.get("endpoints")
    if eps is not None:
        if not isinstance(eps, list) or not eps:
            raise ValueError("report.endpoints must be a non-empty list of {metric: KEY, window: WINDOW}")
        endpoints = []
        for e in eps:
            if isinstance(e, str):
                e = {"metric": e}
            if not isinstance(e, dict) or "metric" not in e or set(e) - {"metric", "window"} or not isinstance(
                    e["metric"], str):
                raise ValueError(f"report.endpoints: each entry is {{metric: KEY, window: WINDOW}}, got {e!r}")
            endpoints.append(Endpoint(e["metric"], parse_window(e.get("window"))))
        if len(set(endpoints)) != len(endpoints):
            raise ValueError("report.endpoints lists the same endpoint twice")
    else:
        metric = report.get("primary", primary)
        if metric is not None and not isinstance(metric, str):
            raise ValueError(f"report.primary must be a metric name, got {metric!r}")
        endpoints = [Endpoint(metric, window)] if metric else []
    comparisons = _comparisons(report, arms)
    if comparisons and not endpoints:
        raise ValueError("report comparisons are declared but no endpoint: give report.primary or report.endpoints")
    control = report.get("positive_control")
    if control is not None:
        if not isinstance(control, (list, tuple)) or tuple(control) not in comparisons:
            raise ValueError(f"report.positive_control must be one of the declared comparisons [a, b] (expected "
                             f"a > b on the first endpoint), got {control!r}")
        control = tuple(control)
    return Plan(tuple(endpoints), comparisons, float(alpha), int(min_seeds), control)


def check_report_spec(report: Any, arms: Sequence[str] | None = None) -> None:
    """Validate a sweep spec's ``report:`` section when the spec is loaded (before any run): raises ValueError
    with the problem. The study name is checked against the registry of study sections (analysis.studies), which is
    imported only for a section that names a study (it draws, so it loads matplotlib)."""
    plan_input = report if report is not None else {}
    parse_plan(plan_input, arms)
    if isinstance(report, dict) and "study" in report:
        from objbench.analysis.studies import STUDY_SECTIONS

        if report["study"] not in STUDY_SECTIONS:
            raise ValueError(f"report.study {report['study']!r} is not one of {', '.join(STUDY_SECTIONS.names())}")


def _eval_steps_in(w: Window, steps: int, every: int) -> int:
    """How many evaluations (steps 0, every, 2 every, ..., and the last step) window ``w`` can hold in a run of
    ``steps`` steps; change windows: the smaller of their two parts."""
    if w.kind == "change":
        return min(_eval_steps_in(w.start, steps, every), _eval_steps_in(w.end, steps, every))
    evals = sorted({0, steps, *range(every, steps + 1, every)})
    if w.kind == "steps":
        return sum(w.lo <= s <= w.hi for s in evals)
    if w.kind == "last":
        return sum(steps - w.k < s <= steps and s > 0 for s in evals)
    return len(evals)


def eval_window_problems(plan: Plan, schedules: dict[str, tuple[int, int]]) -> list[str]:
    """Declared endpoints on an evaluation metric (``eval/...``) whose window holds no evaluation in some arm's
    schedule, as messages; ``schedules``: arm -> (train.steps, train.eval_every)."""
    problems = []
    for e in plan.endpoints:
        if not e.metric.startswith("eval/"):
            continue
        for arm, (steps, every) in schedules.items():
            if _eval_steps_in(e.window, steps, every) == 0:
                problems.append(f"endpoint {e.metric} ({e.window.label()}) holds no evaluation in arm {arm!r}: it "
                                f"evaluates at step 0, every {every} steps and at its last step {steps}")
    return problems


def unresolvable_warning(plan: Plan, n_seeds: int) -> str | None:
    """A note when no declared comparison can be resolved at ``n_seeds`` paired seeds, whatever the data: a
    comparison resolves only with a Holm-adjusted exact permutation p <= alpha, so its raw p must reach alpha/m (m the
    family size), and the smallest p the exact test can give is 2/2^n. None when it can, or nothing is declared."""
    from objbench.analysis.inference import smallest_permutation_p

    if not cannot_resolve(plan, n_seeds):
        return None
    level = plan.alpha / plan.family_size
    need = next(n for n in range(n_seeds + 1, 64) if not cannot_resolve(plan, n))
    return (f"note: at {n_seeds} seeds no declared comparison can be resolved, whatever the data: the smallest exact "
            f"permutation p is 2/2^{n_seeds} = {smallest_permutation_p(n_seeds):.3g}, above alpha/m = {plan.alpha:g}/"
            f"{plan.family_size} = {level:.3g} ({need} seeds reach it); its comparisons can only be descriptive")


def cannot_resolve(plan: Plan, n_seeds: int) -> bool:
    """True when the plan declares comparisons and none can be resolved at ``n_seeds`` paired seeds whatever the data:
    the smallest exact permutation p, 2/2^n, lies above alpha/m (Holm's first step)."""
    from objbench.analysis.inference import smallest_permutation_p

    return plan.declared and n_seeds >= 1 and smallest_permutation_p(n_seeds) > plan.alpha / plan.family_size

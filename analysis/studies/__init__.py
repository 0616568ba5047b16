"""Studies: the study sections a sweep's report.md can end with, and the analysis of the stand-alone KL-estimator
study.

Study sections (issue 5). A sweep spec names its study in ``report: {study: NAME}``; ``objbench report`` then appends
that study's section. Each is registered once, in its own module, in :data:`STUDY_SECTIONS` (``registry``), which
analysis.prereg (the spec's study name) and analysis.report (the section, and whether its data keeps the samples)
both read. Every number is computed from the files on disk (metrics.jsonl, samples.jsonl), so a section can be
regenerated from results copied off a cluster.

- ``length_bias`` (length_bias.py): length of correct and incorrect responses at the start and end of training,
  length by correctness over steps, accuracy against length.
- ``difficulty_bias`` (difficulty_bias.py): a group's total advantage weight against its pass rate, measured and in
  closed form; per-bucket accuracy and weight share.
- ``kl_estimators`` (kl_training.py): exact reverse and forward KL, the estimators and accuracy at the end of
  training per (estimator, placement) arm.
- ``off_policy`` (off_policy.py): clip fractions, log-ratio spreads, gradient-norm stability, GRPO/GSPO on-policy.

Shared by the sections: ``measures`` (start/end windows, per-arm tables, exploratory paired differences, smoothed
curves) and ``markdown`` (their tables). Their figures are drawn by analysis.plots_studies.

Intervals over seeds are t intervals below 10 seeds (BCa from 10; the tables say which). Paired comparisons that
the sweep spec declares get their verdicts in the report's "Pre-registered comparisons" section and are not
repeated here; the paired tables hold only the others, labelled exploratory: no verdict, p-values (exact sign and
permutation tests) not adjusted.

The KL-estimator study (no training; results/kl_estimators): ``kl_config`` (its settings, estimators and verdict
thresholds), ``kl_verdicts`` (one verdict per claim), ``kl_report`` (tables, findings, figure, README.md). Its
compute (sampling, scoring, gradients) and its command are objbench.experiments.studies.kl_estimators.
"""

from __future__ import annotations

from pathlib import Path

# importing a section's module registers it; the order here is the order of STUDY_SECTIONS.names()
from objbench.analysis.studies import length_bias, difficulty_bias, kl_training, off_policy  # noqa: F401, I001
from objbench.analysis.studies.difficulty_bias import closed_form_weight
from objbench.analysis.studies.measures import end_table, paired_diff, window_table
from objbench.analysis.studies.registry import STUDY_SECTIONS, StudySection

__all__ = ["STUDY_SECTIONS", "StudySection", "study_section", "reads_samples", "closed_form_weight", "window_table",
           "end_table", "paired_diff"]


def study_section(study: str, runs, out: Path, dpi: int = 120, plan=None) -> list[str]:
    """Markdown lines of a registered study's section (figures and CSVs written to ``out``). ``plan``: the report's
    ``analysis.prereg.Plan``; paired comparisons it declares are left out of the study's exploratory tables.
    Raises ValueError for a study that is not registered."""
    return STUDY_SECTIONS.get(study).write(runs, Path(out), dpi, plan=plan)


def reads_samples(study: str | None) -> bool:
    """Whether the registered study ``study`` reads samples.jsonl (False for None or an unregistered name)."""
    return study in STUDY_SECTIONS and STUDY_SECTIONS.get(study).reads_samples

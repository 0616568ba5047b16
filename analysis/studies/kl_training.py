"""Study section ``kl_estimators`` (KL estimators in training): reverse and forward exact KL to the reference, the
estimators' values and training accuracy at the end of training, per (estimator, placement) arm, and paired
against the ``no_kl`` control. (The stand-alone KL-estimator study, without training, is kl_config / kl_report /
kl_verdicts beside this module.)"""

from __future__ import annotations

from pathlib import Path

from objbench.analysis.studies.markdown import md_end, md_paired
from objbench.analysis.studies.measures import end_table, paired_diff, undeclared
from objbench.analysis.studies.registry import STUDY_SECTIONS

__all__ = ["kl_estimators"]


@STUDY_SECTIONS.register("kl_estimators")
def kl_estimators(runs, out: Path, dpi: int = 120, plan=None) -> list[str]:
    """The section: end-window table (kl_training.csv) and the paired table arm minus no_kl; no figure."""
    et = end_table(runs, ["kl/exact", "kl/exact_fwd", "kl/k1", "kl/k2", "kl/k3", "reward/acc", "length/mean"])
    et.to_csv(out / "kl_training.csv", index=False)
    L = ["## Study: KL estimators in training", "",
         "Each arm adds beta = 0.04 times one estimator (k1, k2, k3 of log pi/pi_ref) either to the reward "
         "(before advantages) or to the loss (aggregated like the policy term); `no_kl` is the control. Measured: "
         "the exact per-token reverse KL(pi || pi_ref) and forward KL(pi_ref || pi) over the full vocabulary, the "
         "estimators' values on the sampled tokens, and training accuracy, averaged over the last 50 steps.", ""]
    L += md_end(et, 4)
    if "no_kl" in runs.present_arms:
        pr = [paired_diff(runs, m_, arm, "no_kl") for m_ in ("kl/exact", "kl/exact_fwd", "reward/acc")
              for arm in runs.present_arms if arm != "no_kl"]
        pr, n_decl = undeclared(pr, plan)
        L += ["", "Paired by seed, end window, arm minus no_kl:", ""] + md_paired(pr, "a - b", 4, n_decl)
    L += ["", "Also in [kl_training.csv](kl_training.csv).", ""]
    return L

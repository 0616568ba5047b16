"""Study section ``off_policy`` (GRPO vs GSPO over minibatches per rollout): clip fractions, the spread of the token
and sequence log-ratios, gradient-norm stability, and whether GRPO and GSPO coincide at one minibatch per rollout."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from objbench.analysis.stats import mean_ci
from objbench.analysis.studies.markdown import fmt, md_end, md_paired
from objbench.analysis.studies.measures import end_table, paired_diff, undeclared
from objbench.analysis.studies.registry import STUDY_SECTIONS
from objbench.analysis.windows import Window

__all__ = ["off_policy", "on_policy_equivalence"]


@STUDY_SECTIONS.register("off_policy")
def off_policy(runs, out: Path, dpi: int = 120, plan=None) -> list[str]:
    """The section: end-window table (off_policy.csv), gradient-norm stability, GSPO minus GRPO paired tables and
    the on-policy equivalence check; no figure."""
    metrics = ["policy/clipfrac_low", "policy/clipfrac_high", "policy/log_ratio_std", "policy/seq_log_ratio_std",
               "optim/grad_norm", "reward/acc"]
    et = end_table(runs, metrics)
    # stability: std over steps of the grad norm, per run
    gn = runs.metrics[runs.metrics["metric"] == "optim/grad_norm"]
    stab = gn.groupby(["run", "arm", "seed"], as_index=False)["value"].std()
    et.to_csv(out / "off_policy.csv", index=False)
    L = ["## Study: off-policy updates, GRPO vs GSPO", "",
         "n_minibatches optimizer steps per rollout batch (1 = on-policy). Token-level ratio (GRPO, clip 0.2) vs "
         "sequence-level ratio (GSPO, clip 3e-4/4e-4). Clip fractions count tokens (GRPO) or sequences (GSPO); "
         "log-ratio spreads are measured at the start of each optimizer step (0 on the first one).", ""]
    L += md_end(et, 4)
    L += ["", "Stability: std over all steps of a run's gradient norm (before clipping), mean over seeds:", "",
          "| arm | seeds | std of grad norm | 95% CI | interval |", "|---|---|---|---|---|"]
    for arm in runs.present_arms:
        v = stab[stab["arm"] == arm]["value"].dropna().to_numpy()
        if len(v):
            ci = mean_ci(v)
            L.append(f"| {arm} | {len(v)} | {v.mean():.4f} | [{fmt(ci.low, 4)}, {fmt(ci.high, 4)}] | {ci.method} |")
    sp = []
    for g in [x for x in runs.present_arms if x.startswith("gspo")]:
        twin = "grpo" + g[len("gspo"):]
        if twin in runs.present_arms:
            r = paired_diff(runs, "optim/grad_norm", g, twin, window=Window("std"))
            if r["n"] > 1:
                sp.append({**r, "metric": "optim/grad_norm (std over steps)"})
    sp, n_decl = undeclared(sp, plan)
    if sp or n_decl:
        L += ["", "Paired by seed, GSPO minus GRPO:", ""] + md_paired(sp, "a - b", 4, n_decl)
    L += on_policy_equivalence(runs)
    pr = []
    for g in [x for x in runs.present_arms if x.startswith("gspo")]:
        twin = "grpo" + g[len("gspo"):]
        if twin in runs.present_arms:
            pr += [paired_diff(runs, m_, g, twin) for m_ in ("reward/acc", "optim/grad_norm")]
    pr, n_decl = undeclared(pr, plan)
    if pr or n_decl:
        L += ["", "Paired by seed, end window, GSPO minus GRPO at the same number of minibatches:", ""]
        L += md_paired(pr, "a - b", 4, n_decl)
    L += ["", "Also in [off_policy.csv](off_policy.csv).", ""]
    return L


def on_policy_equivalence(runs) -> list[str]:
    """Do GRPO and GSPO coincide on-policy? For the first grpo and gspo arms at one minibatch, per seed: the first
    step whose mean reward differs and the largest gap in the first 20 steps (Markdown lines; none without both)."""
    a = [x for x in runs.present_arms if x.startswith("grpo") and x.endswith("=1")]
    b = [x for x in runs.present_arms if x.startswith("gspo") and x.endswith("=1")]
    if not (a and b):
        return []
    m = runs.metrics[runs.metrics["metric"] == "reward/mean"]
    L = ["", f"On-policy equivalence ({a[0]} vs {b[0]}, same seed): the first step whose mean reward differs, "
         "and the largest gap in the first 20 steps.", "", "| seed | first differing step | max |gap|, steps 1-20 |",
         "|---|---|---|"]
    for seed in runs.seeds:
        x = m[(m["arm"] == a[0]) & (m["seed"] == seed)].set_index("step")["value"]
        y = m[(m["arm"] == b[0]) & (m["seed"] == seed)].set_index("step")["value"]
        both = pd.concat([x, y], axis=1, join="inner").dropna()
        diff = (both.iloc[:, 0] - both.iloc[:, 1]).abs()
        first = diff[diff > 0].index.min() if (diff > 0).any() else None
        L.append(f"| {seed} | {first if first is not None else 'none'} | {diff[diff.index <= 20].max():.4f} |")
    return L

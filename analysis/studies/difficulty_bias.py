"""Study section ``difficulty_bias`` (Dr. GRPO): a group's total advantage weight sum_i |A_i| against its empirical
pass rate p = k/G, measured (adv/group_weight_k{k}) and in closed form for binary rewards: with the group std
(ddof 1) 2 sqrt((G-1)/G) sqrt(k(G-k)) ~ sqrt(p(1-p)); without scaling 2 k(G-k)/G = 2G p(1-p). For a mixture of
difficulty buckets also each bucket's training accuracy and share of the advantage weight over steps."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from objbench.analysis.plots import arm_colors, save_figure
from objbench.analysis.plots_studies import plot_bucket_curves, plot_weight_vs_pass_rate
from objbench.analysis.stats import mean_ci
from objbench.analysis.studies.markdown import fmt, md_paired, md_window
from objbench.analysis.studies.measures import curves, paired_diff, undeclared, window_table
from objbench.analysis.studies.registry import STUDY_SECTIONS
from objbench.analysis.windows import Window, per_run_values

__all__ = ["closed_form_weight", "difficulty_bias", "bucket_curves", "bucket_names"]


def closed_form_weight(k: int, G: int, scale: str, eps: float = 1e-6) -> float:
    """Total |A| of a group with k of G binary rewards correct (group mean baseline)."""
    if k in (0, G):
        return 0.0
    abs_sum = 2 * k * (G - k) / G
    if scale == "group":
        return abs_sum / (math.sqrt(k * (G - k) / (G * (G - 1))) + eps)
    if scale == "none":
        return abs_sum
    return float("nan")  # batch std: depends on the batch


def weight_by_pass_count(runs) -> pd.DataFrame:
    """Per arm and pass count k: groups seen, the measured mean total |A| per group (over every group of every step
    and seed) and its closed form. Columns arm, scale, G, k, p, groups, measured, closed_form."""
    m = runs.metrics
    cfg = runs.configs.set_index("arm")
    rows = []
    for arm in runs.present_arms:
        G = int(cfg.loc[[arm], "objective.group_size"].iloc[0])
        scale = str(cfg.loc[[arm], "objective.adv.scale"].iloc[0])
        eps = float(cfg.loc[[arm], "objective.adv.eps"].iloc[0])
        for k in range(G + 1):
            w = m[(m["arm"] == arm) & (m["metric"] == f"adv/group_weight_k{k}")]
            n = m[(m["arm"] == arm) & (m["metric"] == f"adv/groups_k{k}")]
            j = w.merge(n, on=["run", "step"], suffixes=("_w", "_n"))
            groups = j["value_n"].sum()
            meas = (j["value_w"] * j["value_n"]).sum() / groups if groups else float("nan")
            rows.append({"arm": arm, "scale": scale, "G": G, "k": k, "p": k / G, "groups": int(groups),
                         "measured": meas, "closed_form": closed_form_weight(k, G, scale, eps)})
    return pd.DataFrame(rows)


def weight_points(df: pd.DataFrame, arms) -> tuple[list[tuple], list[tuple]]:
    """What the weight figure draws: per arm (arm, p, measured / measured at p = 1/2) over the pass counts seen, and
    the closed-form shapes (p, value, line style, label), both 1 at p = 1/2."""
    points = []
    for arm in arms:
        d = df[(df["arm"] == arm) & (df["groups"] > 0)]
        mid = d[d["k"] == d["G"].iloc[0] // 2]["measured"]
        norm = float(mid.iloc[0]) if len(mid) else 1.0
        points.append((arm, d["p"], d["measured"] / norm))
    p = np.linspace(0, 1, 201)
    shapes = [(p, np.sqrt(p * (1 - p)) / 0.5, "k-", "sqrt(p(1-p)), std scaling"),
              (p, p * (1 - p) / 0.25, "k--", "p(1-p), no scaling")]
    return points, shapes


@STUDY_SECTIONS.register("difficulty_bias")
def difficulty_bias(runs, out: Path, dpi: int = 120, plan=None) -> list[str]:
    """The section: weight against pass count (difficulty_bias.csv, weight_vs_pass_rate.png), the per-bucket
    curves and tables, and the paired gains against group_std."""
    arms = runs.present_arms
    colors = arm_colors(arms)
    df = weight_by_pass_count(runs)
    df.to_csv(out / "difficulty_bias.csv", index=False)
    L = ["## Study: difficulty bias", "",
         "Claim (Dr. GRPO): dividing by the group std up-weights prompts that are almost always or almost never "
         "solved. A group's total advantage weight sum_i |A_i| against its pass rate p = k/G (binary rewards): "
         "with the group std it is 2 sqrt((G-1)/G) sqrt(k(G-k)), shaped like sqrt(p(1-p)); without scaling "
         "2G p(1-p). Measured over every group of every step and seed (adv/group_weight_k{k}).", "",
         "| arm | k | p | groups | measured sum |A| | closed form | measured / value at p=1/2 |", "|---|---|---|---|---|---|---|"]
    for arm in arms:
        d = df[df["arm"] == arm]
        mid = d[d["k"] == d["G"].iloc[0] // 2]["measured"].iloc[0]
        for r in d.itertuples():
            L.append(f"| {arm} | {r.k} | {r.p:.3f} | {r.groups} | {fmt(r.measured)} | {fmt(r.closed_form)} | "
                     f"{fmt(r.measured / mid if mid else float('nan'))} |")
    G0 = int(df["G"].iloc[0]) if len(df) else 8
    L += ["", "Also in [difficulty_bias.csv](difficulty_bias.csv). The last column shows the shape: the weight of "
          f"a hard (p = 1/{G0}) or easy (p = {G0 - 1}/{G0}) group relative to a p = 1/2 group; closed forms give "
          f"{math.sqrt(G0 - 1) / (G0 / 2):.3f} (std) and {4 * (G0 - 1) / G0**2:.3f} (none) for G = {G0}.", ""]
    save_figure(plot_weight_vs_pass_rate(*weight_points(df, arms), colors), out, "weight_vs_pass_rate.png", dpi)
    L += ["![weight against pass rate](weight_vs_pass_rate.png)", ""]
    buckets = sorted({mm for mm in runs.metrics["metric"].unique() if mm.startswith("reward/acc_d")})
    L += bucket_curves(runs, out, buckets, arms, colors, dpi)
    wt = window_table(runs, buckets)
    if not wt.empty:
        L += ["Training accuracy per difficulty bucket, start vs. end:", ""] + md_window(wt) + [""]
    if "group_std" in arms:
        pr = [paired_diff(runs, b_, other, "group_std", change=True) for b_ in buckets
              for other in arms if other != "group_std"]
        pr, n_decl = undeclared(pr, plan)
        L += ["Paired by seed: gain (end - start) of training accuracy per bucket, arm minus group_std:", ""]
        L += md_paired(pr, "a - b", declared_left_out=n_decl) + [""]
    return L


def bucket_names(runs) -> dict[int, str]:
    """Bucket number -> words for a mixture's subtasks ("arithmetic - 2-digit"); {} for other tasks."""
    c = runs.configs
    if "task.name" not in c or c["task.name"].iloc[0] != "mixture" or "task.components" not in c:
        return {}
    comps = c["task.components"].iloc[0]
    out = {}
    for k, comp in enumerate(comps if isinstance(comps, list) else [], start=1):
        if not isinstance(comp, dict):
            return {}
        words = [str(comp.get("name"))]
        if comp.get("name") == "arithmetic":
            digits = [str(d) for d, w in comp.get("difficulty_weights", []) if w > 0]
            words += ["".join(comp.get("ops", [])), "/".join(digits) + "-digit"]
        out[k] = " ".join(words)
    return out


def bucket_curves(runs, out: Path, buckets: list[str], arms, colors, dpi: int) -> list[str]:
    """Per bucket: training accuracy and the share of the advantage weight over steps, mean over seeds per arm
    (rolling mean of 20 steps per run; buckets.png), and a table of each arm's mean share per bucket
    (bucket_shares.csv; 95% interval over seeds: t below 10 seeds, BCa from 10, analysis.stats.mean_ci)."""
    shares = [b.replace("reward/acc_d", "adv/weight_share_d") for b in buckets]
    if not buckets or not any((runs.metrics["metric"] == s).any() for s in shares):
        return []
    names = bucket_names(runs)
    ds = [int(b.rsplit("d", 1)[1]) for b in buckets]
    labels = {d: f"{d}: {names[d]}" if d in names else str(d) for d in ds}
    L = ["Per bucket: training accuracy (sampled, on the step's prompts) and the bucket's share of the loss's "
         "advantage weight (adv/weight_share_d<d>: sum over its responses' tokens of w |A| over the batch's sum; "
         "experiments.train.weight_shares), mean over steps and seeds:", "",
         "| bucket | arm | seeds | training accuracy, mean over steps | advantage-weight share, mean over steps "
         "| 95% CI of share | interval |", "|---|---|---|---|---|---|---|"]
    rows = []
    for d, b, sh in zip(ds, buckets, shares):
        acc = per_run_values(runs.metrics, b, Window("auc"))
        wsh = per_run_values(runs.metrics, sh, Window("auc"))
        for arm in arms:
            a = acc[acc["arm"] == arm]["value"].to_numpy()
            w = wsh[wsh["arm"] == arm]["value"].to_numpy()
            if len(w) == 0:
                continue
            ci = mean_ci(w)
            rows.append({"bucket": d, "arm": arm, "acc": a.mean() if len(a) else float("nan"), "share": w.mean(),
                         "lo": ci.low, "hi": ci.high, "interval": ci.method, "n": len(w)})
            L.append(f"| {labels[d]} | {arm} | {len(w)} | {fmt(rows[-1]['acc'])} | {fmt(w.mean())} | "
                     f"[{fmt(ci.low)}, {fmt(ci.high)}] | {ci.method} |")
    pd.DataFrame(rows).to_csv(out / "bucket_shares.csv", index=False)
    columns = [(f"bucket {labels[d]}", curves(runs, b, smooth=20), curves(runs, sh, smooth=20))
               for d, b, sh in zip(ds, buckets, shares)]
    save_figure(plot_bucket_curves(columns, arms, colors), out, "buckets.png", dpi)
    return L + ["", "Also in [bucket_shares.csv](bucket_shares.csv).", "",
                "![per-bucket accuracy and weight share](buckets.png)", ""]

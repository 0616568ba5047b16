"""Study-specific measurements, figures and tables (issue 5), added to a sweep's report.md.

A sweep spec names its study in ``report: {study: NAME}``; ``objbench report`` then appends that study's
section. Every number is computed from the files on disk (metrics.jsonl, samples.jsonl), so the section can be
regenerated from results copied off a cluster.

- ``length_bias``: length of correct and of incorrect responses at the start (steps 1-20) and the end (last 50
  steps) of training, their change per seed with a bootstrap CI, the truncation rate; length over steps split
  by correctness and accuracy against response length (Dr. GRPO paper, figures 1/5 style).
- ``difficulty_bias``: a group's total advantage weight sum_i |A_i| against its empirical pass rate p = k/G,
  measured (adv/group_weight_k{k}) and in closed form for binary rewards: with the group std (ddof 1)
  2 sqrt((G-1)/G) sqrt(k(G-k)) ~ sqrt(p(1-p)); without scaling 2 k(G-k)/G = 2G p(1-p).
- ``kl_estimators``: reverse and forward exact KL to the reference, the estimators' values and accuracy at the end
  of training, per (estimator, placement) arm.
- ``off_policy``: clip fractions, the spread of the token and sequence log-ratios, gradient-norm stability, and
  whether GRPO and GSPO coincide at one minibatch per rollout.

Intervals over seeds are t intervals below 10 seeds (BCa from 10; the tables say which). Paired comparisons that
the sweep spec declares get their verdicts in the report's "Pre-registered comparisons" section and are not
repeated here; the paired tables below hold only the others, labelled exploratory: no verdict, p-values (exact
sign and permutation tests) not adjusted.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from objbench.analysis.inference import compare_exploratory
from objbench.analysis.plots import LINE_STYLES, arm_colors, save_figure
from objbench.analysis.prereg import STUDIES, Endpoint, Window, paired_differences, per_run_values, schedule_ends
from objbench.analysis.stats import mean_ci

NEEDS_SAMPLES = frozenset({"length_bias"})
"""Studies that read samples.jsonl; their report's data folder carries the sample counts (samples.csv.gz)."""
START = (1, 20)      # steps of the "start" window
END_STEPS = 50       # the "end" window: the last 50 steps of each run
END = Window("last", k=END_STEPS)
"""The end window as a pre-registration window: the mean of the last 50 logged steps."""
GAIN = Window("change", start=Window("steps", lo=START[0], hi=START[1]), end=END)
"""Start -> end change: mean over the last 50 steps minus the mean over steps 1-20."""


def _fmt(v, d=3):
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{d}f}"


def per_run_window(runs, metric: str, lo: int | None, hi: int | None, last: int | None = None) -> pd.DataFrame:
    """Mean of ``metric`` per run over steps [lo, hi], or over the last ``last`` steps of its schedule. Columns
    run, arm, seed, value."""
    m = runs.metrics
    m = m[m["metric"] == metric]
    if m.empty:
        return pd.DataFrame(columns=["run", "arm", "seed", "value"])
    if last is not None:  # the last steps of each run's schedule (its last logged step where that is unknown)
        top = m["run"].map(schedule_ends(runs.configs)).fillna(m.groupby("run")["step"].transform("max"))
        m = m[(m["step"] > top - last) & (m["step"] <= top)]
    else:
        m = m[(m["step"] >= lo) & (m["step"] <= hi)]
    return m.groupby(["run", "arm", "seed"], as_index=False)["value"].mean()


def window_table(runs, metrics: list[str], n_resamples: int = 10_000) -> pd.DataFrame:
    """Per arm and metric: start-window mean, end-window mean, mean per-seed change with a 95% interval (t below 10
    seeds, BCa from 10; column ``interval``)."""
    rows = []
    for metric in metrics:
        a = per_run_window(runs, metric, *START)
        b = per_run_window(runs, metric, None, None, last=END_STEPS)
        if a.empty or b.empty:
            continue
        j = a.merge(b, on=["run", "arm", "seed"], suffixes=("_start", "_end")).dropna()
        for arm in runs.present_arms:
            r = j[j["arm"] == arm]
            if r.empty:
                continue
            d = (r["value_end"] - r["value_start"]).to_numpy()
            ci = mean_ci(d, n_resamples=n_resamples)
            rows.append({"metric": metric, "arm": arm, "n": len(r), "start": r["value_start"].mean(),
                         "end": r["value_end"].mean(), "change": d.mean(), "ci_low": ci.low, "ci_high": ci.high,
                         "interval": ci.method})
    return pd.DataFrame(rows, columns=["metric", "arm", "n", "start", "end", "change", "ci_low", "ci_high",
                                       "interval"])


def end_table(runs, metrics: list[str], n_resamples: int = 10_000) -> pd.DataFrame:
    """Per arm and metric: mean over the end window, mean over seeds with a 95% interval (t below 10 seeds, BCa from
    10; column ``interval``)."""
    rows = []
    for metric in metrics:
        b = per_run_window(runs, metric, None, None, last=END_STEPS).dropna()
        for arm in runs.present_arms:
            v = b[b["arm"] == arm]["value"].to_numpy()
            if len(v) == 0:
                continue
            ci = mean_ci(v, n_resamples=n_resamples)
            rows.append({"metric": metric, "arm": arm, "n": len(v), "mean": v.mean(), "ci_low": ci.low,
                         "ci_high": ci.high, "interval": ci.method})
    return pd.DataFrame(rows, columns=["metric", "arm", "n", "mean", "ci_low", "ci_high", "interval"])


def _endpoint_values(runs, e: Endpoint) -> pd.DataFrame:
    frame = runs.evals if e.metric in set(runs.eval_names) else runs.metrics
    return per_run_values(frame, e.metric, e.window, schedule_ends(runs.configs))


def paired_diff(runs, metric: str, a: str, b: str, change: bool = False, n_resamples: int = 10_000,
                window: Window | None = None) -> dict:
    """Per-seed difference arm a - arm b of ``metric`` over the end window (last 50 steps), or of its start -> end
    change (``change=True``), or over ``window``: mean over seeds, 95% t interval (BCa from 10 seeds), exact sign and
    permutation tests (unadjusted: exploratory)."""
    e = Endpoint(metric, window or (GAIN if change else END))
    vals = _endpoint_values(runs, e)
    seeds, d = paired_differences(vals, a, b) if not vals.empty else ([], [])
    c = compare_exploratory([(a, b, e.label(), seeds, d)], n_resamples=n_resamples)[0]
    iv = c.bca if c.bca is not None else c.t
    return {"a": a, "b": b, "metric": metric, "endpoint": e, "n": c.n, "mean": c.mean, "lo": iv.low, "hi": iv.high,
            "interval": iv.method, "wins": c.sign.n_pos, "sign_p": c.sign.p, "perm_p": c.perm.p}


def _undeclared(rows: list[dict], plan) -> tuple[list[dict], int]:
    """Rows whose (endpoint, a, b) the plan does not declare, and how many were left out as declared."""
    if plan is None or not plan.declared:
        return rows, 0
    declared = {(e, c) for e in plan.endpoints for c in plan.comparisons}
    keep = [r for r in rows if (r["endpoint"], (r["a"], r["b"])) not in declared]
    return keep, len(rows) - len(keep)


def _fmt_p(p) -> str:
    return "n/a" if p is None or not math.isfinite(p) else f"{p:.3g}"


def _md_paired(rows: list[dict], what: str, digits: int = 3, declared_left_out: int = 0) -> list[str]:
    """An exploratory paired table (no verdict, p-values unadjusted); declared comparisons are left out and
    counted in a note."""
    L = []
    if declared_left_out:
        L += [f"{declared_left_out} of these comparisons are declared in the sweep spec: their verdicts are in "
              "'Pre-registered comparisons' above.", ""]
    if not rows:
        return L + ["(Every comparison of this table is declared in the sweep spec.)"]
    L += ["*Exploratory: not pre-registered, no verdict, p-values not adjusted for multiplicity.*", "",
          f"| {what} | metric | seeds | mean difference | 95% CI | interval | seeds with a > b | sign p | "
          "permutation p |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = (f"[{r['lo']:+.{digits}f}, {r['hi']:+.{digits}f}]" if math.isfinite(r["lo"]) and math.isfinite(r["hi"])
              else "n/a (n<2)")
        mean = f"{r['mean']:+.{digits}f}" if math.isfinite(r["mean"]) else "n/a"
        L.append(f"| {r['a']} - {r['b']} | {r['metric']} | {r['n']} | {mean} | {ci} | {r['interval']} | "
                 f"{r.get('wins', 0)}/{r['n']} | {_fmt_p(r['sign_p'])} | {_fmt_p(r['perm_p'])} |")
    return L


def _md_window(df: pd.DataFrame, digits: int = 3) -> list[str]:
    L = ["| metric | arm | seeds | start (steps 1-20) | end (last 50 steps) | change | 95% CI of change | interval |",
         "|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        ci = (f"[{r.ci_low:+.{digits}f}, {r.ci_high:+.{digits}f}]" if math.isfinite(r.ci_low) else "n/a (n<2)")
        L.append(f"| {r.metric} | {r.arm} | {r.n} | {_fmt(r.start, digits)} | {_fmt(r.end, digits)} | "
                 f"{r.change:+.{digits}f} | {ci} | {r.interval} |")
    return L


def _md_end(df: pd.DataFrame, digits: int = 3) -> list[str]:
    L = ["| metric | arm | seeds | mean, last 50 steps | 95% CI | interval |", "|---|---|---|---|---|---|"]
    for r in df.itertuples():
        L.append(f"| {r.metric} | {r.arm} | {r.n} | {_fmt(r.mean, digits)} | "
                 f"[{_fmt(r.ci_low, digits)}, {_fmt(r.ci_high, digits)}] | {r.interval} |")
    return L


def _curves(runs, metric: str, smooth: int = 10) -> pd.DataFrame:
    """Mean over seeds per arm and step of a rolling mean per run."""
    m = runs.metrics[runs.metrics["metric"] == metric].sort_values(["run", "step"])
    if m.empty:
        return m
    m = m.assign(value=m.groupby("run")["value"].transform(lambda s: s.rolling(smooth, min_periods=1).mean()))
    return m.groupby(["arm", "step"], as_index=False)["value"].mean()


def _save(fig, out: Path, name: str, dpi: int) -> None:
    """PNG and PDF (analysis.plots.save_figure), then free the pyplot figure."""
    import matplotlib.pyplot as plt

    save_figure(fig, out, name, dpi)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ length bias


def read_samples(runs) -> pd.DataFrame:
    """Logged samples of every loaded run as counts: run, arm, seed, step, length (characters), correct (0/1), count.

    From the data file when the runs were read from one (``runs.samples``), else from each run folder's
    samples.jsonl (``analysis.data.read_samples_jsonl``)."""
    from objbench.analysis.data import read_samples_jsonl

    smp = runs.samples if runs.samples is not None else read_samples_jsonl(runs.configs)
    cols = ["run", "arm", "seed", "step", "length", "correct", "count"]
    if smp is None or smp.empty:
        return pd.DataFrame(columns=cols)
    info = runs.configs.set_index("run")
    return smp.assign(arm=smp["run"].map(info["arm"]), seed=smp["run"].map(info["seed"]))[cols]


def length_bias(runs, out: Path, dpi: int = 120, plan=None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = runs.present_arms
    colors = arm_colors(arms)
    wt = window_table(runs, ["length/incorrect", "length/correct", "length/mean", "rollout/trunc_frac", "reward/acc"])
    wt.to_csv(out / "length_bias.csv", index=False)
    L = ["## Study: length bias", "",
         "Claim (Dr. GRPO, DAPO): per-sequence 1/|y| averaging (`seq_mean_token_mean`, GRPO) lets incorrect "
         "responses grow longer; token-level (`token_mean`, DAPO) or constant (`seq_mean_token_sum_norm`, Dr. GRPO) "
         "normalisation does not. Measured on the filler task: responses may start with 0..filler_max '.' "
         "characters, so length is free and decoupled from correctness. Lengths in tokens (EOS included).", ""]
    L += _md_window(wt)
    L += ["", "Change = end - start per seed, mean over seeds; CI: 95% interval over seeds (column interval: t below "
          "10 seeds, BCa from 10). Also in [length_bias.csv](length_bias.csv).", ""]
    base = "seq_mean_token_mean"
    if base in arms:
        pr = [paired_diff(runs, m_, base, other) for m_ in ("length/incorrect", "length/correct")
              for other in arms if other != base]
        pr, n_decl = _undeclared(pr, plan)
        L += ["Paired by seed (same warm start, same prompts), end window (last 50 steps):", ""]
        L += _md_paired(pr, "a - b (tokens)", declared_left_out=n_decl) + [""]
    ncols = min(3, len(arms))
    nrows = -(-len(arms) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.3 * ncols + 0.6, 2.8 * nrows + 0.6), sharey=True,
                             squeeze=False)
    for ax in axes.flat[len(arms):]:
        ax.set_visible(False)
    for ax, arm in zip(axes.flat, arms):
        for metric, style, lab in (("length/correct", "-", "correct"), ("length/incorrect", "--", "incorrect")):
            cv = _curves(runs, metric)
            cv = cv[cv["arm"] == arm]
            ax.plot(cv["step"], cv["value"], style, color=colors[arm], label=lab)
        ax.set_title(arm, fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for row in axes:
        row[0].set_ylabel("response length (tokens)")
    fig.suptitle("Length of correct and incorrect responses over training (mean over seeds, 10-step rolling mean)",
                 fontsize=10)
    fig.tight_layout()
    _save(fig, out, "length_by_correctness.png", dpi)
    L += ["![length by correctness](length_by_correctness.png)", ""]
    smp = read_samples(runs)
    if not smp.empty:
        top = smp.groupby("run")["step"].transform("max")
        phases = {"first 50 steps": smp[smp["step"] <= 50], "last 50 steps": smp[smp["step"] > top - 50]}
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
        for ax, (name, d) in zip(axes, phases.items()):
            for arm in arms:
                a_ = d[d["arm"] == arm].assign(hits=lambda t: t["correct"] * t["count"])
                g = a_.groupby("length")[["hits", "count"]].sum().reset_index()
                g = g[g["count"] >= 20]
                ax.plot(g["length"], g["hits"] / g["count"], "o-", color=colors[arm], label=arm, ms=4)
            ax.set_title(f"{name} (logged samples)", fontsize=10)
            ax.set_xlabel("response length (characters, EOS excluded)")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("accuracy (fraction correct)")
        axes[1].legend(fontsize=8)
        fig.suptitle("Accuracy against response length (lengths with >= 20 logged samples)", fontsize=10)
        fig.tight_layout()
        _save(fig, out, "acc_vs_length.png", dpi)
        L += ["![accuracy against length](acc_vs_length.png)", "",
              f"From samples.jsonl: {int(smp['count'].sum())} logged responses "
              f"({int(smp.groupby('run')['count'].sum().iloc[0])} per run).", ""]
    return L


# -------------------------------------------------------------------------------------------- difficulty bias


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


def difficulty_bias(runs, out: Path, dpi: int = 120, plan=None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = runs.present_arms
    colors = arm_colors(arms)
    m = runs.metrics
    cfg = runs.configs.set_index("arm")
    rows = []
    for arm in arms:
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
    df = pd.DataFrame(rows)
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
            L.append(f"| {arm} | {r.k} | {r.p:.3f} | {r.groups} | {_fmt(r.measured)} | {_fmt(r.closed_form)} | "
                     f"{_fmt(r.measured / mid if mid else float('nan'))} |")
    G0 = int(df["G"].iloc[0]) if len(df) else 8
    L += ["", "Also in [difficulty_bias.csv](difficulty_bias.csv). The last column shows the shape: the weight of "
          f"a hard (p = 1/{G0}) or easy (p = {G0 - 1}/{G0}) group relative to a p = 1/2 group; closed forms give "
          f"{math.sqrt(G0 - 1) / (G0 / 2):.3f} (std) and {4 * (G0 - 1) / G0**2:.3f} (none) for G = {G0}.", ""]
    fig, ax = plt.subplots(figsize=(6.2, 4.2))
    for arm in arms:
        d = df[(df["arm"] == arm) & (df["groups"] > 0)]
        mid = d[d["k"] == d["G"].iloc[0] // 2]["measured"]
        norm = float(mid.iloc[0]) if len(mid) else 1.0
        ax.plot(d["p"], d["measured"] / norm, "o", color=colors[arm], label=f"{arm} (measured)", ms=6)
    p = np.linspace(0, 1, 201)
    ax.plot(p, np.sqrt(p * (1 - p)) / 0.5, "k-", lw=1, label="sqrt(p(1-p)), std scaling")
    ax.plot(p, p * (1 - p) / 0.25, "k--", lw=1, label="p(1-p), no scaling")
    ax.set_xlabel("group pass rate p = k / G")
    ax.set_ylabel("group total |advantage| / value at p = 1/2")
    ax.set_title("Advantage weight per group against its pass rate", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out, "weight_vs_pass_rate.png", dpi)
    L += ["![weight against pass rate](weight_vs_pass_rate.png)", ""]
    buckets = sorted({mm for mm in m["metric"].unique() if mm.startswith("reward/acc_d")})
    L += _bucket_curves(runs, out, buckets, arms, colors, dpi)
    wt = window_table(runs, buckets)
    if not wt.empty:
        L += ["Training accuracy per difficulty bucket, start vs. end:", ""] + _md_window(wt) + [""]
    if "group_std" in arms:
        pr = [paired_diff(runs, b_, other, "group_std", change=True) for b_ in buckets
              for other in arms if other != "group_std"]
        pr, n_decl = _undeclared(pr, plan)
        L += ["Paired by seed: gain (end - start) of training accuracy per bucket, arm minus group_std:", ""]
        L += _md_paired(pr, "a - b", declared_left_out=n_decl) + [""]
    return L


def _bucket_names(runs) -> dict[int, str]:
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


def _bucket_curves(runs, out: Path, buckets: list[str], arms, colors, dpi: int) -> list[str]:
    """Per bucket: training accuracy and the share of the advantage weight over steps, mean over seeds per arm
    (rolling mean of 20 steps per run), and a table of each arm's mean share per bucket (95% interval over seeds:
    t below 10 seeds, BCa from 10, analysis.stats.mean_ci)."""
    import matplotlib.pyplot as plt

    shares = [b.replace("reward/acc_d", "adv/weight_share_d") for b in buckets]
    if not buckets or not any((runs.metrics["metric"] == s).any() for s in shares):
        return []
    names = _bucket_names(runs)
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
            L.append(f"| {labels[d]} | {arm} | {len(w)} | {_fmt(rows[-1]['acc'])} | {_fmt(w.mean())} | "
                     f"[{_fmt(ci.low)}, {_fmt(ci.high)}] | {ci.method} |")
    pd.DataFrame(rows).to_csv(out / "bucket_shares.csv", index=False)
    fig, axes = plt.subplots(2, len(buckets), figsize=(3.4 * len(buckets), 5.6), sharex=True, squeeze=False)
    for j, (d, b, sh) in enumerate(zip(ds, buckets, shares)):
        for i, metric in enumerate((b, sh)):
            ax = axes[i][j]
            c = _curves(runs, metric, smooth=20)
            for k, arm in enumerate(arms):
                cc = c[c["arm"] == arm] if not c.empty else c
                if len(cc):
                    ax.plot(cc["step"], cc["value"], color=colors[arm], lw=1.2, label=arm,
                            ls=LINE_STYLES[k % len(LINE_STYLES)])
            ax.grid(alpha=0.3)
            ax.set_ylim(0, 1.02)
            if i == 0:
                ax.set_title(f"bucket {labels[d]}", fontsize=9)
            else:
                ax.set_xlabel("step")
    axes[0][0].set_ylabel("training accuracy")
    axes[1][0].set_ylabel("share of advantage weight")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Per bucket, mean over seeds (rolling mean of 20 steps per run)", fontsize=10)
    fig.tight_layout()
    _save(fig, out, "buckets.png", dpi)
    return L + ["", "Also in [bucket_shares.csv](bucket_shares.csv).", "",
                "![per-bucket accuracy and weight share](buckets.png)", ""]


# ----------------------------------------------------------------------------------------------------- KL


def kl_estimators(runs, out: Path, dpi: int = 120, plan=None) -> list[str]:
    et = end_table(runs, ["kl/exact", "kl/exact_fwd", "kl/k1", "kl/k2", "kl/k3", "reward/acc", "length/mean"])
    et.to_csv(out / "kl_training.csv", index=False)
    L = ["## Study: KL estimators in training", "",
         "Each arm adds beta = 0.04 times one estimator (k1, k2, k3 of log pi/pi_ref) either to the reward "
         "(before advantages) or to the loss (aggregated like the policy term); `no_kl` is the control. Measured: "
         "the exact per-token reverse KL(pi || pi_ref) and forward KL(pi_ref || pi) over the full vocabulary, the "
         "estimators' values on the sampled tokens, and training accuracy, averaged over the last 50 steps.", ""]
    L += _md_end(et, 4)
    if "no_kl" in runs.present_arms:
        pr = [paired_diff(runs, m_, arm, "no_kl") for m_ in ("kl/exact", "kl/exact_fwd", "reward/acc")
              for arm in runs.present_arms if arm != "no_kl"]
        pr, n_decl = _undeclared(pr, plan)
        L += ["", "Paired by seed, end window, arm minus no_kl:", ""] + _md_paired(pr, "a - b", 4, n_decl)
    L += ["", "Also in [kl_training.csv](kl_training.csv).", ""]
    return L


# ---------------------------------------------------------------------------------------------- off-policy


def off_policy(runs, out: Path, dpi: int = 120, plan=None) -> list[str]:
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
    L += _md_end(et, 4)
    L += ["", "Stability: std over all steps of a run's gradient norm (before clipping), mean over seeds:", "",
          "| arm | seeds | std of grad norm | 95% CI | interval |", "|---|---|---|---|---|"]
    for arm in runs.present_arms:
        v = stab[stab["arm"] == arm]["value"].dropna().to_numpy()
        if len(v):
            ci = mean_ci(v)
            L.append(f"| {arm} | {len(v)} | {v.mean():.4f} | [{_fmt(ci.low, 4)}, {_fmt(ci.high, 4)}] | {ci.method} |")
    sp = []
    for g in [x for x in runs.present_arms if x.startswith("gspo")]:
        twin = "grpo" + g[len("gspo"):]
        if twin in runs.present_arms:
            r = paired_diff(runs, "optim/grad_norm", g, twin, window=Window("std"))
            if r["n"] > 1:
                sp.append({**r, "metric": "optim/grad_norm (std over steps)"})
    sp, n_decl = _undeclared(sp, plan)
    if sp or n_decl:
        L += ["", "Paired by seed, GSPO minus GRPO:", ""] + _md_paired(sp, "a - b", 4, n_decl)
    # do GRPO and GSPO coincide on-policy?
    a = [x for x in runs.present_arms if x.startswith("grpo") and x.endswith("=1")]
    b = [x for x in runs.present_arms if x.startswith("gspo") and x.endswith("=1")]
    if a and b:
        m = runs.metrics[runs.metrics["metric"] == "reward/mean"]
        L += ["", f"On-policy equivalence ({a[0]} vs {b[0]}, same seed): the first step whose mean reward differs, "
              "and the largest gap in the first 20 steps.", "", "| seed | first differing step | max |gap|, steps 1-20 |",
              "|---|---|---|"]
        for seed in runs.seeds:
            x = m[(m["arm"] == a[0]) & (m["seed"] == seed)].set_index("step")["value"]
            y = m[(m["arm"] == b[0]) & (m["seed"] == seed)].set_index("step")["value"]
            both = pd.concat([x, y], axis=1, join="inner").dropna()
            diff = (both.iloc[:, 0] - both.iloc[:, 1]).abs()
            first = diff[diff > 0].index.min() if (diff > 0).any() else None
            L.append(f"| {seed} | {first if first is not None else 'none'} | {diff[diff.index <= 20].max():.4f} |")
    pr = []
    for g in [x for x in runs.present_arms if x.startswith("gspo")]:
        twin = "grpo" + g[len("gspo"):]
        if twin in runs.present_arms:
            pr += [paired_diff(runs, m_, g, twin) for m_ in ("reward/acc", "optim/grad_norm")]
    pr, n_decl = _undeclared(pr, plan)
    if pr or n_decl:
        L += ["", "Paired by seed, end window, GSPO minus GRPO at the same number of minibatches:", ""]
        L += _md_paired(pr, "a - b", 4, n_decl)
    L += ["", "Also in [off_policy.csv](off_policy.csv).", ""]
    return L


def study_section(study: str, runs, out: Path, dpi: int = 120, plan=None) -> list[str]:
    """Markdown lines of a study's section (figures and CSVs written to ``out``). ``plan``: the report's
    ``analysis.prereg.Plan``; paired comparisons it declares are left out of the study's exploratory tables."""
    fn = {"length_bias": length_bias, "difficulty_bias": difficulty_bias, "kl_estimators": kl_estimators,
          "off_policy": off_policy}.get(study)
    if fn is None:
        raise ValueError(f"unknown study {study!r}; valid: {', '.join(STUDIES)}")
    return fn(runs, Path(out), dpi, plan=plan)

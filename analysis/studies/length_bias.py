"""Study section ``length_bias`` (Dr. GRPO, DAPO): length of correct and of incorrect responses at the start (steps
1-20) and the end (last 50 steps) of training, their change per seed with a 95% interval, the truncation rate;
length over steps split by correctness, and accuracy against response length from the logged samples (Dr. GRPO
paper, figures 1/5 style). Reads samples.jsonl (samples.csv.gz in a report's data)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from objbench.analysis.plots import arm_colors, save_figure
from objbench.analysis.plots_studies import plot_acc_vs_length, plot_length_by_correctness
from objbench.analysis.studies.markdown import md_paired, md_window
from objbench.analysis.studies.measures import curves, paired_diff, undeclared, window_table
from objbench.analysis.studies.registry import STUDY_SECTIONS

__all__ = ["read_samples", "length_bias", "accuracy_by_length"]


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


def accuracy_by_length(smp: pd.DataFrame, arms) -> dict[str, dict[str, pd.DataFrame]]:
    """Accuracy per response length (columns length, acc) of each arm's logged samples over the first 50 and the
    last 50 steps of each run, for the lengths with at least 20 samples: {phase: {arm: table}}."""
    top = smp.groupby("run")["step"].transform("max")
    phases = {"first 50 steps": smp[smp["step"] <= 50], "last 50 steps": smp[smp["step"] > top - 50]}
    out = {}
    for name, d in phases.items():
        out[name] = {}
        for arm in arms:
            a_ = d[d["arm"] == arm].assign(hits=lambda t: t["correct"] * t["count"])
            g = a_.groupby("length")[["hits", "count"]].sum().reset_index()
            g = g[g["count"] >= 20]
            out[name][arm] = g.assign(acc=g["hits"] / g["count"])[["length", "acc"]]
    return out


@STUDY_SECTIONS.register("length_bias", reads_samples=True)
def length_bias(runs, out: Path, dpi: int = 120, plan=None) -> list[str]:
    """The section: the start/end length table (length_bias.csv), the paired table against seq_mean_token_mean,
    length by correctness over training, accuracy against length."""
    arms = runs.present_arms
    colors = arm_colors(arms)
    wt = window_table(runs, ["length/incorrect", "length/correct", "length/mean", "rollout/trunc_frac", "reward/acc"])
    wt.to_csv(out / "length_bias.csv", index=False)
    L = ["## Study: length bias", "",
         "Claim (Dr. GRPO, DAPO): per-sequence 1/|y| averaging (`seq_mean_token_mean`, GRPO) lets incorrect "
         "responses grow longer; token-level (`token_mean`, DAPO) or constant (`seq_mean_token_sum_norm`, Dr. GRPO) "
         "normalisation does not. Measured on the filler task: responses may start with 0..filler_max '.' "
         "characters, so length is free and decoupled from correctness. Lengths in tokens (EOS included).", ""]
    L += md_window(wt)
    L += ["", "Change = end - start per seed, mean over seeds; CI: 95% interval over seeds (column interval: t below "
          "10 seeds, BCa from 10). Also in [length_bias.csv](length_bias.csv).", ""]
    base = "seq_mean_token_mean"
    if base in arms:
        pr = [paired_diff(runs, m_, base, other) for m_ in ("length/incorrect", "length/correct")
              for other in arms if other != base]
        pr, n_decl = undeclared(pr, plan)
        L += ["Paired by seed (same warm start, same prompts), end window (last 50 steps):", ""]
        L += md_paired(pr, "a - b (tokens)", declared_left_out=n_decl) + [""]
    lines = [("correct", "-", curves(runs, "length/correct")), ("incorrect", "--", curves(runs, "length/incorrect"))]
    save_figure(plot_length_by_correctness(lines, arms, colors), out, "length_by_correctness.png", dpi)
    L += ["![length by correctness](length_by_correctness.png)", ""]
    smp = read_samples(runs)
    if not smp.empty:
        save_figure(plot_acc_vs_length(accuracy_by_length(smp, arms), arms, colors), out, "acc_vs_length.png", dpi)
        L += ["![accuracy against length](acc_vs_length.png)", "",
              f"From samples.jsonl: {int(smp['count'].sum())} logged responses "
              f"({int(smp.groupby('run')['count'].sum().iloc[0])} per run).", ""]
    return L

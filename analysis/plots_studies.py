"""The studies' figures: the study sections' (length by correctness, accuracy against length, advantage weight
against pass rate, per-bucket curves) and the KL-estimator study's (bias and spread per exact-KL bin). Like
analysis.plots, every function only draws numbers computed elsewhere (analysis.studies) and returns the figure,
built with ``matplotlib.figure.Figure``, never through pyplot; ``analysis.plots.save_figure`` writes it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from objbench.analysis.plots import LINE_STYLES

__all__ = ["plot_length_by_correctness", "plot_acc_vs_length", "plot_weight_vs_pass_rate", "plot_bucket_curves",
           "plot_kl_token_bins"]


def plot_length_by_correctness(lines: Sequence[tuple[str, str, pd.DataFrame]], arms: Sequence[str],
                               colors: Mapping[str, tuple]) -> Figure:
    """One panel per arm (at most 3 across, shared y): a line per ``(label, style, curves)`` of ``lines``, curves
    with columns arm, step, value (analysis.studies.measures.curves)."""
    ncols = min(3, len(arms))
    nrows = -(-len(arms) // ncols)
    fig = Figure(figsize=(3.3 * ncols + 0.6, 2.8 * nrows + 0.6))
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False)
    for ax in axes.flat[len(arms):]:
        ax.set_visible(False)
    for ax, arm in zip(axes.flat, arms):
        for lab, style, cv in lines:
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
    return fig


def plot_acc_vs_length(phases: Mapping[str, Mapping[str, pd.DataFrame]], arms: Sequence[str],
                       colors: Mapping[str, tuple]) -> Figure:
    """Two panels (``phases``: {name: {arm: table with columns length, acc}}, two of them), accuracy against
    response length, a line per arm."""
    fig = Figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, (name, by_arm) in zip(axes, phases.items()):
        for arm in arms:
            g = by_arm[arm]
            ax.plot(g["length"], g["acc"], "o-", color=colors[arm], label=arm, ms=4)
        ax.set_title(f"{name} (logged samples)", fontsize=10)
        ax.set_xlabel("response length (characters, EOS excluded)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (fraction correct)")
    axes[1].legend(fontsize=8)
    fig.suptitle("Accuracy against response length (lengths with >= 20 logged samples)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_weight_vs_pass_rate(points: Sequence[tuple], shapes: Sequence[tuple], colors: Mapping[str, tuple]) -> Figure:
    """The measured advantage weight per group against its pass rate, one marker series per ``(arm, p, weight)`` of
    ``points``, and the closed-form shapes as black lines, one per ``(p, value, style, label)`` of ``shapes``."""
    fig = Figure(figsize=(6.2, 4.2))
    ax = fig.subplots()
    for arm, p, w in points:
        ax.plot(p, w, "o", color=colors[arm], label=f"{arm} (measured)", ms=6)
    for p, v, style, label in shapes:
        ax.plot(p, v, style, lw=1, label=label)
    ax.set_xlabel("group pass rate p = k / G")
    ax.set_ylabel("group total |advantage| / value at p = 1/2")
    ax.set_title("Advantage weight per group against its pass rate", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_bucket_curves(columns: Sequence[tuple[str, pd.DataFrame, pd.DataFrame]], arms: Sequence[str],
                       colors: Mapping[str, tuple]) -> Figure:
    """A column per difficulty bucket ``(title, accuracy curves, weight-share curves)``: training accuracy on top,
    the bucket's share of the advantage weight below; curves with columns arm, step, value, a line per arm."""
    fig = Figure(figsize=(3.4 * len(columns), 5.6))
    axes = fig.subplots(2, len(columns), sharex=True, squeeze=False)
    for j, (title, *cells) in enumerate(columns):
        for i, c in enumerate(cells):
            ax = axes[i][j]
            for k, arm in enumerate(arms):
                cc = c[c["arm"] == arm] if not c.empty else c
                if len(cc):
                    ax.plot(cc["step"], cc["value"], color=colors[arm], lw=1.2, label=arm,
                            ls=LINE_STYLES[k % len(LINE_STYLES)])
            ax.grid(alpha=0.3)
            ax.set_ylim(0, 1.02)
            if i == 0:
                ax.set_title(title, fontsize=9)
            else:
                ax.set_xlabel("step")
    axes[0][0].set_ylabel("training accuracy")
    axes[1][0].set_ylabel("share of advantage weight")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Per bucket, mean over seeds (rolling mean of 20 steps per run)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_kl_token_bins(bins: pd.DataFrame, estimators: Sequence[str], colors: Mapping[str, str]):
    """Bias, std and std/KL against the bin's mean exact KL, one colour per estimator (``colors``). ``bins``: the
    KL-estimator study's token bins (objbench.experiments.studies.kl_tokens.bin_tokens). Returns (fig, axes)."""
    fig = Figure(figsize=(15, 5.2), layout="constrained")
    axes = fig.subplots(1, 3)
    for i, kind in enumerate(estimators):
        d = bins[bins.estimator == kind]
        c = colors[kind]
        shift = 10 ** (0.12 * (i - 1))  # spread the three estimators' markers apart within a bin
        axes[0].errorbar(d.kl_mean * shift, d.bias, yerr=2 * d.bias_se_enum, fmt="o", color=c, capsize=3,
                         ms=5, label=f"{kind}: sampled (±2 SE)")
        axes[0].plot(d.kl_mean, d.bias_enum, "-", color=c, lw=1.5)
        axes[1].plot(d.kl_mean, d.std_enum, "-", color=c, lw=1.5)
        axes[1].plot(d.kl_mean, d["std"], "o", color=c, mfc="none")
        axes[2].plot(d.kl_mean, d.rel_std_enum, "-", color=c, lw=1.5)
        axes[2].plot(d.kl_mean, d.rel_std, "o", color=c, mfc="none")
    lo, hi = bins.kl_mean.min(), bins.kl_mean.max()
    axes[1].plot([lo, hi], [lo, hi], "k--", lw=1)
    axes[2].axhline(1.0, color="k", ls="--", lw=1)
    axes[0].set_yscale("symlog", linthresh=1e-5)
    axes[0].set_yticks([-1.0, -1e-2, -1e-4, 0.0, 1e-4, 1e-2, 1.0, 1e2])
    axes[0].axhline(0.0, color="k", lw=0.8)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    titles = ("bias (exact bias of k1, k3 = 0)", "std of the per-token estimate", "relative std")
    ylabels = ("bias = mean(k - KL) [nats/token]", "std(k - KL) [nats/token]", "std / true KL [ratio]")
    for ax, t, yl in zip(axes, titles, ylabels):
        ax.set_xscale("log")
        ax.set_xlabel("exact per-token KL(π‖π_ref), bin mean [nats/token]")
        ax.set_ylabel(yl)
        ax.set_title(t)
        ax.grid(True, which="major", alpha=0.3)
    handles = [Line2D([], [], color=colors[k], lw=6, label=k) for k in estimators]
    handles += [Line2D([], [], color="grey", lw=1.5, label="exact (vocabulary enumerated per prefix)"),
                Line2D([], [], color="grey", marker="o", ls="none", mfc="none", label="sampled tokens"),
                Line2D([], [], color="grey", marker="o", ls="none", label="sampled mean ± 2 SE (bias panel)"),
                Line2D([], [], color="k", ls="--", lw=1, label="std = true KL")]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=9, frameon=False)
    return fig, axes

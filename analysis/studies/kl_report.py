"""KL-estimator study output: number formatting, the Markdown tables, the plain-language findings, README.md, the
table files (CSV full precision, Markdown rounded for reading) and the token-bins figure (drawn by
analysis.plots_studies)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pandas as pd

from objbench.analysis.plots_studies import plot_kl_token_bins
from objbench.analysis.studies.kl_config import (COLORS, ESTIMATORS, EXACT_UNBIASED, GRAD_FORMS, GRAD_RTOL,
                                                 MIN_BIN_TOKENS, UNBIASED_Z, ZERO_GRAD_TOL, Args)


def sci(v, digits: int = 2) -> str:
    """``v`` to ``digits`` + 2 significant digits, in scientific notation below 1e-3 and from 1e4; "n/a" for NaN."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if v == 0:
        return "0"
    return f"{v:.{digits}e}" if abs(v) < 1e-3 or abs(v) >= 1e4 else f"{v:.{digits + 2}g}"


def md(df: pd.DataFrame) -> str:
    """GitHub Markdown table of already-formatted cells ('|' escaped)."""
    def row(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    lines = [row(df.columns), "|" + "|".join("---" for _ in df.columns) + "|"]
    lines += [row(r) for r in df.itertuples(index=False, name=None)]
    return "\n".join(lines) + "\n"


def display_gaussian(t: pd.DataFrame) -> pd.DataFrame:
    """Part 0's Gaussian table, formatted for reading (gaussian_table.md)."""
    return pd.DataFrame({
        "mu": t.mu, "true KL": t.true_kl.map(sci), "estimator": t.estimator,
        "bias/KL": t.rel_bias.map(lambda v: f"{v:.4f}"), "std/KL": t.rel_std.map(lambda v: f"{v:.3f}"),
        "Schulman bias/KL": t.schulman_rel_bias.map(lambda v: "" if math.isnan(v) else f"{v:g}"),
        "Schulman std/KL": t.schulman_rel_std.map(lambda v: "" if math.isnan(v) else f"{v:g}"),
        "frac < 0": t.frac_neg.map(lambda v: f"{v:.3f}")})


def display_policies(p: pd.DataFrame) -> pd.DataFrame:
    """Part a's per-policy table, formatted for reading (policies.md)."""
    return pd.DataFrame({
        "sigma": p.sigma, "completions": p.n_completions, "tokens": p.n_tokens,
        "mean length": p.mean_len.map(lambda v: f"{v:.2f}"),
        "exact KL(π‖ref) / token": p.kl_exact.map(sci), "exact KL(ref‖π) / token": p.kl_fwd_exact.map(sci),
        **{f"mean {k}": p[f"{k}_mean"].map(sci) for k in ESTIMATORS},
        "frac |x| > 20 (k3 clamp)": p.frac_x_clamped.map(lambda v: f"{v:.4f}")})


def display_bins(b: pd.DataFrame) -> pd.DataFrame:
    """Part a's per-bin, per-estimator table, formatted for reading (token_bins.md)."""
    return pd.DataFrame({
        "true KL bin": [f"[{sci(lo, 0)}, {sci(hi, 0)})" for lo, hi in zip(b.bin_low, b.bin_high)],
        "tokens": b.n, "mean KL": b.kl_mean.map(sci), "estimator": b.estimator,
        "bias (sampled)": b.bias.map(sci),
        "|bias|/SE": (b.bias.abs() / b.bias_se_enum).map(lambda v: f"{v:.1f}"),
        "bias/KL (exact)": (b.bias_enum / b.kl_mean).map(sci),
        "std (sampled)": b["std"].map(sci), "std (exact)": b.std_enum.map(sci),
        "std/KL (exact)": b.rel_std_enum.map(sci), "median/KL": b.rel_median.map(sci),
        "frac < 0": b.frac_neg.map(lambda v: f"{v:.3f}")})


def display_grad(g: pd.DataFrame) -> pd.DataFrame:
    """Part b's exact expected gradients on the one-token categorical, formatted (grad_categorical.md)."""
    return pd.DataFrame({
        "s": g.distance, "KL(π‖ref)": g.kl_rev.map(sci), "form": g.form.map(GRAD_FORMS.get),
        "cos vs ∇rev": g.cos_rev.map(lambda v: "n/a (g=0)" if math.isnan(v) else f"{v:+.6f}"),
        "rel err vs ∇rev": g.rel_err_rev.map(sci),
        "cos vs ∇fwd": g.cos_fwd.map(lambda v: "n/a (g=0)" if math.isnan(v) else f"{v:+.6f}"),
        "rel err vs ∇fwd": g.rel_err_fwd.map(sci), "|g|/|∇rev|": g.norm_ratio_rev.map(sci)})


def display_mc(m: pd.DataFrame) -> pd.DataFrame:
    """Part b's Monte-Carlo gradient noise table, formatted for reading (grad_mc.md)."""
    return pd.DataFrame({
        "s": m.distance, "form": m.form.map(GRAD_FORMS.get),
        "per-token std / |∇rev|": m.rel_std_per_sample.map(sci),
        f"std of {m.n_tokens.iloc[0]}-token mean / |∇rev|": m.rel_std_mc.map(sci),
        "predicted (per-token / √N)": m.rel_std_mc_predicted.map(sci),
        "mean cos(ĝ, ∇rev)": m.mc_cos_rev.map(lambda v: f"{v:+.3f}"),
        "mean cos(ĝ, ∇fwd)": m.mc_cos_fwd.map(lambda v: f"{v:+.3f}")})


def display_sequence(ss: pd.DataFrame) -> pd.DataFrame:
    """Part b's sequence-toy cosines, mean [min, max] over instances, formatted (grad_sequence.md)."""
    def cell(r, t):
        if math.isnan(r[f"cos_{t}_mean"]):
            return "n/a (g=0)"
        return f"{r[f'cos_{t}_mean']:+.3f} [{r[f'cos_{t}_min']:+.3f}, {r[f'cos_{t}_max']:+.3f}]"

    return pd.DataFrame({
        "s": ss.distance, "mean KL_seq(π‖ref)": ss.kl_seq_rev_mean.map(sci), "form": ss.form,
        "cos vs ∇ seq KL(π‖ref)": [cell(r, "seq_rev") for _, r in ss.iterrows()],
        "cos vs ∇ seq KL(ref‖π)": [cell(r, "seq_fwd") for _, r in ss.iterrows()],
        "cos vs ∇ token-local rev KL": [cell(r, "local_rev") for _, r in ss.iterrows()],
        "cos vs ∇ token-local fwd KL": [cell(r, "local_fwd") for _, r in ss.iterrows()],
        "max rel err vs ∇ seq rev": ss.rel_err_seq_rev_max.map(sci)})


def findings(tables: dict) -> list[str]:
    """Plain-language observations with their numbers (Markdown bullets), computed from the tables."""
    b = tables["bins"]
    by = {k: b[b.estimator == k].reset_index(drop=True) for k in ESTIMATORS}
    ratio = by["k3"].std_enum / by["k1"].std_enum
    below = by["k1"].kl_mean[ratio < 1]
    above = by["k1"].kl_mean[ratio >= 1]
    gs = tables["gaussian"]
    g2 = {k: gs[(gs.mu == 2.0) & (gs.estimator == k)].rel_std for k in ESTIMATORS}
    gauss_note = (f" Schulman's Gaussian case shows the same crossover (μ = 2: std/KL k1 {g2['k1'].iloc[0]:.2f}, "
                  f"k3 {g2['k3'].iloc[0]:.2f})." if len(g2["k1"]) else "")
    out = [f"**Where k3 beats k1.** k3's exact std is below k1's in the bins with mean per-token KL up to "
           f"{sci(below.max()) if len(below) else 'none'} (k3/k1 std ratio {ratio.min():.2f} in the lowest bin); "
           f"from {sci(above.min()) if len(above) else 'none'} nats/token up it is above (ratio up to "
           f"{ratio.max():.1f}).{gauss_note}",
           f"**Token distributions are not Gaussian.** At small per-token KL the relative std of k2 and k3 is "
           f"{by['k2'].rel_std_enum.iloc[0]:.0f} and {by['k3'].rel_std_enum.iloc[0]:.0f} (lowest bin), not "
           f"Schulman's 1.42: the policy's next-token distributions are peaked, and the KL's expectation is carried "
           f"by rarely sampled tokens (next point).",
           f"**Heavy tails.** k3's mean rests on rare tokens with π_ref/π ≫ 1: its sampled std is up to "
           f"{(by['k3'].std_enum / by['k3']['std']).max():.1f}x below its exact std, and its median is "
           f"{sci(by['k3'].rel_median.iloc[0])} × KL in the lowest bin. A batch-mean k3 (e.g. a logged kl_ref) is "
           f"unbiased but typically reads low. k1's median ranges from {by['k1'].rel_median.min():.2f} to "
           f"{by['k1'].rel_median.max():.2f} × KL over the bins, and up to {by['k1'].frac_neg.max():.0%} of its "
           f"values are negative."]
    mc = tables["mc"]
    k1 = mc[mc.form == "k1"]
    k2 = mc[mc.form == "k2"]
    out.append(f"**Gradient noise.** k1 as a loss has expected gradient 0 yet a per-token gradient std of "
               f"{k1.rel_std_per_sample.max():.1f} × |∇KL| "
               f"(s = {k1.distance.iloc[k1.rel_std_per_sample.argmax()]:g}): "
               f"it adds only noise (mean cos with ∇KL {k1.mc_cos_rev.abs().max():.3f} at most). k2 / k1-in-reward "
               f"have per-token std {k2.rel_std_per_sample.min():.1f}-{k2.rel_std_per_sample.max():.1f} × |∇KL|; "
               f"the MC std matches per-token std / √N.")
    g = tables["grad"][tables["grad"].off_policy == 0]
    row = lambda f, c: ", ".join(f"{v:.3f}" for v in g[g.form == f][c])  # noqa: E731
    kls = ", ".join(f"{r.kl_rev:.2f}/{r.kl_fwd:.2f}" for r in g[g.form == "k1_reward"].itertuples())
    out.append(f"**k1, k2, k3 in the reward, by distance** (per-token KL reverse/forward {kls} nats): cos of the "
               f"expected gradient with ∇KL(π‖ref): k1 {row('k1_reward', 'cos_rev')}; k2 {row('k2_reward', 'cos_rev')}; "
               f"k3 {row('k3_reward', 'cos_rev')}; with ∇KL(ref‖π): k1 {row('k1_reward', 'cos_fwd')}; "
               f"k2 {row('k2_reward', 'cos_fwd')}; k3 {row('k3_reward', 'cos_fwd')}. Only k1 in the reward is a KL "
               f"gradient; the reverse and forward gradients themselves separate only from about 1 nat per token "
               f"(their cos: {row('k3', 'cos_rev')}).")
    ss = tables["seq_summary"]
    k2s = ss[ss.form == "k2"]
    out.append("**Sequences.** Summed over a sequence, the per-token k2 loss (and k3_k2grad, k3_ratio) follows the "
               "gradient of the token-local KL, not of the sequence KL: mean cos with ∇ seq KL(π‖ref) "
               + ", ".join(f"{r.cos_seq_rev_mean:.3f} (min {r.cos_seq_rev_min:.3f}) at s = {r.distance:g}"
                           for r in k2s.itertuples())
               + ". k1 in the reward (sequence sum or reward-to-go) gives the sequence-KL gradient exactly. k3 as a "
               "loss follows neither sequence KL exactly (it is the token-local forward KL, prefixes drawn from π).")
    return [f for f in out if f]


def git_commit() -> str:
    """The commit of the checkout this code runs from ("unknown" outside a git checkout)."""
    try:
        here = Path(__file__).resolve().parent
        c = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return c.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_readme(out: Path, args: Args, command: str, tables: dict, verdict_rows: list, seconds: float) -> None:
    """README.md: the regenerate command, verdicts, findings, then one section per part with its tables."""
    text = (_readme_head(args, command, tables, verdict_rows, seconds) + _readme_part0(args, tables)
            + _readme_part_a(args, tables) + _readme_part_b(args, tables) + _readme_notes(tables))
    (out / "README.md").write_text(text)


def _readme_head(args: Args, command: str, tables: dict, verdict_rows: list, seconds: float) -> str:
    """Title, the command that regenerates the folder, the verdicts with their thresholds, the findings."""
    v = pd.DataFrame(verdict_rows)
    quick = "\n**--quick run: smoke-test sizes, numbers are not meant to be read.**\n" if args.quick else ""
    return f"""# KL-estimator study: estimator quality and gradient behaviour of k1, k2, k3
{quick}
Regenerate everything in this folder (about {seconds:.0f} s on 2 CPU cores, plus a one-time ~1 min warm start
if the SFT cache is cold):

```
{command}
```

Code: `experiments/studies/kl_estimators.py` (its module docstring defines every quantity), the
`experiments/studies/kl_*.py` it imports (sampling, scoring, gradients) and `analysis/studies/kl_*.py` (settings,
verdicts, tables, this README); tests: `tests/test_kl_study.py`.
Commit: `{git_commit()}`. Notation as in algos/kl.py: samples from π, x = log π_ref(y) − log π(y),
k1 = −x, k2 = x²/2, k3 = eˣ − 1 − x. All KLs in nats per token (sequences: nats per sequence).

## Verdicts (REFERENCE.md "KL" claims)

{chr(10).join(f"- **{r.claim}: {r.verdict}.** {r.evidence}" for r in v.itertuples())}


Thresholds: unbiased = exact (enumerated) |bias| / KL < {EXACT_UNBIASED:g} and sampled |bias| / SE < {UNBIASED_Z}
in every KL bin; "low/high variance" compares the exact std bin by bin; gradient identities to a relative
error < {GRAD_RTOL:g} (float64, exact enumeration); zero gradient = |g| / |∇KL| < {ZERO_GRAD_TOL:g}.

## Findings beyond the claims

{chr(10).join("- " + f for f in findings(tables))}

"""


def _readme_part0(args: Args, tables: dict) -> str:
    """Section 0: the method check against Schulman's Gaussian table."""
    return f"""## 0. Method check: Schulman's Gaussian table

q = N(0, 1) samples (the policy π), p = N(μ, 1) reference, true KL(q‖p) = μ²/2, {args.gauss_samples:,} samples,
statistics from `estimator_stats` (the function part (a) uses). Schulman's published values where he gives them.

{md(display_gaussian(tables['gaussian']))}
"""


def _readme_part_a(args: Args, tables: dict) -> str:
    """Section a: estimator quality on the tiny policy (per-policy and per-bin tables, the figure)."""
    return f"""## a. Estimator quality on the tiny policy (no training)

Reference: the cached SFT warm start of the default config (`load_config(None, [])`, seed {args.seed}), 0.13M
parameters. Policies: the reference with every parameter tensor p → p + σ·std(p)·N(0, 1),
σ ∈ {list(args.sigmas)}.
Each samples {args.n_prompts} prompts × {args.group} completions (HF engine, temperature 1); both models score the
completions with full logits. Per response token: k1, k2, k3 of the sampled token, the exact per-token
KL(π‖π_ref) given the prefix (`algos.kl.exact_kl`, 24-token vocabulary), and each estimator's exact conditional
mean given the prefix (enumerating the vocabulary). Tokens of all policies are pooled and binned by the exact
per-token KL (decade bins; bins with < {MIN_BIN_TOKENS} tokens dropped).

Per policy:

{md(display_policies(tables['policies']))}
Per true-KL bin: "bias (sampled)" = mean(k − KL_t) over the bin's sampled tokens; SE = std (exact) / √tokens;
"bias/KL (exact)" = mean over the bin's tokens of E[k | prefix] − KL_t (vocabulary enumerated, no sampling noise),
over the bin's mean KL; "std (sampled)" = std(k − KL_t) over the sampled tokens; "std (exact)" = the same std
from each prefix's exact conditional variance (the sampled std misses rare, large values of heavy-tailed
estimators); "median/KL" = median of the sampled k over the bin's mean KL; "frac < 0" = fraction of sampled values
below 0.

{md(display_bins(tables['bins']))}
![bias, std and relative std of k1, k2, k3 against the exact per-token KL](kl_token_bins.png)

`kl_token_bins.png`: left, bias (sampled, ±2 SE bars; lines: exact enumerated bias); middle, std in nats/token
(dashed: std = true KL); right, std / true KL. x: the bin's mean exact per-token KL, log scale.

"""


def _readme_part_b(args: Args, tables: dict) -> str:
    """Section b: gradient behaviour (exact, off-policy, Monte-Carlo, sequence tables)."""
    return f"""## b. Gradient behaviour

### Exact expected gradients, one-token categorical (V = {args.vocab}, on-policy, float64)

π logits = ref + s·N(0, 1). Each form's expected gradient Σ_v π(v) ∂s(v)/∂θ (sample held fixed,
old_logp = sg(lp)) against the exact gradients of the reverse KL(π‖ref) (∇rev) and the forward KL(ref‖π) (∇fwd).

{md(display_grad(tables['grad'][tables['grad'].off_policy == 0]))}
### Off-policy (samples from π_old = π with logits + 0.5·N(0, 1); no importance weight except k3_ratio's own)

{md(display_grad(tables['grad'][tables['grad'].off_policy > 0]))}
### Monte-Carlo gradient estimates (on-policy, {args.mc_tokens:,} tokens per estimate, {args.mc_reps} repetitions)

Relative std = sqrt(Σ_j Var(ĝ_j)) / |∇KL(π‖ref)|; "per-token" is the same for a single sampled token (exact,
from the enumerated covariance). k1 as a loss has expected gradient 0: its estimates are pure noise.

{md(display_mc(tables['mc']))}
### Sequence case (tabular autoregressive toy: V = 4, T = 3, all 64 sequences enumerated)

{args.seq_instances} random (π, ref) pairs per distance s.

Per-token losses summed over the sequence (as the training loop aggregates them) and k1 in the reward (sequence
sum, verl; or reward-to-go, OpenRLHF), against the exact gradients of the sequence-level KLs and of the
"token-local" KL Σ_y sg(π(y)) Σ_t KL_t(·|y<t) (prefix distribution held fixed). Cells: mean [min, max] cosine.
The tiny transformer's sequence space (24 tokens, up to 11 steps) cannot be enumerated, so the toy stands in.

{md(display_sequence(tables['seq_summary']))}
"""


def _readme_notes(tables: dict) -> str:
    """The closing notes (REFERENCE.md's k2 sign, on/off-policy equivalences, sequences, the clamp)."""
    return f"""## Notes

- **REFERENCE.md k2 sign.** The table's k2 row gives the gradient as "x grad" with x = ref − lp. With "grad"
  meaning ∇log π (as in the k1 and k3 rows), that is the *negative* of the reverse-KL gradient (cos = −1 in the
  row "REFERENCE.md k2 row literally"). ∇(x²/2) = x ∇x = −x ∇log π = (lp − ref) ∇log π, which is what
  algos/kl.py's docstring says and what its code computes. Suggested fix for REFERENCE.md (not edited here):
  "−x ∇log π = (lp − ref) ∇log π".
- **On-policy, k2 ≡ k3_k2grad ≡ k3_ratio in gradient**; they differ off-policy, where only k3_ratio (the importance
  ratio kept in the graph) still gives ∇KL(π‖ref) exactly.
- **Sequences.** The per-token identities hold per token; summed over a sequence, k2 as a loss gives the gradient of
  the token-local KL (prefix distribution held fixed), not of the sequence KL: it misses the term through which
  earlier tokens change the distribution of later prefixes. k1 in the reward (sequence sum or reward-to-go) is
  the exact sequence-KL gradient. See the sequence table for how far apart they are.
- No value clamp is applied (verl's ±10 clamp on k3 is off); algos' internal clamp of x to ±20 before exp is, and
  on sampled tokens it triggered at most at a fraction {tables['policies'].frac_x_clamped.max():.4f} of them
  (per-policy table).
"""


def save_token_bins_figure(bins: pd.DataFrame, out: Path, quick: bool = False) -> None:
    """kl_token_bins.png (PNG only): bias, std and std/KL per exact-KL bin (analysis.plots_studies), at 130 dpi, 60
    for a --quick run."""
    fig, _ = plot_kl_token_bins(bins, ESTIMATORS, COLORS)
    fig.savefig(out / "kl_token_bins.png", dpi=60 if quick else 130)


def write_tables(out: Path, tables: dict) -> None:
    """Each table as CSV (full precision) and Markdown (rounded), and the sequence toy's per-instance CSV."""
    specs = {"gaussian_table": ("gaussian", display_gaussian), "policies": ("policies", display_policies),
             "token_bins": ("bins", display_bins), "grad_categorical": ("grad", display_grad),
             "grad_mc": ("mc", display_mc), "grad_sequence": ("seq_summary", display_sequence)}
    for stem, (key, disp) in specs.items():
        tables[key].to_csv(out / f"{stem}.csv", index=False, lineterminator="\n")
        (out / f"{stem}.md").write_text(md(disp(tables[key])))
    tables["seq"].to_csv(out / "grad_sequence_instances.csv", index=False, lineterminator="\n")


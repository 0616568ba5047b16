"""KL-estimator study verdicts: one row per REFERENCE.md "KL" claim (claim, verdict, evidence), each traced to a named
threshold of analysis/studies/kl_config.py."""

from __future__ import annotations

import pandas as pd

from objbench.analysis.studies.kl_config import ESTIMATORS, EXACT_UNBIASED, GRAD_RTOL, UNBIASED_Z, ZERO_GRAD_TOL
from objbench.analysis.studies.kl_report import sci


def verdicts(gauss: pd.DataFrame, bins: pd.DataFrame, grad: pd.DataFrame, seq: pd.DataFrame | None = None
             ) -> list[dict]:
    """One row per REFERENCE.md claim: claim, verdict (confirmed / not confirmed / partly), evidence."""
    return [*estimator_verdicts(gauss, bins), *gradient_verdicts(grad), *sequence_verdicts(seq)]


def _verdict(claim: str, ok: bool, evidence: str, partly: bool = False) -> dict:
    return {"claim": claim, "verdict": "confirmed" if ok else ("partly" if partly else "NOT confirmed"),
            "evidence": evidence}


def estimator_verdicts(gauss: pd.DataFrame, bins: pd.DataFrame) -> list[dict]:
    """The claims about the estimators' values (part a's KL bins, part 0's Gaussian table): bias, variance, sign."""
    out = []

    def add(*a, **kw):
        out.append(_verdict(*a, **kw))

    by = {k: bins[bins.estimator == k].reset_index(drop=True) for k in ESTIMATORS}
    z = {k: (by[k].bias.abs() / by[k].bias_se_enum) for k in ESTIMATORS}
    nb = len(by["k1"])
    g = {k: gauss[gauss.estimator == k].reset_index(drop=True) for k in ESTIMATORS}
    for k in ("k1", "k3"):
        zmax = z[k].max()
        enum = (by[k].bias_enum.abs() / by[k].kl_mean).max()
        add(f"{k} is unbiased", zmax < UNBIASED_Z and enum < EXACT_UNBIASED,
            f"exact (enumerated) |bias|/KL <= {enum:.1e} in all {nb} KL bins (threshold {EXACT_UNBIASED:g}"
            + ("; for k1 this is the KL formula itself" if k == "k1" else "") + "); "
            f"sampled: max |bias|/SE = {zmax:.1f} (threshold {UNBIASED_Z}); Gaussian bias/KL = "
            f"{', '.join(f'{v:+.4f}' for v in g[k].rel_bias)} "
            f"(mu = {', '.join(f'{m:g}' for m in g[k].mu)})")
    # variance comparisons, bin by bin
    k1_high = (by["k1"].std_enum > by["k3"].std_enum) & (by["k1"].std_enum > by["k2"].std_enum)
    lo_bin = by["k1"].iloc[0]
    add("k1 has high variance (the largest std of the three)", bool(k1_high.all()),
        f"k1 has the largest exact std in {int(k1_high.sum())}/{nb} bins; std/KL in the lowest bin "
        f"(mean KL {sci(lo_bin.kl_mean)}): k1 {sci(lo_bin.rel_std_enum)}, k2 "
        f"{sci(by['k2'].rel_std_enum.iloc[0])}, k3 {sci(by['k3'].rel_std_enum.iloc[0])}"
        + ("" if k1_high.all() else "; not in bins with mean KL "
           + ", ".join(sci(v) for v in by["k1"].kl_mean[~k1_high])), partly=bool(k1_high.any()))
    neg = by["k1"].frac_neg
    add("k1 can be negative", bool((neg > 0).any()),
        f"fraction of k1 < 0 per bin: {', '.join(f'{v:.2f}' for v in neg)}")
    k2_biased = (z["k2"] > UNBIASED_Z)
    rel = by["k2"].bias_enum / by["k2"].kl_mean
    gauss_k2 = "; Gaussian bias/KL " + ", ".join(f"{b:.3f} (mu {m:g})" for m, b in zip(g["k2"].mu, g["k2"].rel_bias))
    add("k2 is biased", bool(k2_biased.any()),
        f"|bias|/SE > {UNBIASED_Z} in {int(k2_biased.sum())}/{nb} bins; enumerated bias/KL from "
        f"{sci(rel.iloc[0])} (lowest bin) to {sci(rel.iloc[-1])} (highest){gauss_k2}")
    for k in ("k2", "k3"):
        low = by[k].std_enum < by["k1"].std_enum
        add(f"{k} has low variance (below k1's)", bool(low.all()),
            f"exact std below k1's in {int(low.sum())}/{nb} bins"
            + ("" if low.all() else "; above k1's in bins with mean KL "
               + ", ".join(sci(v) for v in by[k].kl_mean[~low])
               + " (ratio k%s/k1 std there: %s)" % (k[1], ", ".join(
                   f"{a / b:.2f}" for a, b in zip(by[k]['std_enum'][~low], by['k1']['std_enum'][~low])))),
            partly=bool(low.any()))
    mins = bins[bins.estimator == "k3"]["min"].min()
    add("k3 >= 0", bool(mins >= 0 and (by["k3"].frac_neg == 0).all()),
        f"min k3 over all sampled tokens = {sci(mins)}; fraction < 0 = 0 in every bin" if mins >= 0
        else f"min k3 = {mins}")
    return out


def gradient_verdicts(grad: pd.DataFrame) -> list[dict]:
    """The claims about the gradient each KL form gives (part b's one-token categorical, on- and off-policy)."""
    out = []

    def add(*a, **kw):
        out.append(_verdict(*a, **kw))

    def gq(form, col):
        return grad[(grad.form == form) & (grad.off_policy == 0)][col]

    k1n = gq("k1", "norm_ratio_rev").max()
    add("k1 as a loss has zero expected gradient", k1n < ZERO_GRAD_TOL,
        f"max |E[∇k1]| / |∇KL_rev| over distances = {sci(k1n)} (threshold {ZERO_GRAD_TOL:g})")
    for form, tgt, name in (("k2", "rev", "k2 as a loss: gradient = ∇KL(π‖ref)"),
                            ("k1_reward", "rev", "k1 in the reward: gradient = ∇KL(π‖ref)"),
                            ("k3", "fwd", "k3 as a loss: gradient = ∇KL(ref‖π) (forward)")):
        e = gq(form, f"rel_err_{tgt}").max()
        other = "fwd" if tgt == "rev" else "rev"
        add(name, e < GRAD_RTOL, f"max rel err = {sci(e)} (threshold {GRAD_RTOL:g}); cos vs ∇{other} = "
            + ", ".join(f"{v:.3f}" for v in gq(form, f"cos_{other}")))
    for form in ("k3_k2grad", "k3_ratio"):
        e = gq(form, "rel_err_rev").max()
        add(f"{form} as a loss (on-policy): gradient = ∇KL(π‖ref)", e < GRAD_RTOL,
            f"max rel err = {sci(e)} (threshold {GRAD_RTOL:g})")
    off = grad[grad.off_policy > 0]
    if len(off):
        e = off[off.form == "k3_ratio"].rel_err_rev.max()
        others = off[off.form.isin(["k2", "k3", "k3_k2grad"])]
        add("k3_ratio off-policy (samples from π_old): gradient = ∇KL(π‖ref), where k2 / k3 / k3_k2grad are not",
            e < GRAD_RTOL and bool((others.rel_err_rev > 1e-3).all()),
            f"k3_ratio max rel err = {sci(e)}; k2, k3, k3_k2grad rel err "
            f"{sci(others.rel_err_rev.min())} .. {sci(others.rel_err_rev.max())}")
    e = gq("x_dlogpi", "cos_rev")
    add("REFERENCE.md k2 row 'x grad' (x = ref - lp, times ∇log π) is the reverse-KL gradient",
        bool((e > 1 - 1e-9).all()),
        f"E[x ∇log π] has cos = {', '.join(f'{v:+.6f}' for v in e)} with ∇KL(π‖ref): it is the NEGATIVE "
        "gradient; the correct form is (lp - ref) ∇log π = -x ∇log π (as algos/kl.py states)")
    return out


def sequence_verdicts(seq: pd.DataFrame | None) -> list[dict]:
    """The claim about the per-token k2 loss summed over a sequence (part b's sequence toy); none without it."""
    if seq is None or not len(seq):
        return []
    s2 = seq[seq.form == "k2"]
    return [_verdict(
        "(sequences) k2 per-token loss, summed over tokens: gradient = ∇ sequence KL(π‖ref)",
        bool((s2.rel_err_seq_rev < 1e-8).all()),
        f"cos with ∇ seq KL: mean {s2.cos_seq_rev.mean():.3f}, min {s2.cos_seq_rev.min():.3f}; it equals the "
        f"token-local gradient (max rel err {sci(s2.rel_err_local_rev.max())}); k1 in the reward "
        f"(sequence sum) max rel err {sci(seq[seq.form == 'k1_reward_seq'].rel_err_seq_rev.max())}",
        partly=False)]

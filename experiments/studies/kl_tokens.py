"""KL-estimator study parts 0 and a: the estimators' statistics, Schulman's Gaussian table and estimator quality on
the tiny policy (perturbed copies of the warm start, tokens sampled and scored with full logits, binned by exact
KL)."""

from __future__ import annotations

import copy
import math
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from objbench.algos.kl import estimate, exact_kl
from objbench.analysis.studies.kl_config import ESTIMATORS, MIN_BIN_TOKENS, SCHULMAN_TABLE, Args

F64 = torch.float64


def estimator_stats(values, true_kl) -> dict:
    """Bias and spread of a KL estimator against the truth.

    Args:
        values: (N,) estimator values, one per sample.
        true_kl: (N,) the KL each sample estimates (its conditional expectation for an unbiased estimator), or a
            scalar. Shapes broadcast.
    Returns:
        dict: n, kl_mean, bias = mean(values - true_kl), bias_se = std / sqrt(n), std = std(values - true_kl)
        (ddof 1), rel_bias = bias / kl_mean, rel_std = std / kl_mean, frac_neg = fraction of values < 0, min,
        rel_median = median(values) / kl_mean (far below 1 for a skewed estimator whose mean rests on rare
        large values).
    """
    v = np.asarray(values, dtype=np.float64)
    kl = np.broadcast_to(np.asarray(true_kl, dtype=np.float64), v.shape)
    err = v - kl
    n = v.size
    kl_mean = float(kl.mean())
    std = float(err.std(ddof=1)) if n > 1 else float("nan")
    bias = float(err.mean())
    return {"n": n, "kl_mean": kl_mean, "bias": bias, "bias_se": std / math.sqrt(n), "std": std,
            "rel_bias": bias / kl_mean, "rel_std": std / kl_mean, "frac_neg": float((v < 0).mean()),
            "min": float(v.min()), "rel_median": float(np.median(v)) / kl_mean}


def gaussian_table(n: int = 1_000_000, seed: int = 0, mus: Sequence[float] = (0.1, 0.5, 1.0, 2.0)) -> pd.DataFrame:
    """Schulman's table: z ~ q = N(0, 1) (the sampling policy), p = N(mu, 1) (the reference), KL(q||p) = mu^2/2.

    In algos' notation lp = log q(z), ref = log p(z) (normalisers cancel in ref - lp). One row per (mu, kind)
    with ``estimator_stats`` columns and Schulman's published bias/KL, std/KL where he gives them.
    """
    z = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    rows = []
    for mu in mus:
        lp, ref = -0.5 * z**2, -0.5 * (z - mu) ** 2
        kl = mu**2 / 2
        for kind in ESTIMATORS:
            st = estimator_stats(estimate(lp, ref, kind).numpy(), kl)
            pub = SCHULMAN_TABLE.get((mu, kind), (float("nan"), float("nan")))
            rows.append({"mu": mu, "true_kl": kl, "estimator": kind, **st,
                         "schulman_rel_bias": pub[0], "schulman_rel_std": pub[1]})
    return pd.DataFrame(rows)


# ==============================================================================================================
# a. estimator quality on the tiny policy


def perturb(model: torch.nn.Module, sigma: float, generator: torch.Generator) -> torch.nn.Module:
    """A copy of ``model`` with every parameter tensor p -> p + sigma * std(p) * N(0, 1) (in eval mode).

    Relative noise keeps the perturbation comparable across tensors of different scale (embeddings vs norm
    gains); sigma = 0 returns an identical copy.
    """
    m = copy.deepcopy(model)
    m.eval()
    m.requires_grad_(False)
    with torch.no_grad():
        for p in m.parameters():
            scale = p.float().std() if p.numel() > 1 else p.float().abs()
            p.add_((sigma * scale * torch.randn(p.shape, generator=generator)).to(p.dtype))
    return m


def load_reference(args: Args):
    """(reference policy, task, tokenizer) from the cached warm start of ``load_config(None, overrides)``."""
    from objbench.envs.tokenizer import build_char_tokenizer
    from objbench.experiments.config import build_task, load_config
    from objbench.experiments.run.warmstart import warm_start

    cfg = load_config(None, [f"seed={args.seed}", *args.overrides])
    task, tok = build_task(cfg), build_char_tokenizer()
    ref, _, _ = warm_start(cfg, task, tok, cache_dir=args.cache_dir)
    ref.eval()
    ref.requires_grad_(False)
    return ref, task, tok


@torch.no_grad()
def sample_tokens(policy, reference, task, tokenizer, n_prompts: int, group: int, seed: int) -> dict:
    """Sample from ``policy``, score under both models; return flat (N,) float64 arrays over valid tokens.

    Keys: kl (exact reverse per-token KL), kl_fwd (exact forward), x (ref - lp of the sampled token), for each
    estimator k: k (sampled value), k_mean and k_var (exact conditional mean / variance given the prefix),
    plus n_completions, n_tokens, mean_len.
    """
    from objbench.envs.tokenizer import BOS_ID, EOS_ID, PAD_ID
    from objbench.rollout.engine import HFEngine, SamplingParams, repeat_prompts
    from objbench.rollout.scoring import score
    from objbench.rollout.sft import encode_prompts

    problems = task.prompts(seed + 7_777, 0, n_prompts)  # a prompt stream of its own
    p_ids, p_mask = encode_prompts(tokenizer, [p.prompt for p in problems], BOS_ID, PAD_ID)
    p_ids, p_mask = repeat_prompts(p_ids, p_mask, group)
    params = SamplingParams(task.max_response_len() + 6, 1.0, 1.0, EOS_ID, PAD_ID)
    gen = HFEngine(policy).generate(p_ids, p_mask, params, torch.Generator().manual_seed(seed))
    ids, mask = gen.response_ids, gen.response_mask
    pol = score(policy, p_ids, p_mask, ids, mask, with_entropy=False, with_logits=True).logits.to(F64)  # (B,T,V)
    ref = score(reference, p_ids, p_mask, ids, mask, with_entropy=False, with_logits=True).logits.to(F64)
    lp_all, ref_all = torch.log_softmax(pol, -1), torch.log_softmax(ref, -1)  # (B, T, V)
    p_all = lp_all.exp()
    lp = lp_all.gather(-1, ids[..., None]).squeeze(-1)  # (B, T) sampled tokens
    rl = ref_all.gather(-1, ids[..., None]).squeeze(-1)
    out = {"kl": exact_kl(pol, ref)[mask], "kl_fwd": exact_kl(pol, ref, "forward")[mask], "x": (rl - lp)[mask]}
    for kind in ESTIMATORS:
        out[kind] = estimate(lp, rl, kind)[mask]
        every = estimate(lp_all, ref_all, kind)  # (B, T, V): the estimator's value for every possible token
        mean = (p_all * every).sum(-1)
        out[f"{kind}_mean"] = mean[mask]
        out[f"{kind}_var"] = ((p_all * every**2).sum(-1) - mean**2).clamp(min=0)[mask]
    out = {k: v.numpy() for k, v in out.items()}
    out.update(n_completions=ids.shape[0], n_tokens=int(mask.sum()), mean_len=float(mask.sum(-1).float().mean()))
    return out


def token_study(ref, task, tokenizer, args: Args) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Part (a): (tokens, policies) frames. tokens: one row per sampled token of every perturbed policy."""
    frames, pols = [], []
    for i, sigma in enumerate(args.sigmas):
        pol = perturb(ref, sigma, torch.Generator().manual_seed(args.seed * 1000 + i))
        d = sample_tokens(pol, ref, task, tokenizer, args.n_prompts, args.group, seed=args.seed * 1000 + 500 + i)
        meta = {k: d.pop(k) for k in ("n_completions", "n_tokens", "mean_len")}
        df = pd.DataFrame(d)
        df.insert(0, "sigma", sigma)
        frames.append(df)
        pols.append({"sigma": sigma, **meta, "kl_exact": df.kl.mean(), "kl_fwd_exact": df.kl_fwd.mean(),
                     **{f"{k}_mean": df[k].mean() for k in ESTIMATORS},
                     "frac_x_clamped": float((df.x.abs() > 20).mean())})
    return pd.concat(frames, ignore_index=True), pd.DataFrame(pols)


def default_edges() -> np.ndarray:
    """Decade bins of the exact per-token KL, 1e-6 .. 100 nats, plus [0, 1e-6)."""
    return np.concatenate([[0.0], 10.0 ** np.arange(-6, 3)])


def bin_tokens(tokens: pd.DataFrame, edges: Sequence[float] | None = None, min_tokens: int = MIN_BIN_TOKENS
               ) -> pd.DataFrame:
    """Per (true-KL bin, estimator): ``estimator_stats`` of the sampled values, the exact (enumerated) bias and std.

    The sampled std underestimates the std of a heavy-tailed estimator (k3's e^x: rare tokens with
    pi_ref / pi >> 1 carry its mean), so std_enum, computed from each prefix's exact conditional variance, is the
    one to compare estimators by, and bias_se_enum = std_enum / sqrt(n) the standard error of the sampled bias.

    Requires columns kl, k1..k3, k1_mean..k3_mean, k1_var..k3_var (``sample_tokens``). Bins with fewer than
    ``min_tokens`` tokens are dropped.
    """
    need = ["kl", *ESTIMATORS, *(f"{k}_mean" for k in ESTIMATORS), *(f"{k}_var" for k in ESTIMATORS)]
    missing = [c for c in need if c not in tokens.columns]
    if missing:
        raise ValueError(f"bin_tokens: missing column(s) {missing}")
    edges = default_edges() if edges is None else np.asarray(edges, dtype=float)
    idx = np.digitize(tokens.kl.to_numpy(), edges) - 1  # bin i holds edges[i] <= kl < edges[i+1]
    rows = []
    for b in range(len(edges) - 1):
        sel = tokens[idx == b]
        if len(sel) < min_tokens:
            continue
        for kind in ESTIMATORS:
            st = estimator_stats(sel[kind].to_numpy(), sel.kl.to_numpy())
            cond_bias = (sel[f"{kind}_mean"] - sel.kl).to_numpy()  # E[k | prefix] - KL_t, per token
            # population std of k - KL_t over the bin's prefixes: E[Var(k | prefix)] + Var(conditional bias)
            std_enum = float(np.sqrt(sel[f"{kind}_var"].mean() + cond_bias.var()))
            rows.append({"bin_low": edges[b], "bin_high": edges[b + 1], "estimator": kind, **st,
                         "bias_enum": float(cond_bias.mean()), "std_enum": std_enum,
                         "rel_std_enum": std_enum / st["kl_mean"], "bias_se_enum": std_enum / math.sqrt(len(sel))})
    return pd.DataFrame(rows)

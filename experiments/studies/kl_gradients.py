"""KL-estimator study part b: gradient behaviour of the KL forms, exact (by enumeration) and Monte-Carlo, on a one-token
categorical and on a tabular autoregressive sequence toy (float64)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import pandas as pd
import torch

from objbench.algos.kl import estimate, exact_kl
from objbench.analysis.studies.kl_config import GRAD_FORMS, ZERO_GRAD_TOL

F64 = torch.float64


def _surrogate(form: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]:
    """Per-sample surrogate s(v) (a vector over the samples) whose autograd gradient a trainer would follow.

    Args to the returned function: logp (..., ) log pi of the samples (with grad), ref (...,), old (...,) or None.
    """
    if form in ("k1", "k2", "k3", "k3_k2grad", "k3_ratio"):  # the estimator itself used as a loss
        return lambda lp, ref, old: estimate(lp, ref, form, old_logp=lp.detach() if old is None else old)
    if form == "k1_reward":  # REINFORCE with reward -k1 (a penalty): loss sg(k1) log pi
        return lambda lp, ref, old: (lp - ref).detach() * lp
    if form in ("k2_reward", "k3_reward"):  # the same with k2 / k3 as the penalty: loss sg(k) log pi
        kind = form[:2]
        return lambda lp, ref, old: estimate(lp.detach(), ref, kind) * lp
    if form == "x_dlogpi":  # REFERENCE.md's k2 row read literally: "x grad" log pi, x = ref - lp
        return lambda lp, ref, old: (ref - lp).detach() * lp
    raise ValueError(f"unknown gradient form {form!r}")


def per_sample_grads(theta: torch.Tensor, ref_logits: torch.Tensor, form: str,
                     old_logits: torch.Tensor | None = None) -> torch.Tensor:
    """J (V, V): row v = d s(v) / d theta, the gradient a trainer takes when token v was sampled (float64)."""
    ref = torch.log_softmax(ref_logits, -1)
    old = None if old_logits is None else torch.log_softmax(old_logits, -1).detach()
    f = _surrogate(form)
    return torch.autograd.functional.jacobian(lambda th: f(torch.log_softmax(th, -1), ref, old), theta)


def kl_grads(theta: torch.Tensor, ref_logits: torch.Tensor) -> dict:
    """Exact gradients of KL(pi||ref) ("reverse") and KL(ref||pi) ("forward") w.r.t. pi's logits."""
    out = {}
    for direction in ("reverse", "forward"):
        th = theta.detach().clone().requires_grad_()
        (out[direction],) = torch.autograd.grad(exact_kl(th, ref_logits, direction), th)
    return out


def compare(g: torch.Tensor, target: torch.Tensor) -> dict:
    """cos(g, target) (NaN when |g| < ZERO_GRAD_TOL |target|: rounding noise has no direction),
    |g - target| / |target|, |g| / |target|."""
    gn, tn = g.norm().item(), target.norm().item()
    cos = (g @ target).item() / (gn * tn) if gn > ZERO_GRAD_TOL * tn else float("nan")  # no direction
    return {"cos": cos, "rel_err": (g - target).norm().item() / tn, "norm_ratio": gn / tn}


def toy_instance(vocab: int, distance: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(theta, ref_logits) float64: ref ~ N(0, 1)^V, theta = ref + distance * N(0, 1)^V."""
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(vocab, generator=g, dtype=F64)
    return ref + distance * torch.randn(vocab, generator=g, dtype=F64), ref


def categorical_gradients(distances: Sequence[float], vocab: int, seed: int, off_policy: float = 0.0
                          ) -> pd.DataFrame:
    """Exact expected gradient of every form vs the reverse- and forward-KL gradients.

    ``off_policy`` > 0: samples come from pi_old = pi with logits + off_policy * N(0, 1) (the KL loss then
    sees stale samples; only k3_ratio carries the importance ratio pi / pi_old in its value).
    """
    rows = []
    for j, s in enumerate(distances):
        theta, ref_logits = toy_instance(vocab, s, seed * 100 + j)
        target = kl_grads(theta, ref_logits)
        old_logits = None
        if off_policy > 0:
            g = torch.Generator().manual_seed(seed * 100 + 50 + j)
            old_logits = theta + off_policy * torch.randn(vocab, generator=g, dtype=F64)
        w = torch.softmax(theta if old_logits is None else old_logits, -1)  # sampling distribution
        kl_rev = exact_kl(theta, ref_logits).item()
        kl_fwd = exact_kl(theta, ref_logits, "forward").item()
        for form in GRAD_FORMS:
            if old_logits is not None and form in ("k1_reward", "k2_reward", "k3_reward", "x_dlogpi"):
                continue
            J = per_sample_grads(theta, ref_logits, form, old_logits)
            g_exp = w @ J  # E_{v ~ sampler}[J[v]]
            rev, fwd = compare(g_exp, target["reverse"]), compare(g_exp, target["forward"])
            rows.append({"distance": s, "kl_rev": kl_rev, "kl_fwd": kl_fwd, "form": form,
                         "cos_rev": rev["cos"], "rel_err_rev": rev["rel_err"], "cos_fwd": fwd["cos"],
                         "rel_err_fwd": fwd["rel_err"], "norm_ratio_rev": rev["norm_ratio"],
                         "off_policy": off_policy})
    return pd.DataFrame(rows)


def mc_gradients(distances: Sequence[float], vocab: int, seed: int, n_tokens: int, reps: int) -> pd.DataFrame:
    """Monte-Carlo gradient estimates: mean of J[v_i] over ``n_tokens`` samples v_i ~ pi, ``reps`` times.

    Columns: per-sample relative std sqrt(tr Cov_pi(J)) / |grad KL_rev| (exact), the empirical relative std of
    the N-token estimate over the repetitions (should be the former / sqrt(N)), and the mean over repetitions of
    cos(estimate, grad KL_rev) and cos(estimate, grad KL_fwd).
    """
    rows = []
    for j, s in enumerate(distances):
        theta, ref_logits = toy_instance(vocab, s, seed * 100 + j)
        target = kl_grads(theta, ref_logits)
        pi = torch.softmax(theta, -1)
        gen = torch.Generator().manual_seed(seed * 100 + 70 + j)
        idx = torch.multinomial(pi.expand(reps, -1), n_tokens, replacement=True, generator=gen)  # (R, N)
        freq = torch.zeros(reps, vocab, dtype=F64).scatter_add_(1, idx, torch.ones_like(idx, dtype=F64)) / n_tokens
        tn = target["reverse"].norm().item()
        for form in ("k1", "k2", "k3", "k3_k2grad", "k3_ratio", "k1_reward"):
            J = per_sample_grads(theta, ref_logits, form)  # (V, V)
            mean = pi @ J
            per_sample_var = (pi[:, None] * (J - mean) ** 2).sum().item()  # tr Cov_pi(J)
            est = freq @ J  # (R, V): one N-token estimate per repetition
            emp = ((est - mean) ** 2).sum(-1).mean().sqrt().item()
            cos = lambda t: (est @ t / (est.norm(dim=-1) * t.norm())).mean().item()  # noqa: E731
            rows.append({"distance": s, "form": form, "n_tokens": n_tokens, "reps": reps,
                         "rel_std_per_sample": math.sqrt(per_sample_var) / tn,
                         "rel_std_mc": emp / tn,
                         "rel_std_mc_predicted": math.sqrt(per_sample_var / n_tokens) / tn,
                         "mc_cos_rev": cos(target["reverse"]), "mc_cos_fwd": cos(target["forward"])})
    return pd.DataFrame(rows)


def _sequence_model(V: int, T: int):
    """All V^T sequences (S, T) and, per position, the row of the tabular logit table for its prefix."""
    seqs = torch.cartesian_prod(*[torch.arange(V)] * T).reshape(-1, T)  # (S, T)
    offsets = [sum(V**j for j in range(t)) for t in range(T)]  # prefixes of length t start at this row
    prefix = torch.zeros_like(seqs)
    for t in range(T):
        code = torch.zeros(seqs.shape[0], dtype=torch.long)
        for j in range(t):
            code = code * V + seqs[:, j]
        prefix[:, t] = offsets[t] + code
    return seqs, prefix, sum(V**t for t in range(T))


def sequence_gradients(distances: Sequence[float], instances: int, seed: int, V: int = 4, T: int = 3
                       ) -> pd.DataFrame:
    """Sequence case on an enumerable tabular autoregressive policy; one row per (distance, instance, form).

    Exact expected gradient (all V^T sequences weighted by sg(pi(y))) of:
      per-token loss forms: sum_t s(y_t | y_<t) with s from ``_surrogate`` (k1, k2, k3, k3_k2grad, k3_ratio);
      k1_reward_seq: sg(sum_t k1_t) sum_t log pi_t (verl: KL summed into the sequence reward);
      k1_reward_togo: sum_t sg(sum_{t' >= t} k1_t') log pi_t (OpenRLHF: per-token rewards, returns).
    Targets: the sequence-level KL(pi||ref) and KL(ref||pi) over all sequences, and the "token-local" KL
    sum_y sg(pi(y)) sum_t KL_t(. | y_<t) (prefix distribution held fixed), reverse and forward.
    """
    seqs, prefix, n_prefix = _sequence_model(V, T)
    rows = []
    for j, s in enumerate(distances):
        for inst in range(instances):
            g = torch.Generator().manual_seed(seed * 10_000 + j * 1000 + inst)
            ref_logits = torch.randn(n_prefix, V, generator=g, dtype=F64)
            theta0 = ref_logits + s * torch.randn(n_prefix, V, generator=g, dtype=F64)

            def tok_logp(logits):  # (S, T) log-prob of each sequence's tokens
                return torch.log_softmax(logits, -1)[prefix, seqs]

            def grad(fn):
                th = theta0.clone().requires_grad_()
                (gr,) = torch.autograd.grad(fn(th), th)
                return gr.flatten()

            ref_tok = tok_logp(ref_logits)
            with torch.no_grad():
                w = tok_logp(theta0).sum(-1).exp()  # pi(y), (S,), held fixed

            def seq_kl(th, direction):
                lp = tok_logp(th).sum(-1)
                lr = ref_tok.sum(-1)
                if direction == "reverse":
                    return (lp.exp() * (lp - lr)).sum()
                return (lr.exp() * (lr - lp)).sum()

            def local_kl(th, direction):  # sum_y sg(pi(y)) sum_t KL_t(prefix), prefix weights fixed
                per = exact_kl(th[prefix], ref_logits[prefix], direction)  # (S, T)
                return (w[:, None] * per).sum()

            targets = {"seq_rev": grad(lambda th: seq_kl(th, "reverse")),
                       "seq_fwd": grad(lambda th: seq_kl(th, "forward")),
                       "local_rev": grad(lambda th: local_kl(th, "reverse")),
                       "local_fwd": grad(lambda th: local_kl(th, "forward"))}
            forms: dict[str, Callable] = {}
            for form in ("k1", "k2", "k3", "k3_k2grad", "k3_ratio"):
                forms[form] = lambda th, f=_surrogate(form): (w[:, None] * f(tok_logp(th), ref_tok, None)).sum()

            def reward_seq(th):
                lp = tok_logp(th)
                return (w * (lp - ref_tok).detach().sum(-1) * lp.sum(-1)).sum()

            def reward_togo(th):
                lp = tok_logp(th)
                k1 = (lp - ref_tok).detach()
                togo = k1.flip(-1).cumsum(-1).flip(-1)  # sum_{t' >= t} k1_t'
                return (w[:, None] * togo * lp).sum()

            forms["k1_reward_seq"], forms["k1_reward_togo"] = reward_seq, reward_togo
            with torch.no_grad():
                kl_rev, kl_fwd = seq_kl(theta0, "reverse").item(), seq_kl(theta0, "forward").item()
            for form, fn in forms.items():
                gv = grad(fn)
                row = {"distance": s, "instance": inst, "form": form, "kl_seq_rev": kl_rev, "kl_seq_fwd": kl_fwd}
                for name, t in targets.items():
                    c = compare(gv, t)
                    row[f"cos_{name}"], row[f"rel_err_{name}"] = c["cos"], c["rel_err"]
                rows.append(row)
    return pd.DataFrame(rows)


def summarise_sequence(sq: pd.DataFrame) -> pd.DataFrame:
    """Mean [min, max] of the cosines over instances, per (distance, form)."""
    rows = []
    for (s, form), d in sq.groupby(["distance", "form"], sort=False):
        row = {"distance": s, "form": form, "kl_seq_rev_mean": d.kl_seq_rev.mean()}
        for t in ("seq_rev", "seq_fwd", "local_rev", "local_fwd"):
            c = d[f"cos_{t}"]
            row[f"cos_{t}_mean"], row[f"cos_{t}_min"], row[f"cos_{t}_max"] = c.mean(), c.min(), c.max()
            row[f"rel_err_{t}_max"] = d[f"rel_err_{t}"].max()
        rows.append(row)
    return pd.DataFrame(rows)

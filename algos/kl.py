"""KL estimators (per token, from sampled log-probs) and the exact KL over the vocabulary.

Per token, with samples drawn from the current policy pi and x = ref - lp = log(pi_ref / pi)
(Schulman, "Approximating KL Divergence", 2020):

  kind        value                     expectation under pi     gradient when minimised as a loss (on-policy)
  k1          -x = lp - ref             KL(pi || ref), unbiased  grad log pi: expected value 0 -> no regularisation
  k2          x^2 / 2                   biased, low variance     (lp - ref) grad log pi = grad KL(pi || ref), unbiased;
                                                                 the same as k1 placed in the reward
  k3          e^x - 1 - x               KL(pi || ref), unbiased, (1 - pi_ref/pi) grad log pi: expected gradient is
                                        >= 0                     grad KL(pi_ref || pi), the *forward* KL
  k3_ratio    r k3, r = exp(lp - old)   value: k3 importance-    r (lp - ref) grad log pi, whose expectation under
              (r NOT detached)          weighted to pi (= k3     pi_old is grad KL(pi || ref) (DeepSeek-V3.2,
                                        on-policy)               arXiv 2512.02556; TRL use_bias_correction_kl)
  k3_k2grad   value of k3, gradient of k2 (straight-through)     verl "k3+" (kl_penalty ending in "+")

Why r is not detached in k3_ratio: with sg(r) the gradient is r (1 - pi_ref/pi) grad log pi, which
on-policy (r = 1) is exactly k3's forward-KL gradient -- no correction at all. TRL multiplies k3 by its
un-detached ``coef_1``; that product is what DeepSeek-V3.2 calls the unbiased KL estimate.

The log-ratio x is clamped to [-20, 20] before exp (no overflow). ``clamp`` (default None = off) clamps
the *returned value* to [-clamp, clamp]; verl clamps k3 to [-10, 10].
"""

from __future__ import annotations

from typing import Optional

import torch

from objbench.algos._checks import check_float
from objbench.algos.registry import KL_ESTIMATORS

__all__ = ["estimate", "value_estimates", "exact_kl", "exact_kl_both", "exact_kl_both_from_log_probs", "KL_ESTIMATORS", "KL_DIRECTIONS", "VALUE_FORMS"]

_X_CLAMP = 20.0
KL_DIRECTIONS = ("reverse", "forward")
# Estimators defined by their value alone. The other members only change the gradient, which a KL placed in
# the reward does not carry (there k3_ratio and k3_k2grad would both equal k3), so config validation allows
# only these with KLConfig.placement == "reward".
VALUE_FORMS = ("k1", "k2", "k3")


def _x(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return (ref_logp - logp).clamp(-_X_CLAMP, _X_CLAMP)  # x = log pi_ref/pi


def _k1(logp, ref_logp):
    return logp - ref_logp  # -x (unclamped: linear, cannot overflow)


def _k2(logp, ref_logp):
    return 0.5 * (logp - ref_logp) ** 2  # x^2 / 2


def _k3(logp, ref_logp):
    x = _x(logp, ref_logp)
    return torch.expm1(x) - x  # e^x - 1 - x, expm1 keeps it >= 0 for tiny x


@KL_ESTIMATORS.register("k1")
def k1(logp, ref_logp, old_logp=None):
    return _k1(logp, ref_logp)


@KL_ESTIMATORS.register("k2")
def k2(logp, ref_logp, old_logp=None):
    return _k2(logp, ref_logp)


@KL_ESTIMATORS.register("k3")
def k3(logp, ref_logp, old_logp=None):
    return _k3(logp, ref_logp)


@KL_ESTIMATORS.register("k3_ratio")
def k3_ratio(logp, ref_logp, old_logp=None):
    if old_logp is None:
        raise ValueError("old_logp is required by the 'k3_ratio' KL estimator (importance ratio exp(lp - old))")
    # r is deliberately NOT detached: d(r k3) = r (lp - ref) d lp, so E_old[...] = grad KL(pi || ref).
    # A detached r would give r (1 - ref/pi) d lp: on-policy exactly k3's forward-KL gradient.
    r = torch.exp((logp - old_logp.detach()).clamp(-_X_CLAMP, _X_CLAMP))
    return r * _k3(logp, ref_logp)


@KL_ESTIMATORS.register("k3_k2grad")
def k3_k2grad(logp, ref_logp, old_logp=None):
    k2v = _k2(logp, ref_logp)
    return k2v + (_k3(logp, ref_logp) - k2v).detach()  # value k3, gradient k2


def estimate(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    kind: str,
    old_logp: Optional[torch.Tensor] = None,
    clamp: Optional[float] = None,
) -> torch.Tensor:
    """Per-token KL estimate between pi (``logp``) and pi_ref (``ref_logp``); see the module table.

    Args:
        logp: (...) log pi of the sampled tokens (any shape; typically (B, T)).
        ref_logp: same shape, log pi_ref of the same tokens.
        kind: one of ``KL_ESTIMATORS.names()`` (k1, k2, k3, k3_ratio, k3_k2grad).
        old_logp: behaviour log-probs, required by ``k3_ratio`` only.
        clamp: None or > 0; clamps the returned value to [-clamp, clamp].

    Returns:
        Tensor of ``logp``'s shape and dtype. No masking happens here: positions that are not valid tokens
        must be masked by the caller (``aggregate`` does it) and must hold finite values if gradients flow.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kind must be one of {list(KL_ESTIMATORS.names())}, got {kind!r}")
    check_float(logp, "logp")
    check_float(ref_logp, "ref_logp", shape=logp.shape)
    if old_logp is not None:
        check_float(old_logp, "old_logp", shape=logp.shape)
    if clamp is not None and not clamp > 0:
        raise ValueError(f"clamp must be None or > 0, got {clamp}")
    out = KL_ESTIMATORS.get(kind)(logp, ref_logp, old_logp)
    if clamp is not None:
        out = out.clamp(-clamp, clamp)
    return out


def value_estimates(logp: torch.Tensor, ref_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k1, k2, k3) per token, each bit-equal to ``estimate(logp, ref_logp, kind)``, sharing the log-ratio."""
    check_float(logp, "logp")
    check_float(ref_logp, "ref_logp", shape=logp.shape)
    d = _k1(logp, ref_logp)
    return d, 0.5 * d ** 2, _k3(logp, ref_logp)


def exact_kl(logits: torch.Tensor, ref_logits: torch.Tensor, direction: str = "reverse") -> torch.Tensor:
    """Exact per-position KL over the vocabulary, computed with log_softmax (stable for any logit scale).

        direction="reverse":  KL(pi || pi_ref) = sum_v pi(v) (log pi(v) - log pi_ref(v))   (what k1/k3 estimate)
        direction="forward":  KL(pi_ref || pi) = sum_v pi_ref(v) (log pi_ref(v) - log pi(v))

    Terms with zero probability under the weighting distribution contribute 0 (so -inf logits, e.g. a
    masked vocabulary entry, are handled).

    Args:
        logits, ref_logits: (..., V) unnormalised logits, e.g. (B, T, V).
    Returns:
        (...) e.g. (B, T), in the logits' dtype.
    """
    check_float(logits, "logits")
    check_float(ref_logits, "ref_logits", shape=logits.shape)
    if direction not in KL_DIRECTIONS:
        raise ValueError(f"direction must be one of {list(KL_DIRECTIONS)}, got {direction!r}")
    logp = torch.log_softmax(logits, dim=-1)
    ref = torch.log_softmax(ref_logits, dim=-1)
    if direction == "forward":
        logp, ref = ref, logp  # KL(ref || pi): weight by ref
    return _kl_from_log_probs(logp, ref)


def _kl_from_log_probs(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    # sum_v p(v) (log p(v) - log ref(v)) with p = exp(logp); zero-probability terms contribute 0 (where 0 * inf
    # would be NaN); a NaN probability stays NaN
    p = logp.exp()
    return torch.where(p == 0, 0.0, p * (logp - ref)).sum(-1)


def exact_kl_both(logits: torch.Tensor, ref_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``exact_kl(logits, ref_logits)``, ``exact_kl(logits, ref_logits, "forward")``): the same numbers, with
    each log_softmax computed once."""
    check_float(logits, "logits")
    check_float(ref_logits, "ref_logits", shape=logits.shape)
    return exact_kl_both_from_log_probs(torch.log_softmax(logits, dim=-1), torch.log_softmax(ref_logits, dim=-1))


def exact_kl_both_from_log_probs(logp: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL(pi || pi_ref), KL(pi_ref || pi)) per position from normalised log-probs (..., V) of both policies (a
    log_softmax the caller already has)."""
    check_float(logp, "logp")
    check_float(ref, "ref", shape=logp.shape)
    return _kl_from_log_probs(logp, ref), _kl_from_log_probs(ref, logp)

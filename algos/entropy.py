"""Per-token entropy of the policy's next-token distribution.

The entropy bonus itself lives in the objective (``LossConfig.entropy_coef``, default 0: none of the five
published recipes uses one): loss -= entropy_coef * aggregate(H, mask, agg).
"""

from __future__ import annotations

import torch

from objbench.algos._checks import check_float

__all__ = ["token_entropy", "entropy_from_log_probs"]


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(pi(. | s_t)) = -sum_v pi(v) log pi(v), computed with log_softmax (stable for any logit scale).

    Zero-probability entries (e.g. -inf logits) contribute 0.
    Args: logits (..., V), e.g. (B, T, V).  Returns: (...), e.g. (B, T), in the logits' dtype.
    """
    check_float(logits, "logits")
    return entropy_from_log_probs(torch.log_softmax(logits, dim=-1))


def entropy_from_log_probs(logp: torch.Tensor) -> torch.Tensor:
    """The same entropy from normalised log-probs ``logp`` (..., V) (e.g. a log_softmax the caller already has):
    -sum_v exp(logp_v) logp_v, zero-probability entries contributing 0."""
    check_float(logp, "logp")
    p = logp.exp()
    plogp = torch.where(p > 0, p * logp, torch.zeros_like(logp))
    return -plogp.sum(-1)

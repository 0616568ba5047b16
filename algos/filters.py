"""DAPO's filters and reward shaping (Yu et al. 2025, arXiv 2503.14476, sec. 3.2 and 3.4).

These act on the batch, not on the loss formula, so the training loop calls them where its data flow says:
``overlong_penalty`` on the rewards right after sampling (so dynamic sampling sees the shaped rewards),
``dynamic_sampling_keep`` before building the training batch, ``overlong_filter`` on the loss mask.
"""

from __future__ import annotations

import torch

from algos._checks import as_mask, check_float, check_group_size

__all__ = ["dynamic_sampling_keep", "overlong_penalty", "overlong_filter"]


def dynamic_sampling_keep(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO dynamic sampling (sec. 3.2): keep a group only if its rewards are not all equal.

    A group whose rewards are all equal has zero group-relative advantage and no gradient signal.
    Args: rewards (B,) float in contiguous groups of group_size (>= 2, dividing B).
    Returns: (n_groups,) torch.bool keep mask.
    """
    check_float(rewards, "rewards", ndim=1)
    check_group_size(group_size, rewards.shape[0], minimum=2)
    r = rewards.view(-1, group_size)
    return r.amax(dim=1) != r.amin(dim=1)


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment (sec. 3.4), with L_exp = L_max - L_cache:

        R_length(y) = 0                              |y| <= L_exp
                    = (L_exp - |y|) / L_cache        L_exp < |y| <= L_max
                    = -1                             |y| > L_max
    multiplied by ``factor`` (verl's overlong_penalty_factor; the paper uses 1). Added to the task reward.

    Args:
        lengths: (B,) response lengths |y| (integer or float tensor).
        max_len: L_max > 0.  cache_len: L_cache in [0, L_max] (0: no soft zone, -factor beyond L_max).
        factor: >= 0.
    Returns:
        (B,) penalty <= 0, float (``lengths``' dtype if floating, else the default dtype).
    """
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1:
        raise ValueError(f"lengths must be a 1-D tensor, got {getattr(lengths, 'shape', type(lengths))}")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len <= 0:
        raise ValueError(f"max_len must be a positive int, got {max_len!r}")
    if isinstance(cache_len, bool) or not isinstance(cache_len, int) or not 0 <= cache_len <= max_len:
        raise ValueError(f"cache_len must be an int in [0, max_len={max_len}], got {cache_len!r}")
    if not factor >= 0:
        raise ValueError(f"factor must be >= 0, got {factor}")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    n = lengths.to(dtype)
    expected = max_len - cache_len  # L_exp
    soft = (expected - n) / max(cache_len, 1)  # only used where cache_len > 0 (the soft zone is empty otherwise)
    pen = torch.where(n <= expected, torch.zeros_like(n), torch.where(n <= max_len, soft, -torch.ones_like(n)))
    return pen * factor


def overlong_filter(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """DAPO overlong filtering: mask the whole loss of truncated responses.

    Args: mask (B, T) torch.bool (or 0/1 integer/float, see ``algos._checks.as_mask``); truncated (B,) likewise,
    True = the response hit the length limit.
    Returns: (B, T) torch.bool, the rows of truncated responses all False. (``aggregate`` then drops those
    rows from the sequence count.)
    """
    mask = as_mask(mask)
    truncated = as_mask(truncated, "truncated", ndim=1)
    if truncated.shape[0] != mask.shape[0]:
        raise ValueError(f"truncated must have shape ({mask.shape[0]},), got {tuple(truncated.shape)}")
    return mask & ~truncated[:, None]

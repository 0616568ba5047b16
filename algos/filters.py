"""Filters and reward shaping: DAPO's (Yu et al. 2025, arXiv 2503.14476, sec. 3.2 and 3.4), and the group
selection and group reward correction of seed 003 (sec. 4.2 and 4.3).

These act on the batch, not on the loss formula, so the training loop calls them where its data flow says:
``overlong_penalty`` and ``group_reward_correction`` on the rewards right after sampling (so dynamic
sampling sees the shaped rewards), ``dynamic_sampling_keep`` before building the training batch,
``overlong_filter`` and ``top_fraction_keep`` on the loss mask (a response removed from the loss keeps its
reward in its group's baseline).

Group layout: ``group_size`` is an int G or a sequence of Python ints, one size per contiguous group
(``algos.groups``).
"""

from __future__ import annotations

import math

import torch

from objbench.algos._checks import as_mask, check_float
from objbench.algos.groups import Segments, layout

__all__ = ["dynamic_sampling_keep", "overlong_penalty", "overlong_filter", "top_fraction_keep",
           "group_reward_correction"]


def dynamic_sampling_keep(rewards: torch.Tensor, group_size) -> torch.Tensor:
    """DAPO dynamic sampling (sec. 3.2): keep a group only if its rewards are not all equal.

    A group whose rewards are all equal has zero group-relative advantage and no gradient signal.
    Args: rewards (B,) float in contiguous groups of group_size (>= 2, dividing B; or a sequence of sizes >= 2).
    Returns: (n_groups,) torch.bool keep mask.
    """
    check_float(rewards, "rewards", ndim=1)
    G, sizes = layout(group_size, rewards.shape[0], minimum=2)
    if sizes is not None:
        return ~Segments(sizes, rewards).zero_var(rewards)
    r = rewards.view(-1, G)
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


def _top_k(G: int, fraction: float, min_keep: int) -> int:
    # ceil(fraction * G), robust to 0.3 * 10 = 3.0000000000000004; at least min_keep, at most G
    return min(G, max(min_keep, math.ceil(fraction * G - 1e-9)))


def top_fraction_keep(rewards: torch.Tensor, group_size, fraction: float, min_keep: int = 1) -> torch.Tensor:
    """Group selection (seed 003, sec. 4.3: "keep the top 30% of each group by reward"): which responses of
    each group enter the update.

    Group g keeps its k_g = min(G_g, max(min_keep, ceil(fraction * G_g))) highest rewards. Ties are broken by
    position: among equal rewards the earlier row (lower index) is kept -- deterministic, and unbiased since
    the rows of a group are exchangeable samples. The loop removes the other responses from the *loss* only
    (loss mask), not from the baseline: advantages still come from the whole group, so the kept responses
    are those with the largest advantages. (Selecting before the advantage would mostly leave all-equal
    groups, which carry no signal.)

    Args:
        rewards: (B,) float in contiguous groups; group_size: G (dividing B) or a sequence of sizes.
        fraction: in (0, 1].  min_keep: int >= 1 (1: the best response of every group is always kept).
    Returns:
        (B,) torch.bool, True = the response stays in the loss.
    """
    check_float(rewards, "rewards", ndim=1)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if isinstance(min_keep, bool) or not isinstance(min_keep, int) or min_keep < 1:
        raise ValueError(f"min_keep must be an int >= 1, got {min_keep!r}")
    G, sizes = layout(group_size, rewards.shape[0], minimum=1)
    sizes = sizes if sizes is not None else (G,) * (rewards.shape[0] // G)
    seg = Segments(sizes, rewards)
    padded = seg.pad(rewards, -math.inf)  # (n, Gmax); padding sorts last (stable: after any real -inf)
    order = torch.sort(padded, dim=1, descending=True, stable=True).indices  # ties: lower position first
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(seg.width, device=rewards.device).expand_as(order))  # (n, Gmax)
    k = torch.tensor([_top_k(g, fraction, min_keep) for g in sizes], device=rewards.device)  # (n,)
    return seg.unpad(rank) < k[seg.ids]


def group_reward_correction(
    rewards: torch.Tensor, flagged: torch.Tensor, group_size, share: float, factor: float
) -> tuple:
    """Group-level reward correction (seed 003, sec. 4.2: when a group shows language mixing its reward is
    penalised, e.g. x 0.8). A rule on the group: when the share of flagged responses in a group exceeds
    ``share``, every reward of that group is multiplied by ``factor``:

        R_i <- factor * R_i   for all i in g,   if  (1/G_g) sum_{i in g} flagged_i > share

    The loop flags the responses the verifier judged malformed (a format violation, ``RewardResult.malformed``).
    Note: group-std advantages are scale-invariant -- (f R - f mean) / (f std + eps) = (R - mean) / (std + eps/f)
    -- so under adv.scale "group" the correction changes nothing but the eps term; it scales Dr. GRPO's
    ("none"), RLOO's and GAE's advantages by ``factor`` and moves the group against the batch under "batch".

    Args:
        rewards: (B,) float; flagged: (B,) bool (or 0/1) per response; group_size: G or a sequence of sizes.
        share: in [0, 1): the predicate is share of flagged > ``share``.  factor: >= 0.
    Returns:
        (corrected rewards (B,), corrected groups (n_groups,) torch.bool).
    """
    check_float(rewards, "rewards", ndim=1)
    flagged = as_mask(flagged, "flagged", ndim=1, shape=rewards.shape)
    if not 0.0 <= share < 1.0:
        raise ValueError(f"share must be in [0, 1), got {share}")
    if not factor >= 0.0:
        raise ValueError(f"factor must be >= 0, got {factor}")
    G, sizes = layout(group_size, rewards.shape[0], minimum=1)
    sizes = sizes if sizes is not None else (G,) * (rewards.shape[0] // G)
    seg = Segments(sizes, rewards)
    hit = seg.mean(flagged.to(rewards.dtype)) > share  # (n,)
    return torch.where(hit[seg.ids], rewards * factor, rewards), hit

"""Advantage estimators: GAE (PPO), group-relative (GRPO / Dr. GRPO / TRL batch scaling), RLOO, and the
hybrid of group-relative and GAE (seed 003, "future directions" 2).

Shapes: B responses, T response tokens; ``mask`` is a (B, T) torch.bool tensor, True = valid token.

Group layout (all group functions): rewards are laid out as contiguous groups of ``group_size`` G, rows
``[g*G:(g+1)*G]`` are the G responses to prompt g; B must be divisible by G. ``group_size`` may also be a
sequence of Python ints, one size per contiguous group (adaptive group sizes, ``algos.groups``): every
statistic then uses its group's own size (mean over G_g, ddof = 1 std over G_g - 1, RLOO over G_g - 1).
Equal sizes, given either way, run the same reshape(-1, G) code as before unequal groups existed.

Singleton groups (decision): group estimators reject ``group_size < 2`` with a ValueError naming
``group_size`` -- a group of one has no baseline (verl's loop returns A = R there, its vectorised version 0;
both are silent). One sample per prompt means PPO, which uses GAE with a learned value baseline.

All-equal groups: every member gets an advantage of exactly 0.0 -- not NaN, not 0/eps rounding noise
(``r - mean(r)`` is not exactly 0 in floating point for e.g. three rewards of 0.1, so it is set explicitly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Tuple

import torch

from objbench.algos._checks import (as_mask, check_choice, check_float, check_group_size, complement, masked_mean,
                           masked_sum)
from objbench.algos.aggregate import aggregate
from objbench.algos import global_stats
from objbench.algos.groups import Segments, layout
from objbench.algos.registry import ADVANTAGE_ESTIMATORS

__all__ = [
    "gae",
    "whiten",
    "value_loss",
    "group_relative",
    "rloo",
    "hybrid",
    "group_stats",
    "GroupStats",
    "AdvantageEstimator",
    "broadcast_to_tokens",
    "GROUP_SCALES",
]

GROUP_SCALES = ("group", "batch", "none")


# ----------------------------------------------------------------------------------------------- GAE
def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438, eq. 16).

        delta_t = r_t + gamma V_{t+1} - V_t
        A_t     = delta_t + gamma lam A_{t+1}          (= sum_l (gamma lam)^l delta_{t+l})
        R_t     = A_t + V_t                            (returns, before any whitening)

    The recursion runs over *valid tokens only*: "t+1" is the next valid token of the row, and the last
    valid token has next value 0 and next advantage 0 (the response ends there). Rewards and values at
    masked positions are ignored; outputs there are 0. In the LLM setting the outcome reward sits on the
    last valid token; gamma = lam = 1 is verl's default.

    Args:
        token_rewards: (B, T) float per-token rewards.
        values: (B, T) float value estimates V(s_t) (detach them first: the advantage is a constant).
        mask: (B, T) torch.bool.
        gamma, lam: floats in [0, 1].

    Returns:
        advantages (B, T), returns (B, T); zero at masked positions.
    """
    mask = as_mask(mask)
    check_float(token_rewards, "token_rewards", shape=mask.shape)
    check_float(values, "values", shape=mask.shape)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    r = token_rewards.masked_fill(complement(mask), 0.0)
    v = values.masked_fill(complement(mask), 0.0)
    B, T = mask.shape
    next_value = v.new_zeros(B)  # V of the next valid token, 0 past the end
    next_adv = v.new_zeros(B)
    advs = [None] * T
    for t in reversed(range(T)):  # T is small (response length); the batch dimension is vectorised
        m = mask[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]  # delta_t = r_t + gamma V_{t+1} - V_t
        a = delta + gamma * lam * next_adv  # A_t = delta_t + gamma lam A_{t+1}
        advs[t] = torch.where(m, a, torch.zeros_like(a))
        # a masked token is skipped: the carry passes through it unchanged
        next_value = torch.where(m, v[:, t], next_value)
        next_adv = torch.where(m, a, next_adv)
    advantages = torch.stack(advs, dim=1)  # (B, T)
    returns = (advantages + v).masked_fill(complement(mask), 0.0)
    return advantages, returns


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the valid tokens of the whole batch (as verl's masked_whiten).

    var is unbiased (divides by n - 1; by 1 when n <= 1). When the batch is split over data-parallel ranks
    (``global_stats.data_parallel()``) mean and var are the global batch's (``global_stats.global_mean_var``).
    With ``shift_mean=False`` the mean is added back (only the scale changes). Masked positions are 0 in the output. Shapes: (B, T) -> (B, T).
    """
    mask = as_mask(mask)
    check_float(x, "x", shape=mask.shape)
    if global_stats.data_parallel():  # the batch split over ranks: the moments of the global batch
        mean, var = global_stats.global_mean_var(x, mask)
    else:
        mean = masked_mean(x, mask)
        n = mask.sum().to(x.dtype)
        var = masked_sum((x - mean) ** 2, mask) / (n - 1.0).clamp(min=1.0)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out.masked_fill(complement(mask), 0.0)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: Optional[float],
    agg_mode: str,
    max_len: Optional[int] = None,
) -> Tuple[torch.Tensor, dict]:
    """Clipped value loss (PPO2 / verl ``compute_value_loss``):

        V_clip = V_old + clip(V - V_old, -c, c)
        l_t    = 0.5 * max((V - R)^2, (V_clip - R)^2)

    aggregated with ``aggregate(l, mask, agg_mode, max_len)``. ``cliprange_value=None`` gives the
    unclipped 0.5 (V - R)^2.

    Args:
        values: (B, T) current value predictions (with grad).
        old_values: (B, T) values at rollout time; returns: (B, T) targets; mask: (B, T) torch.bool.

    Returns:
        (loss, metrics) with metrics ``value_loss`` (same as loss, detached), ``value_clipfrac`` (fraction of
        valid tokens where the clipped term is the larger one), ``value_mean``, ``value_explained_var``
        (1 - Var[R - V] / Var[R] over valid tokens; 0 when Var[R] = 0).
    """
    mask = as_mask(mask)
    check_float(values, "values", shape=mask.shape)
    check_float(old_values, "old_values", shape=mask.shape)
    check_float(returns, "returns", shape=mask.shape)
    if cliprange_value is not None and cliprange_value <= 0:
        raise ValueError(f"cliprange_value must be > 0 or None, got {cliprange_value}")
    v = values.masked_fill(complement(mask), 0.0)
    v_old = old_values.masked_fill(complement(mask), 0.0)
    ret = returns.masked_fill(complement(mask), 0.0)
    loss_unclipped = (v - ret) ** 2
    if cliprange_value is None:
        loss_mat = 0.5 * loss_unclipped
        clipped_active = torch.zeros_like(mask)
    else:
        v_clipped = v_old + torch.clamp(v - v_old, -cliprange_value, cliprange_value)
        loss_clipped = (v_clipped - ret) ** 2
        loss_mat = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
        clipped_active = loss_clipped > loss_unclipped
    loss = aggregate(loss_mat, mask, agg_mode, max_len)
    with torch.no_grad():
        vd, rd = v.detach(), ret.detach()
        var_r = masked_mean((rd - masked_mean(rd, mask)) ** 2, mask)
        resid = rd - vd
        var_res = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
        ev = torch.where(var_r > 0, 1.0 - var_res / torch.where(var_r > 0, var_r, torch.ones_like(var_r)),
                         torch.zeros_like(var_r))
        metrics = {
            "value_loss": loss.detach(),
            "value_clipfrac": masked_mean(clipped_active.to(v.dtype), mask),
            "value_mean": masked_mean(vd, mask),
            "value_explained_var": ev,
        }
    return loss, metrics


# ------------------------------------------------------------------------------------ group estimators
def _grouped(rewards: torch.Tensor, group_size: int, minimum: int = 2) -> torch.Tensor:
    check_float(rewards, "rewards", ndim=1)
    check_group_size(group_size, rewards.shape[0], minimum=minimum)
    return rewards.view(-1, group_size)  # (n_groups, G)


def _zero_variance(r: torch.Tensor) -> torch.Tensor:
    # (n_groups, 1) bool: every reward of the group is identical (exact comparison, no tolerance)
    return r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True)


def group_relative(
    rewards: torch.Tensor, group_size, scale: str = "group", eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages (GRPO, Shao et al. 2024, arXiv 2402.03300, sec. 4.1.2):

        scale="group":  A_i = (R_i - mean_g R) / (std_g R + eps)        GRPO
        scale="batch":  A_i = (R_i - mean_g R) / (std_batch R + eps)    TRL scale_rewards="batch"
                        (std_batch over every rank's rows when the batch is split over data-parallel ranks)
        scale="none":   A_i =  R_i - mean_g R                          Dr. GRPO (Liu et al. 2025, arXiv 2503.20783)

    std is torch's *unbiased* estimate (ddof = 1), as in verl, TRL and OpenRLHF. An all-equal group gets
    exactly 0 for every member. eps: verl 1e-6 (our default), TRL 1e-4, OpenRLHF 1e-9.

    Args:
        rewards: (B,) float, contiguous groups (see module docstring).
        group_size: G >= 2 dividing B, or a sequence of group sizes (each >= 2) summing to B.
        scale: "group" | "batch" | "none".
        eps: >= 0, added to the std.

    Returns:
        (B,) per-sequence advantages (broadcast them to tokens with ``broadcast_to_tokens``).
    """
    check_float(rewards, "rewards", ndim=1)
    G, sizes = layout(group_size, rewards.shape[0])
    check_choice(scale, "scale", GROUP_SCALES)
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if sizes is not None:
        return _group_relative_unequal(rewards, sizes, scale, eps)
    r = _grouped(rewards, G)
    zero_var = _zero_variance(r)  # (n, 1)
    centered = torch.where(zero_var, 0.0, r - r.mean(dim=1, keepdim=True))  # R_i - mean_g R
    if scale == "none":
        adv = centered
    else:
        if scale == "group":
            std = r.std(dim=1, correction=1, keepdim=True)  # (n, 1), unbiased
        else:  # "batch"
            std = _batch_std(rewards).expand_as(centered[:, :1])
        # zero-variance groups divide 0 by 1, so eps = 0 is safe too
        denom = torch.where(zero_var, 1.0, std + eps)
        adv = centered / denom
    return adv.reshape(-1)


def _batch_std(rewards: torch.Tensor) -> torch.Tensor:
    # scale="batch": the unbiased std over the whole batch; over every rank's rows when the batch is split
    if global_stats.data_parallel():
        return global_stats.global_mean_var(rewards)[1].sqrt()
    return rewards.std(correction=1)


def _group_relative_unequal(rewards, sizes, scale, eps):
    # the same formulas with each group's own size G_g (every size >= 2, checked by layout)
    seg = Segments(sizes, rewards)
    zero_var = seg.zero_var(rewards)[seg.ids]  # (B,)
    mean = seg.mean(rewards)  # (n,)
    dev = rewards - mean[seg.ids]  # R_i - mean_g R
    centered = torch.where(zero_var, torch.zeros_like(rewards), dev)
    if scale == "none":
        return centered
    if scale == "group":
        std = (seg.sum(dev * dev) / (seg.count - 1.0)).sqrt()[seg.ids]  # unbiased, G_g - 1
    else:  # "batch"
        std = _batch_std(rewards).expand_as(rewards)
    denom = torch.where(zero_var, torch.ones_like(std), std + eps)
    return centered / denom


def rloo(rewards: torch.Tensor, group_size) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, arXiv 2402.14740):

        A_i = R_i - (sum_g R - R_i) / (G - 1)   (= G/(G-1) (R_i - mean_g R))

    Args: rewards (B,) float in contiguous groups; group_size G >= 2 dividing B, or a sequence of group sizes
        (each >= 2; G is then each group's own size).
    Returns: (B,) per-sequence advantages; exactly 0 for all-equal groups.
    """
    check_float(rewards, "rewards", ndim=1)
    G, sizes = layout(group_size, rewards.shape[0])
    if sizes is not None:
        seg = Segments(sizes, rewards)
        zero_var = seg.zero_var(rewards)[seg.ids]
        baseline = (seg.sum(rewards)[seg.ids] - rewards) / (seg.count[seg.ids] - 1.0)  # mean of the other G_g - 1
        return torch.where(zero_var, torch.zeros_like(rewards), rewards - baseline)
    r = _grouped(rewards, G)
    zero_var = _zero_variance(r)
    baseline = (r.sum(dim=1, keepdim=True) - r) / (G - 1)  # mean of the other G-1 rewards
    adv = torch.where(zero_var, torch.zeros_like(r), r - baseline)
    return adv.reshape(-1)


def hybrid(group_adv: torch.Tensor, gae_adv: torch.Tensor, alpha: float) -> torch.Tensor:
    """Hybrid advantage (seed 003, "future directions" 2: the critic's long-term value prediction combined
    with GRPO's short-term group comparison):

        A_it = alpha * A^group_i + (1 - alpha) * A^GAE_it

    A^group the group-relative advantage of sequence i broadcast to its tokens, A^GAE the (whitened, when
    adv.whiten) GAE advantage of token t. alpha = 1 is the group estimator, alpha = 0 GAE; both parts have
    about unit scale (std-scaled groups, whitened GAE), so alpha is close to the share of each.

    Args: group_adv, gae_adv (B, T) (0 at masked positions); alpha in [0, 1].  Returns: (B, T).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    check_float(gae_adv, "gae_adv", shape=group_adv.shape)
    return alpha * group_adv + (1.0 - alpha) * gae_adv


class GroupStats(NamedTuple):
    """Per-group statistics, each (n_groups,)."""

    mean: torch.Tensor  # mean reward of the group
    std: torch.Tensor  # unbiased std (ddof = 1); 0 for a singleton group
    pass_rate: torch.Tensor  # fraction of members with reward >= pass_threshold
    zero_var: torch.Tensor  # bool: all rewards of the group are equal (DAPO dynamic sampling drops these)


def group_stats(rewards: torch.Tensor, group_size, pass_threshold: float = 0.5) -> GroupStats:
    """Per-group mean, unbiased std, pass rate and zero-variance flag (metrics and dynamic sampling).

    ``pass_threshold`` = 0.5 counts a response as passing when its reward is >= 0.5, which is right for
    0/1 and -1/+1 rewards and for small format bonuses added to them. group_size >= 1, or a sequence of
    group sizes >= 1 (a singleton group has std 0 and is zero-variance).

    Args: rewards (B,) float in contiguous groups; group_size dividing B (or the sizes, summing to B).
    Returns: GroupStats of (n_groups,) tensors.
    """
    check_float(rewards, "rewards", ndim=1)
    G, sizes = layout(group_size, rewards.shape[0], minimum=1)
    if sizes is not None:
        seg = Segments(sizes, rewards)
        mean = seg.mean(rewards)
        dev = rewards - mean[seg.ids]
        var = seg.sum(dev * dev) / (seg.count - 1.0).clamp(min=1.0)  # singleton: 0 / 1
        return GroupStats(mean=mean, std=var.sqrt(),
                          pass_rate=seg.mean((rewards >= pass_threshold).to(rewards.dtype)),
                          zero_var=seg.zero_var(rewards))
    r = _grouped(rewards, G, minimum=1)
    if G >= 2:
        std = r.std(dim=1, correction=1)
    else:
        std = torch.zeros_like(r[:, 0])
    return GroupStats(
        mean=r.mean(dim=1),
        std=std,
        pass_rate=(r >= pass_threshold).to(r.dtype).mean(dim=1),
        zero_var=_zero_variance(r).squeeze(1),
    )


def zero_variance_groups(rewards: torch.Tensor, group_size) -> torch.Tensor:
    """``group_stats(rewards, group_size).zero_var`` without the other statistics: (n_groups,) bool, True where
    every reward of the group is identical (exact comparison)."""
    check_float(rewards, "rewards", ndim=1)
    G, sizes = layout(group_size, rewards.shape[0], minimum=1)
    if sizes is not None:
        return Segments(sizes, rewards).zero_var(rewards)
    return _zero_variance(_grouped(rewards, G, minimum=1)).squeeze(1)


def broadcast_to_tokens(seq_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) per-sequence values -> (B, T), the value on every valid token, 0 elsewhere."""
    mask = as_mask(mask)
    check_float(seq_values, "seq_values", shape=mask.shape[:1])
    return seq_values[:, None].expand(mask.shape).masked_fill(complement(mask), 0.0)


# ------------------------------------------------------------ registry members (one signature per family)
@dataclass(frozen=True)
class AdvantageEstimator:
    """Member type of ``ADVANTAGE_ESTIMATORS``.

    compute: fn(*, seq_rewards (B,), token_rewards (B,T), mask (B,T) bool, values (B,T)|None, group_size,
        cfg: AdvantageConfig) -> (advantages (B,T) zero at masked positions, returns (B,T) or None).
        ``group_size`` is the group layout: an int G, or a sequence of Python ints, one size per contiguous
        group (``algos.groups``). Group estimators read ``seq_rewards``; GAE reads ``token_rewards`` (the
        outcome reward on the last valid token plus any per-token reward such as a KL penalty) and
        ``values``; hybrid reads all three.
    min_group_size: the smallest group the estimator accepts (config validation and the adaptive group sizes
        use it).
    needs_values: True when ``values`` must be given (a critic is needed).
    reads: the ObjectiveConfig fields (dotted paths) the estimator reads; ``ObjectiveConfig`` rejects a
        non-default value in an ``adv.*`` or ``value.*`` field that the chosen estimator does not read.
    all_equal_zero: True when every member of a group whose rewards are all equal gets advantage 0 (a group
        baseline); only such estimators have a check for ``kl.reward_zero_var_check`` to choose the rewards of.
    """

    compute: Callable[..., Tuple[torch.Tensor, Optional[torch.Tensor]]]
    min_group_size: int
    needs_values: bool
    reads: Tuple[str, ...]
    all_equal_zero: bool
    reads_token_rewards: bool = True  # False: compute_advantages may pass token_rewards=None (it is not read)
    settings: Optional[type] = None  # a plug-in's settings dataclass: compute() then also gets settings=<instance>


def _gae_estimator(*, seq_rewards, token_rewards, mask, values, group_size, cfg):
    if values is None:
        raise ValueError("values (B, T) are required by the 'gae' advantage estimator")
    adv, ret = gae(token_rewards, values, mask, cfg.gamma, cfg.lam)
    if cfg.whiten:
        adv = whiten(adv, mask)  # returns keep the unwhitened scale: they are the value targets
    return adv, ret


def _group_estimator(*, seq_rewards, token_rewards, mask, values, group_size, cfg):
    adv = group_relative(seq_rewards, group_size, scale=cfg.scale, eps=cfg.eps)
    return broadcast_to_tokens(adv, mask), None


def _rloo_estimator(*, seq_rewards, token_rewards, mask, values, group_size, cfg):
    return broadcast_to_tokens(rloo(seq_rewards, group_size), mask), None


def _hybrid_estimator(*, seq_rewards, token_rewards, mask, values, group_size, cfg):
    if values is None:
        raise ValueError("values (B, T) are required by the 'hybrid' advantage estimator")
    group_adv, _ = _group_estimator(seq_rewards=seq_rewards, token_rewards=token_rewards, mask=mask, values=values,
                                    group_size=group_size, cfg=cfg)
    gae_adv, ret = _gae_estimator(seq_rewards=seq_rewards, token_rewards=token_rewards, mask=mask, values=values,
                                  group_size=group_size, cfg=cfg)
    return hybrid(group_adv, gae_adv, cfg.alpha), ret  # returns: GAE's, the critic's targets


# the critic's settings (value.*) are read only where there is a critic: by the estimator that needs values
_GAE_READS = ("adv.gamma", "adv.lam", "adv.whiten", "value.coef", "value.cliprange", "value.lr_scale")
ADVANTAGE_ESTIMATORS.register("gae", AdvantageEstimator(
    _gae_estimator, min_group_size=1, needs_values=True, reads=_GAE_READS, all_equal_zero=False))
ADVANTAGE_ESTIMATORS.register("group", AdvantageEstimator(
    _group_estimator, min_group_size=2, needs_values=False, reads=("adv.scale", "adv.eps"), all_equal_zero=True,
    reads_token_rewards=False))
ADVANTAGE_ESTIMATORS.register("rloo", AdvantageEstimator(
    _rloo_estimator, min_group_size=2, needs_values=False, reads=(), all_equal_zero=True, reads_token_rewards=False))
# both parts' settings plus alpha; a critic, so value.* too; GAE's part is not 0 on all-equal groups
ADVANTAGE_ESTIMATORS.register("hybrid", AdvantageEstimator(
    _hybrid_estimator, min_group_size=2, needs_values=True, reads=("adv.alpha", "adv.scale", "adv.eps") + _GAE_READS,
    all_equal_zero=False))

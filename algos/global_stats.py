"""The global batch's statistics when one run's batch is split over N data-parallel ranks (issue 45 item 3: the
objective is the single-process objective).

A data-parallel framework (DDP, FSDP) *averages* the ranks' gradients. Every normaliser the objective reads must
therefore be the global batch's, computed before the batch is split, or the objective changes: a token-mean
normalised per rank gives a mean of per-rank means, which weighs the tokens of a rank with short responses more
(the length bias this project studies). This module gives the global numbers:

    data_parallel(group=None)                     # torch.distributed initialised with world size > 1
    all_sum(t, group=None)                        # t summed over the ranks (a copy); t itself at N = 1
    global_divisor_count(mask, mode, group=None)  # what the mode divides by, over the whole global batch
    global_block_weights(mask, mode, blocks, group=None)
    split_weights(block_counts, total, world_size)  # the formula, on plain numbers
    global_mean_var(x, mask, group=None)          # mean and unbiased variance over the valid entries of all ranks

Loss weights. Each built-in aggregation mode is a sum over rows divided by a count (``mode.divisor_count``:
valid tokens for token_mean, non-empty rows for the seq_mean modes; Dr. GRPO's constant L cancels). With the
global count C summed over every rank's rows and N ranks, rank r's block k gets

    w_rk = count(block_rk) / C * N

so that the ranks' gradients of sum_k w_rk * aggregate(block_rk), *averaged* over the N ranks, are the gradient
of the unsplit batch's aggregate (the factor N undoes the average). At N = 1 (no process group, or a group of
one) ``global_block_weights`` *is* ``micro_batch_weights``: the same call, so the same floats, with no
multiplication by 1. The entropy and KL terms of ``compute_loss`` are aggregated with the policy term's mode and
mask, so the one weight per block carries all three with the same global normaliser; so does the critic's value
loss (``compute_value_loss`` uses the actor's mode).

Batch statistics. ``advantages.whiten`` (PPO's whitening over the valid tokens of the whole batch) and
``group_relative(scale="batch")`` (the std over the whole batch) take their moments from ``global_mean_var`` when
``data_parallel()``: the count and the sum are all-reduced, then the sum of squared deviations from the global
mean (two passes, as the single-process code computes them, rather than sum-of-squares minus squared mean, which
cancels badly in float32). Group statistics stay local: a rank holds whole groups, a group never straddles ranks.

``group`` is a torch.distributed process group (None: the default group). Reading whether torch.distributed is
initialised is the only state read here; nothing is stored.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from objbench.algos._checks import as_mask, complement
from objbench.algos.aggregate import micro_batch_weights
from objbench.algos.registry import AGGREGATION_MODES

__all__ = ["data_parallel", "world_size", "all_sum", "global_divisor_count", "global_block_weights",
           "split_weights", "global_mean_var"]


def data_parallel(group=None) -> bool:
    """Whether the batch is split over ranks: torch.distributed is available, initialised, and ``group`` (None:
    the default group) has more than one rank."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def world_size(group=None) -> int:
    """The number N of data-parallel ranks (1 when not ``data_parallel``)."""
    return torch.distributed.get_world_size(group) if data_parallel(group) else 1


def all_sum(t: torch.Tensor, group=None) -> torch.Tensor:
    """``t`` summed element-wise over the ranks of ``group`` (a new tensor; ``t`` is left as it is); ``t`` itself
    when not ``data_parallel``. Every rank must call it, in the same order (a collective)."""
    if not data_parallel(group):
        return t
    out = t.detach().clone()
    torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM, group=group)
    return out


def _divisor_count(mode: str):
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"mode must be one of {list(AGGREGATION_MODES.names())}, got {mode!r}")
    count = getattr(AGGREGATION_MODES.get(mode), "divisor_count", None)
    if count is None:
        raise ValueError(f"aggregation mode {mode!r} does not declare divisor_count (what it divides by), so its loss "
                         f"cannot be split over ranks or micro-batches; give the mode a divisor_count(mask) -> float")
    return count


def global_divisor_count(mask: torch.Tensor, mode: str, group=None) -> float:
    """What ``mode`` divides by (``divisor_count``: valid tokens, or non-empty rows), counted over this rank's rows
    ``mask`` and summed over the ranks of ``group``; the local count when not ``data_parallel``. A collective."""
    local = _divisor_count(mode)(as_mask(mask))
    if not data_parallel(group):
        return local
    return float(all_sum(torch.tensor([local], dtype=torch.float64), group)[0])


def split_weights(block_counts: Sequence[float], total: float, world: int) -> list[float]:
    """w_k = count_k / total * world: the weight of each of this rank's blocks when the ranks' gradients are
    averaged (DDP, FSDP); 0 for every block when the global batch has nothing valid.

    Worked example (token_mean, 2 ranks): rank 0 holds one block of 3 valid tokens, rank 1 one of 1, total 4:
    weights 3/4 * 2 = 1.5 and 1/4 * 2 = 0.5."""
    return [count / total * world if total > 0 else 0.0 for count in block_counts]


def global_block_weights(mask: torch.Tensor, mode: str, blocks: list, group=None) -> list[float]:
    """Weights of this rank's row blocks ``blocks`` (slices or index tensors partitioning the rank's rows ``mask``)
    such that summing each block's aggregated loss times its weight, then averaging the gradients over the ranks,
    gives the whole global batch's loss gradient: w = count(block) / global count * N (``split_weights``).

    Not ``data_parallel``: exactly ``micro_batch_weights(mask, mode, blocks)`` (the single-process floats). A
    collective when data-parallel: every rank calls it, in the same order."""
    if not data_parallel(group):
        return micro_batch_weights(mask, mode, blocks)
    count = _divisor_count(mode)
    mask = as_mask(mask)
    total = global_divisor_count(mask, mode, group)
    return split_weights([count(mask[b]) for b in blocks], total, world_size(group))


def global_mean_var(x: torch.Tensor, mask: Optional[torch.Tensor] = None, group=None):
    """(mean, unbiased variance) of ``x`` over its valid entries (``mask``; None: every entry) on all ranks of
    ``group``: 0-dim tensors of x's dtype. var divides by n - 1 (by 1 when n <= 1), n the global count; mean is 0
    when nothing is valid. The count and sum are all-reduced, then the squared deviations from the global mean
    (two collectives). On one process these are the moments of the local ``x``."""
    if mask is None:
        mask = torch.ones(x.shape, dtype=torch.bool, device=x.device)
    else:
        mask = as_mask(mask)
    x = x.masked_fill(complement(mask), 0.0)
    n_sum = all_sum(torch.stack([mask.sum().to(x.dtype), x.sum()]), group)
    n = n_sum[0]
    mean = n_sum[1] / n.clamp(min=1.0)
    dev = (x - mean).masked_fill(complement(mask), 0.0)
    var = all_sum((dev * dev).sum(), group) / (n - 1.0).clamp(min=1.0)
    return mean, var

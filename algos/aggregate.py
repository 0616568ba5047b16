"""Loss aggregation: (B, T) per-token losses -> one scalar (the length-bias axis).

``aggregate(loss_mat, mask, mode, max_len=None)``; with m the bool mask, |y_i| = sum_t m_it and
B' = the number of rows with at least one valid token:

==========================  ==============================================  ==================================
mode                        formula                                         used by
==========================  ==============================================  ==================================
token_mean                  sum_{i,t} l m / sum_{i,t} m                     DAPO (Yu et al. 2025, sec. 3.3)
seq_mean_token_mean         (1/B') sum_i [ sum_t l m / |y_i| ]              GRPO (Shao et al. 2024, eq. 3)
seq_mean_token_sum          (1/B') sum_i sum_t l m                          verl "seq-mean-token-sum"
seq_mean_token_sum_norm     (1/(B' L)) sum_{i,t} l m,  L = max_len          Dr. GRPO (Liu et al. 2025)
==========================  ==============================================  ==================================

Fully masked rows (decision): a row with no valid token (e.g. a truncated response removed by overlong
filtering) is *excluded* from the row count B' in every seq_mean mode, including seq_mean_token_sum_norm,
so filtering out one response does not dilute the others (as verl's ``agg_loss``; TRL keeps such rows).
An all-masked batch returns 0 -- a 0-dim tensor still connected to ``loss_mat``'s graph (zero gradient) --
never NaN.

Unequal groups (decision; adaptive group sizes, ``algos.groups``): no mode involves the group size G. Every
mode is defined over the flat batch, as verl's and TRL's are, so with groups of unequal size a prompt weighs
in the loss in proportion to its number of responses G_g (more samples, more weight: the point of giving
hard prompts more). With equal groups seq_mean_token_mean equals GRPO's (1/n) sum_g (1/G) sum_i; the per-prompt
form (1/n) sum_g (1/G_g) sum_i for unequal G_g is not offered.

``max_len`` (L) is required for seq_mean_token_sum_norm (it should be the maximum response length the
sampler allows, a constant across steps) and ignored by the other modes.

``aggregate_many(loss_mats, mask, mode, max_len=None)`` reduces K per-token losses that share one mask, a
(K, B, T) tensor, to K numbers in one pass: entry k equals ``aggregate(loss_mats[k], mask, mode, max_len)`` to
the last bit (the built-in modes reduce over the trailing dimensions, so a leading K is carried along; a mode
registered without ``stackable = True`` is called once per k). Metrics that split one aggregate into parts
(e.g. the advantage weight each difficulty carries) use it to avoid K separate passes.

This module's name is shadowed in the package namespace: ``algos.aggregate`` is the *function*. Other
names are reachable with ``from objbench.algos.aggregate import AGGREGATION_MODES``.
"""

from __future__ import annotations

from typing import Optional

import torch

from objbench.algos._checks import as_mask, check_float, complement, row_counts, valid_count
from objbench.algos.registry import AGGREGATION_MODES

__all__ = ["aggregate", "aggregate_many", "micro_batch_weights", "AGGREGATION_MODES"]


# The modes below reduce over the trailing (B, T) dimensions only, so a (K, B, T) loss under one (B, T) mask gives
# K results (aggregate_many); on a 2-D loss ``x.sum(-1)`` of the (B,) row sums and ``x.sum((-2, -1))`` are the
# full sums ``x.sum()``, the same reduction.


def _row_stats(loss_mat: torch.Tensor, mask: torch.Tensor):
    # (..., B) per-row sums of valid losses, (B,) token counts and the scalar count B' of non-empty rows, both
    # clamped to >= 1 (divisors: an empty row contributes 0 / 1 = 0 and is not counted in B')
    row_sum = loss_mat.masked_fill(complement(mask), 0.0).sum(-1)
    row_len, n_rows = row_counts(mask, loss_mat.dtype)
    return row_sum, row_len, n_rows


@AGGREGATION_MODES.register("token_mean")
def token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, max_len: Optional[int] = None) -> torch.Tensor:
    # sum_{i,t} l m / sum_{i,t} m
    return loss_mat.masked_fill(complement(mask), 0.0).sum((-2, -1)) / valid_count(mask, loss_mat.dtype)


@AGGREGATION_MODES.register("seq_mean_token_mean")
def seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, max_len: Optional[int] = None) -> torch.Tensor:
    # (1/B') sum_i [ sum_t l m / |y_i| ]; an empty row contributes 0 / 1 = 0 and is not counted in B'
    row_sum, row_len, n_rows = _row_stats(loss_mat, mask)
    return (row_sum / row_len).sum(-1) / n_rows


@AGGREGATION_MODES.register("seq_mean_token_sum")
def seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, max_len: Optional[int] = None) -> torch.Tensor:
    # (1/B') sum_i sum_t l m
    row_sum, _, n_rows = _row_stats(loss_mat, mask)
    return row_sum.sum(-1) / n_rows


@AGGREGATION_MODES.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, max_len: Optional[int] = None) -> torch.Tensor:
    # Dr. GRPO: (1/(B' L)) sum_{i,t} l m with a constant L, so no per-response length normaliser
    if max_len is None or isinstance(max_len, bool) or not isinstance(max_len, int) or max_len <= 0:
        raise ValueError(
            f"max_len must be a positive int for mode 'seq_mean_token_sum_norm' (Dr. GRPO's constant L, the "
            f"maximum response length), got {max_len!r}"
        )
    row_sum, _, n_rows = _row_stats(loss_mat, mask)
    return row_sum.sum(-1) / (n_rows * max_len)


# LossConfig fields an aggregation mode reads (config validation rejects a non-default loss.max_len otherwise)
seq_mean_token_sum_norm.reads = ("max_len",)
for _mode in (token_mean, seq_mean_token_mean, seq_mean_token_sum, seq_mean_token_sum_norm):
    _mode.stackable = True  # reduces over the trailing (B, T) dimensions only: aggregate_many calls it once


def _token_count(mask: torch.Tensor) -> float:
    return float(mask.sum())


def _row_count(mask: torch.Tensor) -> float:
    return float((mask.sum(-1) > 0).sum())


# ``mode.divisor_count(mask)``: the (unclamped) count a mode divides by, the token count or the number of non-empty
# rows (L of seq_mean_token_sum_norm is a constant and cancels). Every built-in mode is a sum over rows divided by it,
# so a batch split into row blocks aggregates to sum_k aggregate(block_k) * count(block_k) / count(batch):
# micro_batch_weights. A registered mode without divisor_count cannot be split.
token_mean.divisor_count = _token_count
for _mode in (seq_mean_token_mean, seq_mean_token_sum, seq_mean_token_sum_norm):
    _mode.divisor_count = _row_count


def micro_batch_weights(mask: torch.Tensor, mode: str, blocks: list) -> list[float]:
    """Weights w_k with ``aggregate(x, mask) == sum_k w_k * aggregate(x[b_k], mask[b_k])`` for row blocks b_k
    (slices or index tensors) that partition the batch: w_k = count(mask[b_k]) / count(mask), where count is what
    the mode divides by (valid tokens for token_mean, non-empty rows for the seq_mean modes). The normaliser stays
    global over the batch, so gradient accumulation over micro-batches gives the full batch's loss and gradient
    (to rounding). A block with nothing valid gets weight 0 (its aggregate is 0 anyway); so does every block of an
    all-masked batch.

    Worked example (token_mean): rows with 2 and 1 valid tokens, losses [1, 3] and [5]: full = (1+3+5)/3 = 3;
    blocks [row 0], [row 1] give 2 and 5 with weights 2/3 and 1/3: 2*2/3 + 5/3 = 3."""
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"mode must be one of {list(AGGREGATION_MODES.names())}, got {mode!r}")
    count = getattr(AGGREGATION_MODES.get(mode), "divisor_count", None)
    if count is None:
        raise ValueError(f"aggregation mode {mode!r} does not declare divisor_count (what it divides by), so its loss "
                         f"cannot be split into micro-batches; set train.micro_batch_size=0 or give the mode a "
                         f"divisor_count(mask) -> float")
    mask = as_mask(mask)
    total = count(mask)
    return [count(mask[b]) / total if total > 0 else 0.0 for b in blocks]


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, max_len: Optional[int] = None) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a 0-dim tensor; see the module docstring for the modes.

    Args:
        loss_mat: (B, T) float per-token loss; values under ``~mask`` are ignored (may be inf/nan).
        mask: (B, T) torch.bool, True = valid token (0/1 integer or float masks are converted, see
            ``algos._checks.as_mask``).
        mode: one of ``AGGREGATION_MODES.names()``.
        max_len: the constant L of ``seq_mean_token_sum_norm`` (required there, ignored elsewhere).

    Returns:
        0-dim tensor of ``loss_mat``'s dtype; 0 for an all-masked batch.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"mode must be one of {list(AGGREGATION_MODES.names())}, got {mode!r}")
    check_float(loss_mat, "loss_mat", ndim=2)
    mask = as_mask(mask)
    if mask.shape != loss_mat.shape:
        raise ValueError(f"mask must have the shape of loss_mat {tuple(loss_mat.shape)}, got {tuple(mask.shape)}")
    return AGGREGATION_MODES.get(mode)(loss_mat, mask, max_len)


def aggregate_many(loss_mats: torch.Tensor, mask: torch.Tensor, mode: str, max_len: Optional[int] = None) -> torch.Tensor:
    """K per-token losses under one mask, (K, B, T), reduced to (K,): entry k is bit-equal to
    ``aggregate(loss_mats[k], mask, mode, max_len)``. One pass for the built-in modes; a registered mode
    without ``stackable = True`` is called once per k."""
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"mode must be one of {list(AGGREGATION_MODES.names())}, got {mode!r}")
    check_float(loss_mats, "loss_mats", ndim=3)
    mask = as_mask(mask)
    if mask.shape != loss_mats.shape[1:]:
        raise ValueError(f"mask must have the shape of loss_mats[k] {tuple(loss_mats.shape[1:])}, "
                         f"got {tuple(mask.shape)}")
    fn = AGGREGATION_MODES.get(mode)
    if getattr(fn, "stackable", False):
        return fn(loss_mats, mask, max_len)
    return torch.stack([fn(x, mask, max_len) for x in loss_mats])

"""Study diagnostics: measurements of a training step that the update itself does not need, registered here and
run by ``StudyDiagnostics``, a listener of the update (experiments/run/update.py: Setup.update_listeners), never
inside the loss.

Two kinds, each a registry of name -> function:

    BATCH_DIAGNOSTICS[name](step: StepView) -> {metric: float}
        once per step, after the advantages (difficulty-bias measurements: advantage weight per difficulty and per
        group pass count);
    MINIBATCH_DIAGNOSTICS[name](mb: MinibatchView) -> {metric: 0-dim tensor or float}
        after each optimizer step, on the scores of that minibatch's forward; a key's values are reduced over the
        step's optimizer steps like the loss metrics (``metrics.reduce``: mean, or max/min for *_max/*_min), and
        the tensors are read with the loss metrics' device sync. A ``Summed`` value is summed over the
        minibatches instead, and divided once at the end (``finish_summed``).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

import torch

from objbench import algos
from objbench.algos import kl as KL
from objbench.algos import row_counts
from objbench.algos.registry import Registry
from objbench.experiments.run.batch import cpu_column
from objbench.rollout.scoring import Scored

BATCH_DIAGNOSTICS = Registry("batch diagnostic", "(step: StepView) -> dict[str, float]")
MINIBATCH_DIAGNOSTICS = Registry("minibatch diagnostic", "(mb: MinibatchView) -> dict[str, tensor | float]")


@dataclass
class Summed:
    """Metrics that are ratios over the step's minibatches: each minibatch adds ``numerators`` ((K,) tensor, one per
    name) and ``denominator``; the step logs name_i = sum of numerator_i / sum of denominators."""

    names: tuple[str, ...]
    numerators: torch.Tensor
    denominator: torch.Tensor


@dataclass
class StepView:
    """What a batch diagnostic reads: the training batch, the loss mask, the advantages and the settings."""

    batch: object                 # experiments.batch.Batch
    mask: torch.Tensor            # (B, T) bool, the tokens in the loss
    advantages: torch.Tensor      # (B, T)
    objective: object             # algos.ObjectiveConfig in effect at this step
    difficulties: tuple           # the task's difficulty levels
    max_len: int


@dataclass
class MinibatchView:
    """What a minibatch diagnostic reads, after the optimizer step: the forward's detached scores."""

    scores: Scored                # logp (and entropy; full log-probs on the first pass when a reference exists)
    old_logp: torch.Tensor        # (b, T) behaviour log-probs
    mask: torch.Tensor            # (b, T) loss mask
    gen_mask: torch.Tensor        # (b, T) the policy's own generated tokens
    ref: Scored | None            # the reference's scores of these rows (full log-probs with log.exact_kl)
    first_pass: bool              # the first epoch: the scores are those of the policy that sampled


def batch_diagnostics(step: StepView) -> dict:
    out: dict = {}
    for name in BATCH_DIAGNOSTICS.names():
        out.update(BATCH_DIAGNOSTICS.get(name)(step))
    return out


def minibatch_diagnostics(mb: MinibatchView) -> tuple[dict, dict]:
    """(values to reduce with the loss metrics, {key: Summed})."""
    out: dict = {}
    for name in MINIBATCH_DIAGNOSTICS.names():
        out.update(MINIBATCH_DIAGNOSTICS.get(name)(mb))
    summed = {k: v for k, v in out.items() if isinstance(v, Summed)}
    return {k: v for k, v in out.items() if k not in summed}, summed


class StudyDiagnostics:
    """The registered study diagnostics as a listener of one update (a new instance per update): called after the
    advantages and after each optimizer step, with what the update hands it; its Summed values are added up over the
    minibatches and finished once, after the last."""

    def __init__(self):
        self.summed: dict = defaultdict(list)

    def after_advantages(self, step: StepView) -> dict:
        return batch_diagnostics(step)

    def after_optimizer_step(self, mb: MinibatchView) -> dict:
        values, sums = minibatch_diagnostics(mb)
        for k, v in sums.items():
            self.summed[k].append(v)
        return values

    def finish(self) -> dict:
        return finish_summed(self.summed)


def finish_summed(parts: dict) -> dict:
    """{key: [Summed of each minibatch, ...]} -> {name: sum of its numerators / sum of the denominators}."""
    m = {}
    for pieces in parts.values():
        nums = [p.numerators.tolist() for p in pieces]
        den = sum(float(p.denominator) for p in pieces)
        for i, name in enumerate(pieces[0].names):
            num = sum(part[i] for part in nums)
            m[name] = num / den if den else float("nan")
    return m


def group_weights_by_size(adv: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, sizes: list) -> dict:
    """The difficulty-bias measurement (adv/group_weight_k{k}) for unequal groups: a group's total advantage weight
    sum_i |A_i| against its pass count k, separately for each group size g."""
    w = ((adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)).abs().tolist()
    c = correct.tolist()
    acc, start = defaultdict(list), 0
    for g in sizes:
        acc[(g, sum(c[start:start + g]))].append(sum(w[start:start + g]))
        start += g
    out = {}
    for (g, k), ws in sorted(acc.items()):
        out[f"adv/group_weight_g{g}_k{k}"] = sum(ws) / len(ws)
        out[f"adv/groups_g{g}_k{k}"] = len(ws)
    return out


@functools.lru_cache(maxsize=16)
def _selector_parts(difficulties: tuple, B: int, device: torch.device) -> tuple:
    """weight_shares' constant parts: a (1, B) all-True row and the (D, 1) difficulty column (never written)."""
    return (torch.ones(1, B, dtype=torch.bool, device=device),
            torch.tensor(difficulties, device=device).unsqueeze(-1))


def weight_shares(adv: torch.Tensor, mask: torch.Tensor, difficulty: torch.Tensor, difficulties, agg: str,
                  max_len: int | None) -> dict:
    """adv/weight_share_d<d>: the share of the loss's advantage weight that difficulty d's responses carry.

    The policy-gradient loss is agg(-A * ratio) and its gradient at ratio = 1 is -sum_{i,t} w_it A_it grad logp_it,
    where w_it are the aggregation's per-token weights (1/(B'|y_i|) under seq_mean_token_mean, 1/sum|y| under
    token_mean, ...). The advantage weight of a set of responses is sum over their tokens of w_it |A_it|; since
    agg is linear in the per-token loss, that is agg(|A| * [row in set]) with the batch's own mask, so the shares
    of all difficulties sum to 1. It measures how much of the update each bucket is allowed to drive (its
    directions may still cancel); NaN on a step whose advantages are all zero. Difficulty-bias study (issue 12.4).
    """
    absadv = adv.abs()  # what lies under ~mask is dropped by the aggregation
    # row selectors (1 + D, B): every row (the total), then each difficulty's; one stacked aggregation, one sync
    every, column = _selector_parts(tuple(difficulties), difficulty.shape[0], difficulty.device)
    sel = torch.cat([every, difficulty == column])
    total, *parts = algos.aggregate_many(absadv * sel.unsqueeze(-1), mask, agg, max_len).tolist()
    return {f"adv/weight_share_d{d}": part / total if total > 0 else float("nan")
            for d, part in zip(difficulties, parts)}


def group_weights(adv: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, G: int) -> dict:
    """Difficulty-bias measurement with equal groups of G: adv/group_weight_k<k>, the mean over the groups whose
    pass count is k of their total advantage weight sum_i |A_i| (A_i the response's mean token advantage), and
    adv/groups_k<k>, how many groups that is."""
    seq_adv = (adv * mask).sum(-1) / row_counts(mask, adv.dtype)[0]  # response lengths, clamped to >= 1
    c = correct.tolist()
    k_of = [sum(c[i:i + G]) for i in range(0, len(c), G)]
    weight = seq_adv.abs().view(-1, G).sum(-1)
    # the groups in order of k (by group index within a k): each k's weights are one contiguous slice, so one
    # gather and one sync for every k (each slice's mean is that of weight[groups with that k])
    order = sorted(range(len(k_of)), key=k_of.__getitem__)
    ks = sorted(set(k_of))
    counts = [k_of.count(k) for k in ks]
    index = cpu_column(order, torch.long) if weight.device.type == "cpu" else torch.tensor(order, device=weight.device)
    by_k = weight[index].split(counts)
    means = torch.stack([w.mean() for w in by_k]).tolist()
    m = {}
    for k, n, mean in zip(ks, counts, means):
        m[f"adv/group_weight_k{k}"] = mean
        m[f"adv/groups_k{k}"] = n
    return m


@BATCH_DIAGNOSTICS.register("weight_shares")
def _weight_shares(step: StepView) -> dict:
    if len(step.difficulties) <= 1:
        return {}
    return weight_shares(step.advantages, step.mask, step.batch.difficulty, step.difficulties, step.objective.loss.agg,
                         step.max_len)


@BATCH_DIAGNOSTICS.register("group_weights")
def _group_weights(step: StepView) -> dict:
    """Difficulty-bias measurement: a group's total advantage weight sum_i |A_i| against its pass count k."""
    b, G = step.batch, step.objective.group_size
    if b.group_sizes is not None:
        return group_weights_by_size(step.advantages, step.mask, b.correct, b.group_sizes)
    if G > 1 and b.size % G == 0:
        return group_weights(step.advantages, step.mask, b.correct, G)
    return {}


@MINIBATCH_DIAGNOSTICS.register("log_ratio_spread")
def _log_ratio_spread(mb: MinibatchView) -> dict:
    """Spread of the importance ratio at the start of each optimizer step (the off-policy axis)."""
    lr = (mb.scores.logp - mb.old_logp) * mb.mask
    valid = lr[mb.mask]
    seq_lr = lr.sum(-1) / row_counts(mb.mask, lr.dtype)[0]  # response lengths, clamped to >= 1
    return {"policy/log_ratio_std": valid.std(correction=0) if valid.numel() else 0.0,
            "policy/seq_log_ratio_std": seq_lr.std() if len(seq_lr) > 1 else 0.0}


@MINIBATCH_DIAGNOSTICS.register("entropy")
def _entropy(mb: MinibatchView) -> dict:
    """Mean entropy of the sampling policy over its own tokens (first pass; NaN without a token)."""
    if not mb.first_pass:
        return {}
    return {"policy/entropy": (mb.scores.entropy * mb.gen_mask).sum() / mb.gen_mask.sum()}


@MINIBATCH_DIAGNOSTICS.register("reference_kl")
def _reference_kl(mb: MinibatchView) -> dict:
    """KL to the reference over the policy's own tokens: exact (both directions, from the full log-probs) and the
    k1, k2, k3 estimates; summed over the first pass's minibatches, then divided by their token count."""
    if not mb.first_pass or mb.ref is None:
        return {}
    if mb.scores.log_probs is None or mb.ref.log_probs is None:  # log.exact_kl off (a large vocabulary)
        per_token = KL.value_estimates(mb.scores.logp, mb.ref.logp)
        return {"reference_kl": Summed(("kl/k1", "kl/k2", "kl/k3"),
                                       (torch.stack(per_token) * mb.gen_mask).sum((-2, -1)), mb.gen_mask.sum())}
    rev, fwd = KL.exact_kl_both_from_log_probs(mb.scores.log_probs, mb.ref.log_probs)
    per_token = [rev, fwd, *KL.value_estimates(mb.scores.logp, mb.ref.logp)]  # exact, then k1, k2, k3
    return {"reference_kl": Summed(("kl/exact", "kl/exact_fwd", "kl/k1", "kl/k2", "kl/k3"),
                                   (torch.stack(per_token) * mb.gen_mask).sum((-2, -1)), mb.gen_mask.sum())}


EXACT_KL_MAX_VOCAB = 4096  # log.exact_kl=auto: the built-in models' vocabularies (tens of tokens), not a real LM's


def exact_kl_wanted(exact_kl: str, vocab_size: int) -> bool:
    """Whether the first pass keeps full-vocabulary log-probs for kl/exact (log.exact_kl: auto | on | off)."""
    return exact_kl == "on" or (exact_kl == "auto" and vocab_size <= EXACT_KL_MAX_VOCAB)

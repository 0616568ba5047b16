"""The update of one RL step: advantages, then n_epochs x n_minibatches optimizer steps on the policy loss (and
the critic's value loss), each minibatch forward, loss and backward block by block (train.micro_batch_size; the whole
minibatch is one block), gradients accumulated with each block weighted by its share of the global normaliser.

The update's listeners (Setup.update_listeners; by default the study diagnostics, experiments/run/diagnostics.py)
are handed the advantages and each optimizer step's detached scores, and return metrics; nothing they do enters
the loss.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from objbench import algos
from objbench.algos import filters as F
from objbench.experiments.run.batch import Batch
from objbench.experiments.run.diagnostics import MinibatchView, StepView, exact_kl_wanted
from objbench.experiments.run.metrics import reduce, rename
from objbench.experiments.run.nonfinite import NonFiniteError, all_finite
from objbench.experiments.run.rng import step_generator
from objbench.experiments.run.setup import Setup, timed
from objbench.rollout.scoring import Scored, row_blocks, score, score_blocks, score_values, score_values_blocks


def update(s: Setup, b: Batch, opt, critic_opt, step: int) -> dict:
    """Advantages, then n_epochs x n_minibatches optimizer steps. Returns metrics, with those of the update's
    listeners (Setup.update_listeners: the study diagnostics), measured beside the loss, never inside it."""
    obj = s.cfg.objective
    m: dict = {}
    listeners = [make() for make in s.update_listeners]
    gen_mask, mask = loss_masks(obj, b, m)
    max_len = obj.loss.max_len or s.sampling.max_new_tokens
    ref, values, adv, returns, am = advantages(s, b, mask, max_len)
    # read with the first minibatch's metrics (one device sync); the keys hold their place in m meanwhile
    pending = rename(am)
    m.update(dict.fromkeys(pending))
    view = StepView(b, mask, adv, obj, tuple(s.task.difficulties), max_len)
    for listener in listeners:
        m.update(listener.after_advantages(view))
    B = b.size
    mb = B // obj.n_minibatches
    per_step = defaultdict(list)
    gen = step_generator(s.cfg.seed, step, 1)
    for epoch in range(obj.n_epochs):
        perm = torch.randperm(B, generator=gen) if obj.n_minibatches > 1 else None
        for j in range(obj.n_minibatches):
            # one minibatch; with one, the whole batch itself (the same values an index of arange(B) copies out)
            pick = operator.itemgetter(perm[j * mb:(j + 1) * mb]) if perm is not None else _itself  # x -> rows of x
            mbatch = Minibatch(b, pick, pick(mask), pick(gen_mask), ref, values, pick(adv), returns, max_len,
                               first_pass=epoch == 0, step=step)
            metrics, vals = optimizer_step(s, mbatch, opt, critic_opt)
            with torch.no_grad(), timed(s, "metrics"):
                heard = {}
                for listener in listeners:
                    heard.update(listener.after_optimizer_step(mbatch.view(vals)))
                floats = _floats({**metrics, **heard, **pending})
            for k in pending:
                m[k] = floats.pop(k)
            pending = {}
            record_grad_norm(per_step, floats.pop("optim/grad_norm"), s.cfg.optim.grad_clip)
            for k, v in floats.items():
                per_step[k].append(v)
    for k, v in per_step.items():
        m[k] = reduce(k, v)
    if "optim/nonfinite_skipped" in per_step:  # a count, not a mean
        m["optim/nonfinite_skipped"] = sum(per_step["optim/nonfinite_skipped"])
    for listener in listeners:
        m.update(listener.finish())
    m["optim/steps"] = len(per_step["optim/grad_norm"])
    m["optim/tokens"] = int(b.response_mask.sum()) * obj.n_epochs
    return m


def loss_masks(obj, b: Batch, m: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(the policy's own generated tokens, the tokens in the loss): interjected tokens are never the policy's;
    the overlong filter and group selection (objective.filters) take rows out of the loss."""
    gen_mask = b.response_mask if b.forced is None else b.response_mask & ~b.forced
    mask = F.overlong_filter(gen_mask, b.truncated) if obj.filters.overlong_filter else gen_mask
    return gen_mask, top_select(obj, b, mask, m)


def top_select(obj, b: Batch, mask: torch.Tensor, m: dict) -> torch.Tensor:
    """objective.filters.top_select (algos.filters.top_fraction_keep): only the top responses of each group by reward
    stay in the loss mask; every response keeps its reward in its group's baseline. Logs filters/top_kept_frac."""
    f = obj.filters
    if not f.top_select:
        return mask
    keep = F.top_fraction_keep(b.rewards, b.group_sizes or obj.group_size, f.top_fraction, f.top_min_keep)
    m["filters/top_kept_frac"] = float(keep.float().mean())
    return mask & keep[:, None]


def advantages(s: Setup, b: Batch, mask: torch.Tensor, max_len: int):
    """(reference scores or None, critic values or None, advantages, returns, algos' advantage metrics)."""
    obj = s.cfg.objective
    with torch.no_grad():
        ref = None
        if s.reference is not None:
            with timed(s, "reference"):
                with torch.inference_mode():  # cheaper than no_grad; the log-probs the loss keeps are cloned out
                    ref = score_blocks(s.reference, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                                       block_rows=s.cfg.train.micro_batch_size, temperature=s.cfg.rollout.temperature,
                                       with_entropy=False, with_logits=exact_kl(s), forward=s.forward)
                ref.logp = ref.logp.clone()
        values = None
        if s.critic is not None:
            with timed(s, "critic"):
                values = score_values_blocks(s.critic, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                                             block_rows=s.cfg.train.micro_batch_size)
        with timed(s, "advantages"):
            kl_ref = ref.logp if (ref is not None and obj.kl.placement == "reward") else None
            adv, returns, am = algos.compute_advantages(obj, rewards=b.rewards, mask=mask, values=values,
                                                        old_logp=b.old_logp, ref_logp=kl_ref, max_len=max_len,
                                                        group_sizes=b.group_sizes)
    return ref, values, adv, returns, am


def exact_kl(s: Setup) -> bool:
    """Whether the first pass keeps (B, T, V) log-probs for kl/exact (log.exact_kl; auto: small vocabularies)."""
    return exact_kl_wanted(s.cfg.log.exact_kl, s.codec.vocab_size)


@dataclass
class Minibatch:
    """The rows of one optimizer step (``pick`` selects them from a batch-sized tensor) and what the loss reads."""

    batch: Batch
    pick: Callable
    mask: torch.Tensor
    gen_mask: torch.Tensor
    ref: Scored | None        # the whole batch's reference scores
    values: torch.Tensor | None
    adv: torch.Tensor
    returns: torch.Tensor | None
    max_len: int
    first_pass: bool
    step: int = 0             # the RL step (for the non-finite check's message)

    def view(self, scores: Scored) -> MinibatchView:
        ref = None
        if self.ref is not None:
            full = None if (self.ref.log_probs is None or scores.log_probs is None) else self.pick(self.ref.log_probs)
            ref = Scored(self.pick(self.ref.logp), None, None, full)
        return MinibatchView(scores, self.pick(self.batch.old_logp), self.mask, self.gen_mask, ref, self.first_pass)


def optimizer_step(s: Setup, mb: Minibatch, opt, critic_opt) -> tuple[dict, Scored]:
    """Forward, loss, backward and a clipped optimizer step on one minibatch (then the critic's). Returns (the
    loss metrics as 0-dim tensors, the forward's detached scores). A non-finite loss or gradient norm is never
    applied (train.nan_policy: the run stops, or this optimizer step is skipped)."""
    want_logits = mb.first_pass and mb.ref is not None and exact_kl(s)
    lm, vals = policy_backward(s, mb, opt, want_logits)
    with timed(s, "optimizer"):
        gn = torch.nn.utils.clip_grad_norm_(s.policy_params, s.cfg.optim.grad_clip or float("inf"))
        lr = opt.param_groups[0]["lr"]  # the learning rate this update uses
        applied = apply_if_finite(s, mb.step, opt, gn, lm.get("loss"), "loss", s.lr_schedule)
    metrics = {"optim/grad_norm": gn, **rename(lm)}  # 0-dim tensors: read with one sync by the caller
    if s.lr_schedule is not None:
        metrics["optim/lr"] = lr  # averaged over the step's updates, like optim/grad_norm
    if s.cfg.train.nan_policy == "skip_step":
        metrics["optim/nonfinite_skipped"] = float(not applied)
    if critic_opt is not None:
        metrics.update(critic_step(s, mb, critic_opt))
    return metrics, vals


def apply_if_finite(s: Setup, step: int, opt, grad_norm, loss, quantity: str, schedule=None) -> bool:
    """opt.step() (and the schedule's) when the loss and the gradient norm are finite (one read for both); otherwise
    raise NonFiniteError (train.nan_policy=stop) or drop the gradients and leave weights, optimizer state and
    schedule as they are (skip_step). Returns whether the step was applied."""
    if not all_finite(grad_norm, loss):
        if s.cfg.train.nan_policy == "stop":
            bad_loss = loss is not None and not all_finite(loss)
            raise NonFiniteError(step, quantity if bad_loss or quantity != "loss" else "grad_norm")
        opt.zero_grad(set_to_none=True)
        return False
    opt.step()
    if schedule is not None:
        schedule.step()
    return True


def policy_loss(s: Setup, mb: Minibatch, sc: Scored, rows: slice | None = None):
    """The objective's loss (and its metrics) on rows ``rows`` of the minibatch (None: all), given their scores."""
    obj, b, pick = s.cfg.objective, mb.batch, mb.pick
    kl_in_loss = mb.ref is not None and obj.kl.placement == "loss"
    old_logp, adv, mask = pick(b.old_logp), mb.adv, mb.mask
    ref_logp = pick(mb.ref.logp) if kl_in_loss else None
    if rows is not None:
        old_logp, adv, mask = old_logp[rows], adv[rows], mask[rows]
        ref_logp = None if ref_logp is None else ref_logp[rows]
    return algos.compute_loss(obj, logp=sc.logp, old_logp=old_logp, advantages=adv, mask=mask, ref_logp=ref_logp,
                              entropy=sc.entropy, max_len=mb.max_len)


def block_weights(s: Setup, mb: Minibatch, blocks: list) -> list:
    """Each block's share of the minibatch's normaliser (algos.micro_batch_weights), so that the gradients summed
    over the blocks are the whole minibatch's; the whole minibatch as its one block is not reweighted (None).
    With the batch split over data-parallel ranks (algos.global_stats.data_parallel), every block, even a rank's
    one block, gets its share of the global minibatch's normaliser times the number of ranks
    (algos.global_block_weights: a collective), so that the ranks' averaged gradients are the global minibatch's."""
    if algos.global_stats.data_parallel():
        return algos.global_block_weights(mb.mask, s.cfg.objective.loss.agg, blocks)
    if len(blocks) == 1:
        return [None]
    return algos.micro_batch_weights(mb.mask, s.cfg.objective.loss.agg, blocks)


def detached(sc: Scored, want_logits: bool) -> Scored:
    """The scores' values, for the metrics and the diagnostics (which read only values)."""
    return Scored(sc.logp.detach(), None if sc.entropy is None else sc.entropy.detach(), None,
                  sc.log_probs.detach() if want_logits else None)


def policy_backward(s: Setup, mb: Minibatch, opt, want_logits: bool) -> tuple[dict, Scored]:
    """Forward, loss and backward of the minibatch block by block (train.micro_batch_size rows; the whole minibatch
    is one block), gradients accumulated, each block's loss weighted by its share of the minibatch's normaliser.
    Returns (the loss metrics of the whole minibatch, its detached scores): with one block, those of its own loss;
    with several, computed once more on the blocks' detached scores put together."""
    obj, b, pick = s.cfg.objective, mb.batch, mb.pick
    p_ids, p_mask, r_ids, r_mask = pick(b.prompt_ids), pick(b.prompt_mask), pick(b.response_ids), pick(b.response_mask)
    blocks = row_blocks(mb.mask.shape[0], s.cfg.train.micro_batch_size)
    one = len(blocks) == 1
    opt.zero_grad(set_to_none=True)
    parts = []
    for rows, weight in zip(blocks, block_weights(s, mb, blocks)):
        rows = None if one else rows  # the whole minibatch: its own tensors, not views of them
        with timed(s, "forward"):
            sc = score(s.policy, *(x if one else x[rows] for x in (p_ids, p_mask, r_ids, r_mask)),
                       temperature=s.cfg.rollout.temperature, with_logits=want_logits,
                       entropy_grad=obj.loss.entropy_coef != 0.0, forward=s.forward)
        with timed(s, "loss"):
            loss, lm = policy_loss(s, mb, sc, rows)
        parts.append(detached(sc, want_logits))
        with timed(s, "backward"):
            (loss if weight is None else loss * weight).backward()
            del loss, sc  # the forward's autograd graph goes here (the model's nodes: ~0.1 ms at the default)
    if one:
        return lm, parts[0]
    vals = Scored(*(None if getattr(parts[0], k) is None else torch.cat([getattr(p, k) for p in parts])
                    for k in ("logp", "entropy", "logits", "log_probs")))
    with torch.no_grad(), timed(s, "loss"):
        _, lm = policy_loss(s, mb, vals)
    return lm, vals


def critic_step(s: Setup, mb: Minibatch, critic_opt) -> dict:
    """The critic's value-loss step on the minibatch (GAE and hybrid estimators)."""
    with timed(s, "critic"):
        vm = value_backward(s, mb, critic_opt)
        gn = torch.nn.utils.clip_grad_norm_(s.critic.parameters(), s.cfg.optim.grad_clip or float("inf"))
        apply_if_finite(s, mb.step, critic_opt, gn, vm.get("value_loss"), "value_loss")
    return rename(vm)


def value_backward(s: Setup, mb: Minibatch, critic_opt) -> dict:
    """The critic's value loss and backward block by block (as the policy's: the whole minibatch is one block, the
    normaliser global over the minibatch); returns the metrics of the whole minibatch's values."""
    obj, b, pick = s.cfg.objective, mb.batch, mb.pick
    inputs = (pick(b.prompt_ids), pick(b.prompt_mask), pick(b.response_ids), pick(b.response_mask))
    old_values, returns = pick(mb.values), pick(mb.returns)
    blocks = row_blocks(mb.mask.shape[0], s.cfg.train.micro_batch_size)
    one = len(blocks) == 1
    critic_opt.zero_grad(set_to_none=True)
    parts = []
    for rows, weight in zip(blocks, block_weights(s, mb, blocks)):
        cut = (lambda x: x) if one else (lambda x: x[rows])
        v_new = score_values(s.critic, *(cut(x) for x in inputs))
        vloss, vm = algos.compute_value_loss(obj, values=v_new, old_values=cut(old_values), returns=cut(returns),
                                             mask=cut(mb.mask), max_len=mb.max_len)
        (obj.value.coef * vloss if weight is None else obj.value.coef * weight * vloss).backward()
        parts.append(v_new.detach())
    if one:
        return vm
    with torch.no_grad():
        _, vm = algos.compute_value_loss(obj, values=torch.cat(parts), old_values=old_values, returns=returns,
                                         mask=mb.mask, max_len=mb.max_len)
    return vm


def record_grad_norm(per_step: dict, norm: float, clip: float) -> None:
    per_step["optim/grad_norm"].append(norm)
    if clip:  # clip_grad_norm_ scales every gradient by min(1, clip / (norm + 1e-6))
        per_step["optim/grad_norm_clipped"].append(norm * min(1.0, clip / (norm + 1e-6)))
        per_step["optim/clip_active"].append(float(norm > clip))


def _itself(x):
    return x


def _to_float(v):
    return float(v.detach()) if torch.is_tensor(v) else float(v)


def _floats(d: dict) -> dict:
    """{key: float} of a dict of numbers and 0-dim tensors; the tensors (of one dtype) are read with one device
    sync, not one each (the same values as float(t))."""
    tensors = [v for v in d.values() if torch.is_tensor(v)]
    if len(tensors) < 2 or len({(t.dtype, t.device) for t in tensors}) > 1 or any(t.dim() for t in tensors):
        return {k: _to_float(v) for k, v in d.items()}
    with torch.no_grad():
        values = iter(torch.stack(tensors).tolist())
    return {k: next(values) if torch.is_tensor(v) else float(v) for k, v in d.items()}



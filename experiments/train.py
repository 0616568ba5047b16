"""The training loop: one function of (config, seed), readable top to bottom, never branching on a preset.

One RL step:
  prompts (envs, by index) -> G completions each (rollout engine, + behaviour log-probs) -> rewards (envs)
  -> shaping / dynamic sampling (algos.filters) -> reference log-probs and critic values (no grad)
  -> advantages (algos) -> n_epochs x n_minibatches optimizer steps on the policy loss (+ value loss)
  -> one JSON line of metrics, flushed.

This file holds the run's driver (train), one step (train_step) and the update; each other job has its file:
  setup.py (what the loop runs with), warmstart.py (the cached start policy), collect.py and sample.py
  (sampling, verification, dynamic sampling), batch.py, evaluate.py, scheduling.py (settings at a step),
  step_metrics.py, diagnostics.py (study measurements beside the update), loop_state.py, checkpoint.py,
  run_folder.py (new / resume / done, the lock), logs.py, provenance.py, rng.py.

Files (run_dir = <out_dir>/<run name>/): config.yaml, meta.json, metrics.jsonl, eval.jsonl, samples.jsonl,
checkpoints/last/ (safetensors weights, optimizer, RNG and loop state), done (written last).
A run that finds its folder with a checkpoint and no ``done`` resumes from the checkpoint; rows logged after
the checkpoint are dropped first, so no step appears twice and none is lost.
"""

from __future__ import annotations

import json
import operator
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers.utils import logging as _hf_logging

from objbench import algos
from objbench.algos import filters as F
from objbench.experiments.batch import Batch
from objbench.experiments.checkpoint import (
    load_checkpoint,
    save_checkpoint,
)
from objbench.experiments.collect import collect
from objbench.experiments.config import TrainConfig, check_model
from objbench.experiments.diagnostics import (
    MinibatchView,
    StepView,
    batch_diagnostics,
    exact_kl_wanted,
    finish_summed,
    minibatch_diagnostics,
)
from objbench.experiments.evaluate import evaluate
from objbench.experiments.logs import JsonlWriter, RunLogs
from objbench.experiments.loop_state import LoopState
from objbench.experiments.metrics import reduce, rename
from objbench.experiments.provenance import (
    peak_rss_mb,
    run_meta,
)
from objbench.experiments.plugins import resume_warning
from objbench.experiments.rng import step_generator
from objbench.experiments.run_folder import prepare_run_dir, run_lock, run_status
from objbench.experiments.scheduling import at_step, control_temperature
from objbench.experiments.setup import (
    Setup,
    build_setup,
    make_optimizers,
    timed,
    weights_copy,
)
from objbench.experiments.step_metrics import parse_warning, rollout_metrics
from objbench.rollout.scoring import Scored, row_blocks, score, score_blocks, score_values, score_values_blocks

# transformers' own per-file progress bars (save/load of a 0.5 MB checkpoint) would drown the sweep's bar
_hf_logging.disable_progress_bar()

NONDETERMINISTIC_KEYS = ("time", "time/", "mem/")  # excluded when comparing two runs for determinism
RUN_FILES = ("metrics.jsonl", "eval.jsonl", "samples.jsonl")


# ---------------------------------------------------------------------------------------------------------
# the run


def train(cfg: TrainConfig, *, progress: bool = True, cache_dir=None, meta_extra: dict | None = None,
          after_step: Callable[[int], None] | None = None) -> Path:
    """Run (or resume, or skip if finished) one training run; returns its folder.

    One process at a time per run folder: a second command for the same run stops at once (file lock).
    ``after_step(step)`` is called after each step is logged and checkpointed (tests use it to crash a run)."""
    with run_lock(cfg):
        return _train(cfg, progress=progress, cache_dir=cache_dir, meta_extra=meta_extra, after_step=after_step)


def _train(cfg: TrainConfig, *, progress: bool, cache_dir, meta_extra: dict | None, after_step) -> Path:
    model_info = check_model(cfg)
    run_dir, status = run_status(cfg)
    if status == "done":
        if progress:
            print(f"{run_dir}: already finished (delete its 'done' file to rerun)")
        return run_dir
    # the start policy first: a bad model, data file or warm start fails before any run folder is written
    s = build_setup(cfg, cache_dir)
    run_dir, status = prepare_run_dir(cfg)
    s.policy.train()
    opt, critic_opt = make_optimizers(s)
    state = start_state(run_dir, s, opt, critic_opt, resume=status == "resume")
    before = changed_plugins(run_dir) if status == "resume" else None
    meta = run_meta(cfg, s, state, model_info, meta_extra)
    if before is not None:
        meta["plugins_before_resume"] = before
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    try:
        run_loop(s, run_dir, state, opt, critic_opt, meta, progress, after_step)
    finally:
        if s.reward_fns is not None:
            s.reward_fns.close()
    meta["end"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    meta["peak_rss_mb"] = peak_rss_mb()
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    (run_dir / "done").write_text("")
    return run_dir


def changed_plugins(run_dir: Path) -> list | None:
    """Resuming with plug-in files that changed since the run started: say so (the run goes on) and return the
    plug-ins its meta.json recorded before, for meta.json to keep; None when nothing changed."""
    try:
        old = json.loads((run_dir / "meta.json").read_text()).get("plugins")
    except (OSError, ValueError, AttributeError):
        return None
    warning = resume_warning(old)
    if not warning:
        return None
    print(f"{run_dir}: {warning}", file=sys.stderr)
    return old


def start_state(run_dir: Path, s: Setup, opt, critic_opt, resume: bool) -> LoopState:
    """The loop state to start from: the checkpoint's (its logs cut back to its step), or step 0 (logs cleared)."""
    state = load_checkpoint(run_dir, s, opt, critic_opt) if resume else None
    if state is None:
        for name in RUN_FILES:
            (run_dir / name).unlink(missing_ok=True)
        return LoopState()
    for name in RUN_FILES:
        JsonlWriter.truncate_after(run_dir / name, state.step)
    s.engine.sync_weights(s.policy)  # the engine was built from the warm start, the policy is the checkpoint's
    return state


def run_loop(s: Setup, run_dir: Path, state: LoopState, opt, critic_opt, meta: dict, progress: bool,
             after_step) -> None:
    """Evaluate at step 0, then train step by step: log, evaluate, checkpoint."""
    cfg, steps = s.cfg, s.cfg.train.steps
    logs = RunLogs(run_dir, cfg, meta)
    bar = progress_bar(cfg, state) if progress else None
    warned = False
    try:
        if state.step == 0:
            logs.eval.write({"step": 0, "tokens": 0, **evaluate(s, 0)})
        while state.step < steps:
            row, all_b = train_step(s, state, opt, critic_opt)
            step = state.step
            logs.metrics.write(row)
            if not warned and (warning := parse_warning(row, s.task)):
                warned = True
                warn_once(run_dir, meta, warning, bar)
            logs.write_samples(step, all_b, cfg.train.log_samples)
            if step % cfg.train.eval_every == 0 or step == steps:
                erow = {"step": step, "tokens": state.tokens, **evaluate(s, step)}
                logs.eval.write(erow)
                row.update(erow)
            logs.to_wandb(row, step)
            if (cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0) or step == steps:
                save_checkpoint(run_dir, s, opt, critic_opt, state)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(acc=f"{row['reward/acc']:.2f}", len=f"{row['length/mean']:.1f}")
            if after_step is not None:
                after_step(step)
    finally:
        logs.close()
        if bar is not None:
            bar.close()


def warn_once(run_dir: Path, meta: dict, warning: str, bar) -> None:
    """Print a warning above the progress bar (or to stderr) and keep it in meta.json's "warnings"."""
    import sys

    (bar.write if bar is not None else lambda text: print(text, file=sys.stderr))(warning)
    meta.setdefault("warnings", []).append(warning)
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))


def progress_bar(cfg: TrainConfig, state: LoopState):
    from tqdm.auto import tqdm

    return tqdm(total=cfg.train.steps, initial=state.step, desc=cfg.run_name, unit="step", dynamic_ncols=True)


# ---------------------------------------------------------------------------------------------------------
# one RL step


def train_step(s: Setup, state: LoopState, opt, critic_opt) -> tuple[dict, Batch]:
    """One RL step (collect, then update); advances ``state``. Returns (metrics row, everything sampled)."""
    step = state.step + 1
    s, sched = at_step(s, state, step)  # the objective and sampling temperature in effect at this step
    phases_before = dict(s.timers)
    t0 = time.perf_counter()
    if s.sampler is not None:  # stale rollouts: sample with the weights of len(history) - 1 training steps ago
        s.sampler.load_state_dict(s.history[0])
        s.engine.sync_weights(s.sampler)
        try:
            train_b, all_b, cm = collect(s, step, state)
        finally:
            s.engine.sync_weights(s.policy)  # evaluation samples the current weights
        cm["rollout/staleness"] = len(s.history) - 1
    else:
        train_b, all_b, cm = collect(s, step, state)
    t1 = time.perf_counter()
    m = {**rollout_metrics(all_b, s.task, s.cfg.objective.group_size), **cm, **sched}
    if train_b is not None:
        m.update(update(s, train_b, opt, critic_opt, step))
        s.engine.sync_weights(s.policy)  # the next rollout (and evaluation) samples from the updated weights
    if s.history is not None:
        s.history.append(weights_copy(s.policy))
        while len(s.history) > s.cfg.rollout.staleness + 1:
            s.history.popleft()
    control_temperature(s, state, m)  # rollout.temperature_control: the next step's temperature
    t2 = time.perf_counter()
    state.tokens += m["rollout/tokens"]
    state.elapsed += t2 - t0
    state.step = step
    row = {"step": step, "tokens": state.tokens, "time": round(state.elapsed, 4), **m,
           "time/rollout": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0,
           "mem/peak_rss_mb": peak_rss_mb()}
    if s.device.type == "cuda":  # the policy's device (make_setup moved it there)
        row["mem/gpu_peak_mb"] = torch.cuda.max_memory_allocated(s.device) / 2 ** 20
    row.update({f"time/{k}": v - phases_before.get(k, 0.0) for k, v in s.timers.items()})
    return row, all_b


def update(s: Setup, b: Batch, opt, critic_opt, step: int) -> dict:
    """Advantages, then n_epochs x n_minibatches optimizer steps. Returns metrics, with the registered study
    diagnostics (experiments/diagnostics.py) measured beside the loss."""
    obj = s.cfg.objective
    m: dict = {}
    gen_mask, mask = loss_masks(obj, b, m)
    max_len = obj.loss.max_len or s.sampling.max_new_tokens
    ref, values, adv, returns, am = advantages(s, b, mask, max_len)
    # read with the first minibatch's metrics (one device sync); the keys hold their place in m meanwhile
    pending = rename(am)
    m.update(dict.fromkeys(pending))
    m.update(batch_diagnostics(StepView(b, mask, adv, obj, tuple(s.task.difficulties), max_len)))
    B = b.size
    mb = B // obj.n_minibatches
    per_step, summed = defaultdict(list), defaultdict(list)
    gen = step_generator(s.cfg.seed, step, 1)
    for epoch in range(obj.n_epochs):
        perm = torch.randperm(B, generator=gen) if obj.n_minibatches > 1 else None
        for j in range(obj.n_minibatches):
            # one minibatch; with one, the whole batch itself (the same values an index of arange(B) copies out)
            pick = operator.itemgetter(perm[j * mb:(j + 1) * mb]) if perm is not None else _itself  # x -> rows of x
            mbatch = Minibatch(b, pick, pick(mask), pick(gen_mask), ref, values, pick(adv), returns, max_len,
                               first_pass=epoch == 0)
            metrics, vals = optimizer_step(s, mbatch, opt, critic_opt)
            with torch.no_grad(), timed(s, "metrics"):
                diag, sums = minibatch_diagnostics(mbatch.view(vals))
                floats = _floats({**metrics, **diag, **pending})
            for k, v in sums.items():
                summed[k].append(v)
            for k in pending:
                m[k] = floats.pop(k)
            pending = {}
            record_grad_norm(per_step, floats.pop("optim/grad_norm"), s.cfg.optim.grad_clip)
            for k, v in floats.items():
                per_step[k].append(v)
    for k, v in per_step.items():
        m[k] = reduce(k, v)
    m.update(finish_summed(summed))
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

    def view(self, scores: Scored) -> MinibatchView:
        ref = None
        if self.ref is not None:
            full = None if (self.ref.log_probs is None or scores.log_probs is None) else self.pick(self.ref.log_probs)
            ref = Scored(self.pick(self.ref.logp), None, None, full)
        return MinibatchView(scores, self.pick(self.batch.old_logp), self.mask, self.gen_mask, ref, self.first_pass)


def optimizer_step(s: Setup, mb: Minibatch, opt, critic_opt) -> tuple[dict, Scored]:
    """Forward, loss, backward and a clipped optimizer step on one minibatch (then the critic's). Returns (the
    loss metrics as 0-dim tensors, the forward's detached scores)."""
    want_logits = mb.first_pass and mb.ref is not None and exact_kl(s)
    if len(row_blocks(mb.mask.shape[0], s.cfg.train.micro_batch_size)) > 1:
        lm, vals = accumulated_backward(s, mb, opt, want_logits)
    else:
        lm, vals = whole_backward(s, mb, opt, want_logits)
    with timed(s, "optimizer"):
        gn = torch.nn.utils.clip_grad_norm_(s.policy_params, s.cfg.optim.grad_clip or float("inf"))
        lr = opt.param_groups[0]["lr"]  # the learning rate this update uses
        opt.step()
        if s.lr_schedule is not None:
            s.lr_schedule.step()
    metrics = {"optim/grad_norm": gn, **rename(lm)}  # 0-dim tensors: read with one sync by the caller
    if s.lr_schedule is not None:
        metrics["optim/lr"] = lr  # averaged over the step's updates, like optim/grad_norm
    if critic_opt is not None:
        metrics.update(critic_step(s, mb, critic_opt))
    return metrics, vals


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


def whole_backward(s: Setup, mb: Minibatch, opt, want_logits: bool) -> tuple[dict, Scored]:
    """Forward, loss and backward of the whole minibatch in one pass. Returns (loss metrics, detached scores)."""
    obj, b, pick = s.cfg.objective, mb.batch, mb.pick
    with timed(s, "forward"):
        sc = score(s.policy, pick(b.prompt_ids), pick(b.prompt_mask), pick(b.response_ids), pick(b.response_mask),
                   temperature=s.cfg.rollout.temperature, with_logits=want_logits,
                   entropy_grad=obj.loss.entropy_coef != 0.0, forward=s.forward)
    with timed(s, "loss"):
        loss, lm = policy_loss(s, mb, sc)
    # the diagnostics read only the scores' values
    vals = Scored(sc.logp.detach(), None if sc.entropy is None else sc.entropy.detach(), None,
                  sc.log_probs.detach() if want_logits else None)
    with timed(s, "backward"):
        opt.zero_grad(set_to_none=True)
        loss.backward()
        del loss, sc  # the forward's autograd graph goes here (the model's nodes: ~0.1 ms at the default)
    return lm, vals


def accumulated_backward(s: Setup, mb: Minibatch, opt, want_logits: bool) -> tuple[dict, Scored]:
    """train.micro_batch_size: forward, loss and backward micro-batch by micro-batch, gradients accumulated. Each
    micro-batch's loss is weighted by its share of the minibatch's normaliser (algos.micro_batch_weights), so the
    summed gradient is the whole minibatch's. The metrics are computed once, on the minibatch's detached scores."""
    obj, b, pick = s.cfg.objective, mb.batch, mb.pick
    p_ids, p_mask, r_ids, r_mask = pick(b.prompt_ids), pick(b.prompt_mask), pick(b.response_ids), pick(b.response_mask)
    blocks = row_blocks(mb.mask.shape[0], s.cfg.train.micro_batch_size)
    weights = algos.micro_batch_weights(mb.mask, obj.loss.agg, blocks)
    opt.zero_grad(set_to_none=True)
    parts = []
    for rows, weight in zip(blocks, weights):
        with timed(s, "forward"):
            sc = score(s.policy, p_ids[rows], p_mask[rows], r_ids[rows], r_mask[rows],
                       temperature=s.cfg.rollout.temperature, with_logits=want_logits,
                       entropy_grad=obj.loss.entropy_coef != 0.0, forward=s.forward)
        with timed(s, "loss"):
            loss, _ = policy_loss(s, mb, sc, rows)
        with timed(s, "backward"):
            (loss * weight).backward()
        parts.append(Scored(sc.logp.detach(), None if sc.entropy is None else sc.entropy.detach(), None,
                            sc.log_probs.detach() if want_logits else None))
        del loss, sc
    vals = Scored(*(None if getattr(parts[0], k) is None else torch.cat([getattr(p, k) for p in parts])
                    for k in ("logp", "entropy", "logits", "log_probs")))
    with torch.no_grad(), timed(s, "loss"):
        _, lm = policy_loss(s, mb, vals)
    return lm, vals


def critic_step(s: Setup, mb: Minibatch, critic_opt) -> dict:
    """The critic's value-loss step on the minibatch (GAE and hybrid estimators)."""
    obj, b, pick = s.cfg.objective, mb.batch, mb.pick
    blocks = row_blocks(mb.mask.shape[0], s.cfg.train.micro_batch_size)
    with timed(s, "critic"):
        if len(blocks) > 1:
            vm = accumulated_value_backward(s, mb, critic_opt, blocks)
        else:
            v_new = score_values(s.critic, pick(b.prompt_ids), pick(b.prompt_mask), pick(b.response_ids),
                                 pick(b.response_mask))
            vloss, vm = algos.compute_value_loss(obj, values=v_new, old_values=pick(mb.values),
                                                 returns=pick(mb.returns), mask=mb.mask, max_len=mb.max_len)
            critic_opt.zero_grad(set_to_none=True)
            (obj.value.coef * vloss).backward()
        torch.nn.utils.clip_grad_norm_(s.critic.parameters(), s.cfg.optim.grad_clip or float("inf"))
        critic_opt.step()
    return rename(vm)


def accumulated_value_backward(s: Setup, mb: Minibatch, critic_opt, blocks: list) -> dict:
    """The critic's value loss micro-batch by micro-batch with the minibatch's global normaliser (as the policy's);
    returns the metrics of the whole minibatch's detached values."""
    obj, b, pick = s.cfg.objective, mb.batch, mb.pick
    p_ids, p_mask, r_ids, r_mask = pick(b.prompt_ids), pick(b.prompt_mask), pick(b.response_ids), pick(b.response_mask)
    old_values, returns = pick(mb.values), pick(mb.returns)
    critic_opt.zero_grad(set_to_none=True)
    parts = []
    for rows, weight in zip(blocks, algos.micro_batch_weights(mb.mask, obj.loss.agg, blocks)):
        v_new = score_values(s.critic, p_ids[rows], p_mask[rows], r_ids[rows], r_mask[rows])
        vloss, _ = algos.compute_value_loss(obj, values=v_new, old_values=old_values[rows], returns=returns[rows],
                                            mask=mb.mask[rows], max_len=mb.max_len)
        (obj.value.coef * weight * vloss).backward()
        parts.append(v_new.detach())
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



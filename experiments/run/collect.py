"""Collection: sample until the training batch is full (dynamic sampling, overlong shaping, group reward
correction), with equal or adaptive group sizes."""

from __future__ import annotations

from collections import defaultdict

import torch

from objbench.algos import filters as F
from objbench.algos import groups as GR
from objbench.algos.advantages import zero_variance_groups
from objbench.algos.registry import ADVANTAGE_ESTIMATORS
from objbench.experiments.run.batch import Batch, concat_batches
from objbench.experiments.run.loop_state import LoopState
from objbench.experiments.run.reward_terms import RewardTerms
from objbench.experiments.run.rng import step_generator
from objbench.experiments.run.sample import engine_logp_metrics, recompute_old_logp, rollout
from objbench.experiments.run.setup import Setup, prompt_stream
from objbench.experiments.run.step_metrics import zero_var_frac


def collect(s: Setup, step: int, state: LoopState) -> tuple[Batch, Batch, dict]:
    """Sample until the training batch is full. Returns (training batch, everything sampled, metrics)."""
    if GR.adaptive(s.cfg.objective):  # a group size per prompt (objective.groups)
        return collect_adaptive(s, step, state)
    cfg, obj = s.cfg, s.cfg.objective
    G, n_prompts = obj.group_size, cfg.prompts_per_step
    filt = obj.filters
    kept: list[Batch] = []
    everything: list[Batch] = []
    engine_diffs: list = []
    terms = RewardTerms(s)  # reward.fns and reward.task_weight
    penalties: list[torch.Tensor] = []  # overlong shaping, one tensor per sampling round
    n_kept, rounds = 0, 0
    while True:
        stream = prompt_stream(s)
        problems = stream.take(state.prompt_index, n_prompts)
        encoded = stream.encoded(state.prompt_index, n_prompts)
        state.prompt_index += n_prompts
        b = rollout(s, problems, G, s.sampling, step_generator(cfg.seed, step, 10 + rounds, s.device), encoded)
        engine_diffs.append(recompute_old_logp(s, b))
        terms.add(b)
        rounds += 1
        if filt.overlong_penalty:
            penalties.append(add_overlong_penalty(s, b))
        correct_groups(s, b, G)
        everything.append(b)
        if rounds == 1 and G > 1:  # before any filtering: how many fresh groups carry no signal
            first_zero_var = zero_var_frac(b.rewards, G)
        if filt.dynamic_sampling:
            keep_groups = F.dynamic_sampling_keep(b.rewards, G)
            rows = keep_groups.repeat_interleave(G).nonzero().squeeze(-1)
            if len(rows):
                kept.append(b.select(rows))
                n_kept += len(rows) // G
        else:
            kept.append(b)
            n_kept += n_prompts
        if n_kept >= n_prompts or not filt.dynamic_sampling or rounds >= filt.max_rounds:
            break
    allb = concat_batches(everything, s.codec.pad_id)
    m = {"rollout/rounds": rounds, "rollout/groups_kept": n_kept, **engine_logp_metrics(engine_diffs),
         **terms.metrics()}
    if G > 1:
        m["rollout/zero_var_frac"] = first_zero_var
    m.update(overlong_metrics(penalties))
    m.update(correction_metrics(s, allb, G))
    if not kept:
        return None, allb, m
    train_b = concat_batches(kept, s.codec.pad_id)
    if train_b.size > n_prompts * G:  # dynamic sampling overshot: keep the first n_prompts groups
        train_b = train_b.select(torch.arange(n_prompts * G))
    return train_b, allb, m


def collect_adaptive(s: Setup, step: int, state: LoopState) -> tuple[Batch | None, Batch, dict]:
    """collect() with a group size per prompt (objective.groups; algos.groups).

    Every sampling round spends the same budget, rollout.completions_per_step completions, on as many prompts of
    the stream as the sizes allow (algos.groups.fill_budget: the last group is trimmed, never to fewer than the
    estimator's smallest group). Dynamic sampling keeps whole groups; the training batch is the kept groups in
    order while they fit in the budget (a kept group is never cut: that could make it all-equal), so with dynamic
    sampling it may hold fewer completions than the budget. The running pass rate per difficulty level
    (groups.ema, groups.prior) is updated from every completion sampled and kept in ``state`` (checkpointed).
    """
    cfg, obj = s.cfg, s.cfg.objective
    filt, budget = obj.filters, cfg.rollout.completions_per_step
    min_size = max(ADVANTAGE_ESTIMATORS.get(obj.adv.estimator).min_group_size, 2 if filt.dynamic_sampling else 1)
    rates = {int(d): r for d, r in (state.pass_rates or {}).items()}
    kept: list[Batch] = []
    everything: list[Batch] = []
    terms = RewardTerms(s)  # reward.fns and reward.task_weight
    penalties: list[torch.Tensor] = []  # overlong shaping, one tensor per sampling round
    n_kept, rounds = 0, 0
    while True:
        chunk = prompt_stream(s).take(state.prompt_index, budget)  # more than enough
        sizes = GR.fill_budget(GR.wanted_sizes(obj, [p.difficulty for p in chunk], rates), budget, min_size)
        state.prompt_index += len(sizes)
        b = rollout(s, chunk[:len(sizes)], sizes, s.sampling, step_generator(cfg.seed, step, 10 + rounds, s.device))
        terms.add(b)
        rounds += 1
        if filt.overlong_penalty:
            penalties.append(add_overlong_penalty(s, b))
        correct_groups(s, b, sizes)
        everything.append(b)
        if rounds == 1:
            first_zero_var = float(zero_variance_groups(b.rewards, sizes).float().mean())
        if filt.dynamic_sampling:
            keep = F.dynamic_sampling_keep(b.rewards, sizes).tolist()
            if any(keep):
                kept.append(select_groups(b, keep))
                n_kept += kept[-1].size
        else:
            kept.append(b)
            n_kept += b.size
        if n_kept >= budget or not filt.dynamic_sampling or rounds >= filt.max_rounds:
            break
    allb = concat_batches(everything, s.codec.pad_id)
    first = [sum(allb.group_sizes[:i]) for i in range(len(allb.group_sizes))]  # first row of each group
    m = {"rollout/rounds": rounds, "rollout/zero_var_frac": first_zero_var, **terms.metrics(),
         "groups/prompts": len(allb.group_sizes), "groups/size_mean": allb.size / len(allb.group_sizes)}
    by_d = defaultdict(list)
    for g, i in zip(allb.group_sizes, first):
        by_d[allb.problems[i].difficulty].append(g)
    m.update({f"groups/size_d{d}": sum(gs) / len(gs) for d, gs in sorted(by_d.items())})
    m.update({f"groups/pass_rate_d{d}": r for d, r in sorted(rates.items())})  # the rates that chose the sizes
    rates = GR.update_pass_rates(rates, allb.difficulty.tolist(), allb.correct.tolist(), obj.groups.ema,
                                 obj.groups.prior)
    state.pass_rates = {str(d): r for d, r in rates.items()}
    m.update(overlong_metrics(penalties))
    m.update(correction_metrics(s, allb, allb.group_sizes))
    if not kept:
        m["rollout/groups_kept"] = 0
        return None, allb, m
    train_b = concat_batches(kept, s.codec.pad_id)
    if train_b.size > budget:  # dynamic sampling overshot: the first groups that fit
        total, fit = 0, []
        for g in train_b.group_sizes:
            fit.append(total + g <= budget and (not fit or fit[-1]))
            total += g if fit[-1] else 0
        train_b = select_groups(train_b, fit)
    m["rollout/groups_kept"] = len(train_b.group_sizes)
    return train_b, allb, m


def select_groups(b: Batch, keep: list) -> Batch:
    """The whole groups of ``b`` (with group_sizes) whose entry in ``keep`` is True, their sizes kept."""
    rows, start = [], 0
    for g, k in zip(b.group_sizes, keep):
        if k:
            rows.extend(range(start, start + g))
        start += g
    out = b.select(torch.tensor(rows, dtype=torch.long, device=b.rewards.device))
    out.group_sizes = [g for g, k in zip(b.group_sizes, keep) if k]
    return out


def add_overlong_penalty(s: Setup, b: Batch) -> torch.Tensor:
    """DAPO's soft overlong punishment (objective.filters.overlong_penalty) added to ``b``'s rewards in place,
    from each response's length against rollout.max_new_tokens. Returns the (B,) penalties (<= 0)."""
    filt = s.cfg.objective.filters
    pen = F.overlong_penalty(b.response_mask.sum(-1), s.sampling.max_new_tokens, filt.overlong_cache,
                             filt.overlong_factor).float()
    b.rewards = b.rewards + pen
    return pen


def overlong_metrics(penalties: list[torch.Tensor]) -> dict:
    """How much the overlong shaping acted this step, over every completion sampled (all rounds): the share it
    penalised and the mean penalty. Empty without the shaping."""
    if not penalties:
        return {}
    pen = torch.cat(penalties)
    return {"filters/overlong_frac": float((pen < 0).float().mean()), "filters/overlong_penalty": float(pen.mean())}


def correct_groups(s: Setup, b: Batch, groups) -> None:
    """objective.filters.group_correction (algos.filters.group_reward_correction): the rewards of a group whose share
    of malformed responses exceeds correction_share are scaled by correction_factor, right after sampling (before
    dynamic sampling looks at them). ``groups``: G or the group sizes."""
    f = s.cfg.objective.filters
    if f.group_correction:
        b.rewards, _ = F.group_reward_correction(b.rewards, b.malformed, groups, f.correction_share,
                                                 f.correction_factor)


def correction_metrics(s: Setup, allb: Batch, groups) -> dict:
    f = s.cfg.objective.filters
    if not f.group_correction:
        return {}
    _, hit = F.group_reward_correction(allb.rewards, allb.malformed, groups, f.correction_share, f.correction_factor)
    return {"filters/corrected_frac": float(hit.float().mean()),
            "filters/malformed_frac": float(allb.malformed.float().mean())}

"""Held-out evaluation: greedy accuracy per difficulty and pass@k from sampled answers."""

from __future__ import annotations

import math

from objbench.experiments.run.rng import step_generator
from objbench.experiments.run.sample import rollout
from objbench.experiments.run.setup import Setup
from objbench.experiments.run.step_metrics import pass_ks


def mean_of(xs) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(sum(xs) / len(xs)) if xs else float("nan")


def evaluate(s: Setup, step: int) -> dict:
    """Greedy accuracy per difficulty and pass@k (unbiased estimator) on the held-out set."""
    from objbench.envs.passk import pass_at_k

    problems = s.task.eval_set()
    if s.cfg.train.eval_size:
        problems = problems[: s.cfg.train.eval_size]
    greedy = s.greedy_sampling
    g = rollout(s, problems, 1, greedy, None)
    row = {"eval/acc": float(g.correct.float().mean()),
           "eval/length": float(g.response_mask.sum(-1).float().mean())}
    for d in s.task.difficulties:
        sel = g.difficulty == d
        if sel.any():
            row[f"eval/acc_d{d}"] = float(g.correct[sel].float().mean())
    k = s.cfg.train.eval_samples
    smp = rollout(s, problems, k, s.eval_sampling, step_generator(s.cfg.seed, step, 2, s.device))
    c = smp.correct.view(len(problems), k).sum(-1).tolist()
    for kk in pass_ks(k):
        row[f"eval/pass@{kk}"] = mean_of([pass_at_k(k, ci, kk) for ci in c])
    for d in s.task.difficulties:  # sampled accuracy per difficulty: where RL's gains show
        cd = [ci for ci, p in zip(c, problems) if p.difficulty == d]
        if cd:
            row[f"eval/pass@1_d{d}"] = mean_of([ci / k for ci in cd])
    return row

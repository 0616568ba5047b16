"""The RL reward of a sampled batch when ``reward.fns`` or ``reward.task_weight`` add to the task's verifier:
``task_weight * verifier + sum_k weights[k] * fn_k`` over the terms that did not abstain (envs/reward_fns.py).
The verifier's ``correct`` is left as it is. Each term is logged per step: ``reward/task`` (the verifier's reward
before its weight), ``reward/<fn name>`` (the mean over the samples the function scored) and
``reward/<fn name>_abstained`` (the fraction it returned None for)."""

from __future__ import annotations

import math

import torch

from objbench.envs.reward_fns import RewardFunctions, columns_of, fn_names
from objbench.experiments.config.errors import ConfigError

__all__ = ["RewardTerms", "start_reward_fns"]


def start_reward_fns(cfg) -> RewardFunctions | None:
    """The worker of ``cfg.reward.fns`` (None without functions); a function that cannot be loaded is a
    ConfigError, raised before any run folder is written."""
    if not cfg.reward.fns:
        return None
    from objbench.envs.reward_fns import RewardFnError

    try:
        return RewardFunctions(cfg.reward.fns, cfg.reward.timeout)
    except RewardFnError as e:
        raise ConfigError(str(e)) from None


class RewardTerms:
    """Adds the reward functions' terms to each batch of a step (``add``) and gives the step's metrics."""

    def __init__(self, s) -> None:
        self.s, rc = s, s.cfg.reward
        self.names = fn_names(rc.fns)
        self.weights = list(rc.weights) or [1.0] * len(rc.fns)
        self.active = bool(rc.fns) or rc.task_weight != 1.0
        self.values: dict = {name: [] for name in ["task", *self.names]}

    def add(self, b) -> None:
        """Replace ``b.rewards`` (the verifier's, shaped by nothing yet) with the weighted sum of the terms."""
        if not self.active:
            return
        task = b.rewards.tolist()
        total = [self.s.cfg.reward.task_weight * r for r in task]
        self.values["task"] += task
        if self.names:
            prompts, columns = [p.prompt for p in b.problems], columns_of(b.problems, self.s.task)
            for k, name in enumerate(self.names):
                vals = self.s.reward_fns.values(k, prompts, list(b.texts), columns)
                total = [t if v is None else t + self.weights[k] * v for t, v in zip(total, vals)]
                self.values[name] += vals
        b.rewards = torch.tensor(total, dtype=b.rewards.dtype, device=b.rewards.device)

    def metrics(self) -> dict:
        if not self.active:
            return {}
        out = {}
        for name, vals in self.values.items():
            scored = [v for v in vals if v is not None]
            out[f"reward/{name}"] = sum(scored) / len(scored) if scored else math.nan
            if name != "task":
                out[f"reward/{name}_abstained"] = (1 - len(scored) / len(vals)) if vals else math.nan
        return out

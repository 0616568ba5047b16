"""A mixture of tasks: each training problem comes from one of K component tasks; difficulty = component number.

    task = make_task("mixture", components=[
        {"name": "arithmetic", "ops": "+", "max_digits": 1, "difficulty_weights": {1: 1}},
        {"name": "arithmetic", "ops": "-", "max_digits": 2, "difficulty_weights": {2: 1}},
        {"name": "arithmetic", "ops": "*", "max_digits": 2, "difficulty_weights": {2: 1}},
    ], weights=[1, 1, 1], sft_noise=[0.1, 0.5, 0.95])

Built for the difficulty-bias study (issue 12.4): subtasks that share no skill, whose start pass rates can be set
apart, so that how an objective spreads its gradient over easy, medium and hard prompts is measured per subtask.
Because `difficulty` is the component's number (1..K), every per-difficulty metric of a run (reward/acc_d<k>,
eval/acc_d<k>, eval/pass@1_d<k>, adv/weight_share_d<k>) is a per-component metric.

- Training stream: problem `index` of data seed `seed` picks its component with weights `weights` (its own
  generator, crc-independent of the components'), then is the component's own problem `index` of that seed. A
  component keeps its own held-out rule, so training never meets a held-out problem of any component.
- Eval set: each component's held-out problems at the difficulties that component trains on (a component whose
  `difficulty_weights` give a difficulty weight 0 does not contribute problems of that difficulty), ordered
  round-robin over components so that any prefix is balanced.
- Rewards, reference answers, held-out tests and length limits are the component's.
- `sft_noise`: per component, the share of the warm start's noisy-phase demonstrations that carry one wrong digit
  (experiments/train.py, `warm_start`), replacing `sft.noise` for that component's problems. This is the knob that
  sets start pass rates apart: the greedy answer stays right while the sampled pass rate falls to about 1 - noise.
  Empty = `sft.noise` for every component.

Problems keep the component's fields (a NumericProblem stays one) with `difficulty` replaced by the component
number, `uid` prefixed with "mixture:<k>:" and meta extended by ("component", k) and ("component_difficulty", d).
A component may not itself be a mixture, and may not use the verdict interjection (one task's environment turn).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .base import Problem, RewardResult, Task, interleave, invalid_result, stream_rng


@dataclass(frozen=True)
class MixtureConfig:
    """Settings of the mixture task. `components` is stored as a tuple of resolved component specs (plain dicts)."""

    components: tuple = ()
    """Component tasks, each a mapping of task settings with "name" (any registered task but mixture)."""
    weights: tuple[float, ...] = ()
    """Training share of each component (normalised by their sum); empty = equal shares."""
    sft_noise: tuple[float | None, ...] = ()
    """Per component, the noisy warm-start phase's corruption rate (None = sft.noise); empty = sft.noise for all."""

    def __post_init__(self) -> None:
        from . import make_task, task_spec  # the registry lives in envs/__init__.py

        _set = object.__setattr__
        comps = self.components
        if isinstance(comps, (str, Mapping)) or not isinstance(comps, Sequence) or len(comps) < 2:
            raise ValueError(f"components must be a list of at least 2 task settings, got {comps!r}")
        resolved, tasks = [], []
        for k, comp in enumerate(comps, start=1):
            if not isinstance(comp, Mapping) or not comp.get("name"):
                raise ValueError(f"components[{k - 1}] must be a mapping of task settings with a name, got {comp!r}")
            if comp["name"] == "mixture":
                raise ValueError(f"components[{k - 1}]: a mixture cannot contain a mixture")
            kwargs = {key: v for key, v in comp.items() if key != "name"}
            try:
                task = make_task(str(comp["name"]), **kwargs)
            except (ValueError, TypeError) as e:
                raise ValueError(f"components[{k - 1}] ({comp['name']}): {e}") from None
            if getattr(task, "interjection_marker", None):
                raise ValueError(f"components[{k - 1}]: the verdict interjection is not supported inside a mixture")
            resolved.append(task_spec(task))
            tasks.append(task)
        _set(self, "components", tuple(resolved))
        _set(self, "_tasks", tuple(tasks))  # built once here; not a field, so not part of the spec or equality
        n = len(resolved)
        weights = tuple(self.weights) if isinstance(self.weights, Sequence) and not isinstance(self.weights, str) \
            else None
        if weights is None:
            raise ValueError(f"weights must be a list of {n} numbers, got {self.weights!r}")
        if not weights:
            weights = (1.0,) * n
        if len(weights) != n:
            raise ValueError(f"weights: {len(weights)} numbers for {n} components")
        for k, w in enumerate(weights):
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
                raise ValueError(f"weights[{k}] must be a finite number > 0, got {w!r}")
        _set(self, "weights", tuple(float(w) for w in weights))
        noise = self.sft_noise
        if isinstance(noise, str) or not isinstance(noise, Sequence):
            raise ValueError(f"sft_noise must be a list of {n} numbers in [0, 1] (or null), got {noise!r}")
        if noise and len(noise) != n:
            raise ValueError(f"sft_noise: {len(noise)} values for {n} components")
        for k, x in enumerate(noise):
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= x <= 1.0):
                raise ValueError(f"sft_noise[{k}] must be a number in [0, 1] or null, got {x!r}")
        _set(self, "sft_noise", tuple(None if x is None else float(x) for x in noise))


class MixtureTask(Task):
    name = "mixture"

    def __init__(self, config: MixtureConfig | None = None) -> None:
        if config is None:
            raise ValueError("the mixture task needs components")
        self.config = config
        self.tasks: tuple[Task, ...] = config._tasks  # the component tasks its validation built
        self.difficulties = tuple(range(1, len(self.tasks) + 1))
        self._eval_cache: tuple[Problem, ...] | None = None

    def __repr__(self) -> str:
        return f"MixtureTask({self.config!r})"

    def _wrap(self, k: int, p: Problem, uid: str) -> Problem:
        meta = p.meta + (("component", k), ("component_difficulty", p.difficulty))
        return dataclasses.replace(p, uid=uid, difficulty=k, meta=meta)

    def component(self, problem: Problem) -> Task:
        """The component task a problem of this mixture came from."""
        return self.tasks[problem.difficulty - 1]

    def _inner(self, problem: Problem) -> Problem:
        d = dict(problem.meta).get("component_difficulty", problem.difficulty)
        return dataclasses.replace(problem, difficulty=d)

    def problem_at(self, seed: int, index: int) -> Problem:
        rng = stream_rng(self.name, seed, index)
        k = rng.choices(self.difficulties, weights=self.config.weights)[0]
        p = self.tasks[k - 1].problem_at(seed, index)
        return self._wrap(k, p, f"{self.name}:{k}:{p.uid}")

    def eval_set(self) -> list[Problem]:
        if self._eval_cache is None:
            per = []
            for k, t in enumerate(self.tasks, start=1):
                trains = _trained_difficulties(t)
                per.append([self._wrap(k, p, f"{self.name}:{k}:{p.uid}") for p in t.eval_set()
                            if trains is None or p.difficulty in trains])
            self._eval_cache = tuple(interleave(per))
        return list(self._eval_cache)

    def is_held_out(self, problem: Problem) -> bool:
        return self.component(problem).is_held_out(self._inner(problem))

    def reward(self, problem: Problem, completion: str, truncated: bool = False) -> RewardResult:
        try:
            return self.component(problem).reward(self._inner(problem), completion, truncated)
        except Exception:  # a verifier must never take the training loop down
            return invalid_result()

    @property
    def has_sft_targets(self) -> bool:
        return all(getattr(t, "has_sft_targets", True) for t in self.tasks)

    def sft_target(self, problem: Problem, rng: random.Random) -> str:
        return self.component(problem).sft_target(self._inner(problem), rng)

    def sft_noise(self, problem: Problem) -> float | None:
        """The warm start's corruption rate for this problem's component (None = sft.noise)."""
        return self.config.sft_noise[problem.difficulty - 1] if self.config.sft_noise else None

    @property
    def fingerprint(self) -> str | None:
        """The data files' fingerprints of data set components (None when no component reads files)."""
        prints = [getattr(t, "fingerprint", None) for t in self.tasks]
        return "|".join(p or "-" for p in prints) if any(prints) else None

    def max_response_len(self) -> int:
        return max(t.max_response_len() for t in self.tasks)

    def max_prompt_len(self) -> int:
        return max(t.max_prompt_len() for t in self.tasks)


def _trained_difficulties(task: Task) -> set[int] | None:
    weights = getattr(task.config, "difficulty_weights", None)
    if not weights:
        return None
    return {d for d, w in weights if w > 0}

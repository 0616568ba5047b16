"""Tasks with verifiable rewards: prompt streams, difficulty, the shared character tokenizer, verifiers.

    task = make_task("arithmetic", max_digits=3, ops=["+"])
    task = make_task("dataset", path="train.jsonl", format="gsm8k", eval_path="test.jsonl")
    task = make_task("mixture", components=[{"name": "arithmetic", "ops": "+"}, {"name": "countdown"}])
    task = make_task("reasoning_gym", dataset="basic_arithmetic", dataset_args={"max_terms": 3})
    task = make_task("scratchpad", max_digits=4, filler_max=16)   # long responses: addition worked digit by digit
    spec = task_spec(task)            # plain dict of every resolved setting, for a run's config.yaml
    same = make_task(**spec)          # rebuilds an equal task

envs imports no other objbench package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import MappingProxyType

from .arithmetic import ArithmeticConfig, ArithmeticTask
from .base import NumericProblem, Problem, RewardResult, Task
from .countdown import CountdownConfig, CountdownTask
from .dataset import DatasetConfig, DatasetTask
from .mathcheck import MathVerdict, check_answer, extract_answer
from .mixture import MixtureConfig, MixtureTask
from .reasoning_gym import ReasoningGymConfig, ReasoningGymTask
from .safe_eval import SafeEvalLimits, SafeEvalResult, safe_eval
from .scratchpad import ScratchpadConfig, ScratchpadTask
from .tokenizer import (
    BOS_ID,
    BOS_TOKEN,
    EOS_ID,
    EOS_TOKEN,
    PAD_ID,
    PAD_TOKEN,
    UNK_ID,
    UNK_TOKEN,
    VOCAB,
    VOCAB_SIZE,
    build_char_tokenizer,
)

# name -> (config class, task constructor taking that config)
_REGISTRY: dict[str, tuple[type, Callable[[object], Task]]] = {}
TASKS = MappingProxyType(_REGISTRY)
"""Read-only live view of the registry: task name -> (config class, factory)."""


def register_task(name: str, config_cls: type, factory: Callable[[object], Task]) -> None:
    """Register a task under `name`. Registering a name twice raises."""
    if name in _REGISTRY:
        raise ValueError(f"task {name!r} is already registered")
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"config class of task {name!r} must be a dataclass")
    _REGISTRY[name] = (config_cls, factory)


register_task("arithmetic", ArithmeticConfig, ArithmeticTask)
register_task("countdown", CountdownConfig, CountdownTask)
register_task("dataset", DatasetConfig, DatasetTask)
register_task("mixture", MixtureConfig, MixtureTask)
register_task("reasoning_gym", ReasoningGymConfig, ReasoningGymTask)  # needs reasoning-gym when a task is made
register_task("scratchpad", ScratchpadConfig, ScratchpadTask)


def task_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def make_task(name: str, **kwargs: object) -> Task:
    """Build a registered task from keyword settings (lists and dicts from YAML/JSON are accepted).

    Raises ValueError for an unknown task name (listing the valid ones), an unknown setting (naming it and listing
    the valid ones) and an invalid value (naming the field).
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(task_names())}")
    config_cls, factory = _REGISTRY[name]
    valid = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown} for task {name!r}; valid settings: {', '.join(valid)}")
    return factory(config_cls(**kwargs))


def task_spec(task: Task) -> dict:
    """Every resolved setting of `task` as plain data (lists, dicts, numbers, str, bool): safe for yaml.safe_dump
    and json, and `make_task(**task_spec(task))` rebuilds an equal task."""
    spec: dict = {"name": task.name}
    for f in dataclasses.fields(task.config):
        spec[f.name] = _plain(getattr(task.config, f.name))
    return spec


def _plain(value: object) -> object:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


__all__ = [
    "BOS_ID",
    "BOS_TOKEN",
    "EOS_ID",
    "EOS_TOKEN",
    "PAD_ID",
    "PAD_TOKEN",
    "UNK_ID",
    "UNK_TOKEN",
    "VOCAB",
    "VOCAB_SIZE",
    "ArithmeticConfig",
    "ArithmeticTask",
    "CountdownConfig",
    "CountdownTask",
    "DatasetConfig",
    "DatasetTask",
    "MathVerdict",
    "MixtureConfig",
    "MixtureTask",
    "NumericProblem",
    "Problem",
    "ReasoningGymConfig",
    "ReasoningGymTask",
    "RewardResult",
    "SafeEvalLimits",
    "SafeEvalResult",
    "ScratchpadConfig",
    "ScratchpadTask",
    "TASKS",
    "Task",
    "build_char_tokenizer",
    "check_answer",
    "extract_answer",
    "make_task",
    "register_task",
    "safe_eval",
    "task_names",
    "task_spec",
]

"""The task a configuration names: built once per process and resolved spec (a data-set task reads its files
once), and the task settings' spec with local paths made absolute."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from objbench.experiments.config.errors import ConfigError


def _task_key(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True, default=str)


_TASKS: dict = {}  # resolved spec (as JSON) -> task; a data set task reads its files once per process


def task_of_spec(spec: dict):
    from objbench.envs import make_task

    key = _task_key(spec)
    if key not in _TASKS:
        kwargs = {k: v for k, v in spec.items() if k != "name"}
        # an empty list in a config file means "the task's default" (what `difficulty_weights: []` always meant)
        kwargs = {k: v for k, v in kwargs.items() if not (isinstance(v, (list, tuple)) and len(v) == 0
                                                          and k == "difficulty_weights")}
        try:
            _TASKS[key] = make_task(spec["name"], **kwargs)
        except (ValueError, TypeError) as e:
            hint = ""
            if spec["name"] in ("gsm8k", "math", "verl"):  # a data set layout typed as a task name
                hint = (f" (a {spec['name']} data set: task.name=dataset task.format={spec['name']} "
                        "task.path=FILE_OR_HUB_NAME)")
            raise ConfigError(f"task: {e}{hint}") from None
    return _TASKS[key]


def resolve_task(spec: dict) -> dict:
    from objbench.envs import task_spec

    spec = {k: (OmegaConf.to_container(v) if OmegaConf.is_config(v) else v) for k, v in spec.items()}
    for k in ("path", "eval_path"):  # local data files by absolute path: a resume from elsewhere finds them
        v = spec.get(k)
        if isinstance(v, str) and v and Path(v).expanduser().exists():
            spec[k] = str(Path(v).expanduser().resolve())
    task = task_of_spec(spec)
    resolved = task_spec(task)
    _TASKS.setdefault(_task_key(resolved), task)
    return resolved













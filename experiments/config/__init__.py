"""The layer every product of objbench stands on: the run configuration (its schema, loading and checks), the
config fields' documentation, the errors the command line prints as one line, and plug-in loading.

    schema.py    the dataclasses (TrainConfig and its sections) with their range and choice checks
    load.py      load_config: YAML file + dict + key=value overrides -> a checked TrainConfig
    checks.py    the checks of a resolved config that need more than its fields (model folder, task, plug-ins)
    task.py      the task a config names, built once per process
    identity.py  a config as data: dict, YAML, hash, default run name, differences to a folder's config.yaml
    fields.py    every field with type, default and doc line, read from the source (for `train --help`)
    plugins.py   plug-in files and entry points, the registries' contracts
    errors.py    ConfigError, RunFolderError, one_line

The names below are the ones the other packages use; import them from here. They are loaded on first use
(PEP 562), so that importing a light module of this package (fields, errors: `objbench train --help`) does not
import torch.
"""

import importlib

_WHERE = {
    "build_task": "checks",
    "check_model": "checks",
    "check_resolved": "checks",
    "fetch_hint": "checks",
    "max_new_tokens": "checks",
    "ConfigError": "errors",
    "RunFolderError": "errors",
    "ABSENT_MEANS": "identity",
    "LOCATION_KEYS": "identity",
    "NAME_FREE_KEYS": "identity",
    "absent_values": "identity",
    "added_later": "identity",
    "config_differences": "identity",
    "config_hash": "identity",
    "check_name": "identity",
    "default_run_name": "identity",
    "flat_dict": "identity",
    "to_dict": "identity",
    "to_yaml": "identity",
    "check_unique_keys": "load",
    "load_config": "load",
    "parse_overrides": "load",
    "DEFAULT_TASK": "schema",
    "MAX_COMPLETIONS_PER_STEP": "schema",
    "SFT_STEPS_BUILTIN": "schema",
    "SFT_UNTIL_ACC_BUILTIN": "schema",
    "LogConfig": "schema",
    "LoopConfig": "schema",
    "ModelConfig": "schema",
    "OptimConfig": "schema",
    "RewardConfig": "schema",
    "RolloutConfig": "schema",
    "SFTConfig": "schema",
    "TrainConfig": "schema",
    "VLLMConfig": "schema",
    "one_line": "errors",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value

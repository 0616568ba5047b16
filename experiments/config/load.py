"""Loading a run configuration: a YAML file, a dict of settings and ``key=value`` overrides, resolved into a
TrainConfig and checked before any compute starts.

Parsing and type checking are done by OmegaConf's structured configs (a maintained library that already
rejects unknown keys and mistyped values with the full dotted key in the message).

Objective presets: ``objective: grpo`` in a YAML file or ``objective=grpo`` on the command line selects
``algos.presets["grpo"]``; ``objective.loss.agg=token_mean`` then overrides one field of it. Field
overrides always apply after the preset, whatever their order on the command line or in a dict.
"""

from __future__ import annotations

import difflib
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from objbench.algos import presets as PRESETS
from objbench.experiments.config.checks import check_resolved
from objbench.experiments.config.errors import ConfigError
from objbench.experiments.config.schema import DEFAULT_TASK, TrainConfig


def _all_keys(obj, prefix="") -> list[str]:
    out = []
    for f in fields(obj):
        key = f"{prefix}{f.name}"
        out.append(key)
        value = getattr(obj, f.name)
        if is_dataclass(value):
            out.extend(_all_keys(value, key + "."))
    return out


def _explain(err: Exception) -> ConfigError:
    msg = str(err).split("\n")[0]
    key = getattr(err, "full_key", None) or ""
    if "not in" in msg:
        valid = _all_keys(TrainConfig())
        close = difflib.get_close_matches(key, valid, n=3) if key else []
        hint = f" Did you mean: {', '.join(close)}?" if close else (f" ({msg})" if "Did you mean" in msg else "")
        return ConfigError(f"unknown config key {key!r}.{hint}")
    return ConfigError(f"invalid value for {key!r}: {msg}" if key else msg)


def _preset_node(name: str):
    if name not in PRESETS:
        raise ConfigError(f"objective={name!r} is not a preset; choose one of: {', '.join(PRESETS)}")
    node = OmegaConf.structured(PRESETS[name])
    OmegaConf.set_readonly(node, False)
    return node


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping with the same key twice (plain YAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):
        keys = set()
        for k, _ in node.value:
            key = self.construct_object(k, deep=deep)
            if key in keys:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice", k.start_mark)
            keys.add(key)
        return super().construct_mapping(node, deep=deep)






def check_unique_keys(overrides: list[str]) -> None:
    """A command line that gives one key twice is an error (it would silently keep the last value). Composed
    override lists (a sweep's set: then its arm's overrides) are layers and may repeat a key on purpose."""
    seen: dict[str, str] = {}
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key in seen:
            raise ConfigError(f"{key} is given twice ({seen[key]!r} and {item!r}); give it once")
        seen[key] = item


def parse_overrides(overrides: list[str]) -> tuple[Optional[str], list[str]]:
    """Split CLI overrides into (preset name or None, dotted key=value list)."""
    preset, rest = None, []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        if key.strip() == "objective":
            preset = value.strip()
        else:
            rest.append(item)
    return preset, rest


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = (),
                extra: dict | None = None, *, check_device: bool = True) -> TrainConfig:
    """Resolve a TrainConfig from a YAML file (optional), a dict of extra settings, and CLI overrides.

    Precedence, lowest first: defaults < preset < YAML < ``extra`` < CLI overrides; a CLI ``objective=``
    replaces the whole objective section with that preset before the CLI's own objective.* overrides.
    Installed plug-ins (entry points) are loaded first; a plug-in member the objective chooses is checked
    (``experiments.plugins.check_chosen_members``) before anything else runs.
    """
    from objbench.experiments.config.plugins import load_plugins

    load_plugins()
    file_dict: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        with open(path) as fh:
            try:
                file_dict = yaml.load(fh, Loader=UniqueKeyLoader) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(file_dict, dict):
            raise ConfigError(f"{path}: top level must be a mapping of config keys")
    layers = [file_dict, extra or {}]
    cli_preset, dotted = parse_overrides(list(overrides))
    try:
        base = OmegaConf.structured(TrainConfig)
        OmegaConf.set_readonly(base, False)  # frozen dataclasses come back read-only; we build, then validate
        # pick the preset: CLI > last layer that names one > default
        preset = None
        obj_layers = []
        task: dict = dict(DEFAULT_TASK)
        for layer in layers:
            layer = dict(layer)
            task = _merge_task(task, layer.pop("task", None))
            obj = layer.pop("objective", None)
            if isinstance(obj, str):
                preset, obj_layers = obj, []
            elif isinstance(obj, dict):
                obj = dict(obj)
                if "preset" in obj:
                    preset, obj_layers = obj.pop("preset"), []
                obj_layers.append(obj)
            elif obj is not None:
                raise ConfigError(f"objective must be a preset name or a mapping, got {obj!r}")
            base = OmegaConf.merge(base, OmegaConf.create(layer))
        if cli_preset is not None:
            preset, obj_layers = cli_preset, []
        if preset is not None:
            base.objective = _preset_node(preset)
        for obj in obj_layers:
            base = OmegaConf.merge(base, OmegaConf.create({"objective": obj}))
        task_dotted = [d for d in dotted if _is_task_key(d.split("=", 1)[0].strip())]
        dotted = [d for d in dotted if d not in task_dotted]
        if task_dotted:
            task = _merge_task(task, OmegaConf.to_container(OmegaConf.from_dotlist(task_dotted))["task"])
        if dotted:
            base = OmegaConf.merge(base, OmegaConf.from_dotlist(dotted))
        base.task = task
        cfg = OmegaConf.to_object(base)
    except OmegaConfBaseException as e:
        raise _explain(e) from None
    except (ValueError, TypeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None
    check_resolved(cfg, check_device)
    return cfg








def _is_task_key(key: str) -> bool:
    """task=NAME, task={...} (a whole section) or task.<setting>."""
    return key == "task" or key.startswith("task.")


def _merge_task(task: dict, layer) -> dict:
    """Task settings of a later layer over an earlier one. Naming another task starts from that task's defaults:
    the earlier layer's settings belonged to the task it named (`task.name=countdown` over the default file)."""
    if layer is None:
        return task
    if isinstance(layer, str):
        layer = {"name": layer}
    if not isinstance(layer, dict):
        raise ConfigError(f"task must be a mapping of settings with a 'name', got {layer!r}")
    if "name" in layer and task.get("name") not in (None, layer["name"]):
        task = {}
    return {**task, **layer}

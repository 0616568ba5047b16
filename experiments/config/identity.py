"""What a resolved configuration is, as data: its dict and YAML, its hash, the default run name, and how a run
folder's config.yaml differs from it (settings added later read as their declared neutral values)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import typing
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path

import yaml

from objbench.algos import presets as PRESETS
from objbench.experiments.config.errors import ConfigError


def to_dict(cfg) -> dict:
    return asdict(cfg)


def to_yaml(cfg) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def config_hash(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


def absent_values(root, task_name: str | None = None) -> dict:
    """{dotted key: value} of every setting of the config class ``root`` (TrainConfig) declared ``added_later`` (a
    section's fields one by one), including the named task's own settings (``task.<setting>``): what a config.yaml
    written before them behaved as."""
    from objbench.envs import TASKS

    out: dict = {}
    _collect_absent(root, "", out)
    if task_name in TASKS:
        for f in fields(TASKS[task_name][0]):
            if ABSENT_MEANS in f.metadata:
                out[f"task.{f.name}"] = f.metadata[ABSENT_MEANS]
    return out


def _collect_absent(cls, prefix: str, out: dict) -> None:
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        key = prefix + f.name
        if ABSENT_MEANS in f.metadata:
            value = f.metadata[ABSENT_MEANS]
            out.update(flat_dict({key: asdict(value)}) if is_dataclass(value) else {key: value})
        elif is_dataclass(hints.get(f.name)):
            _collect_absent(hints[f.name], key + ".", out)


def flat_dict(d: dict, prefix: str = "") -> dict:
    """Nested mappings -> dotted keys (lists and empty mappings stay values)."""
    out: dict = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


NAME_CHARS = re.compile(r"[A-Za-z0-9._=+-]+")


def check_name(value: str, what: str) -> None:
    """A run, arm or sweep name becomes a folder under out_dir: one path component of letters, digits and ._=+-, not
    starting with a dot (``../x`` or ``/abs`` would write outside out_dir; ``.x`` would hide it). Raises ConfigError."""
    if not isinstance(value, str) or not NAME_CHARS.fullmatch(value) or value.startswith("."):
        bad = sorted(set(str(value)) - set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._=+-"))
        why = f"characters {''.join(bad)!r} are not allowed" if bad else "it must not be empty or start with '.'"
        raise ConfigError(f"{what}={value!r} is not a valid name ({why}): a name is one folder name of letters, "
                          f"digits and . _ = + -")


LOCATION_KEYS = ("out_dir",)  # where a run lives, not what it is: a moved folder still resumes
_ABSENT = object()
NAME_FREE_KEYS = ("name", "seed", "out_dir")  # in the default run name already, or where it lives


def default_run_name(cfg) -> str:
    """<objective>__s<seed> for a config that differs from the defaults (of its objective preset) in nothing else;
    otherwise <objective>__<8 hex digits of the other non-default settings>__s<seed>, so that two commands that
    train different things never share a folder. A folder under the short name that already holds this very
    config (made before default names carried the hash) keeps its name: re-running its command resumes it."""
    short = f"{cfg.objective.name}__s{cfg.seed}"
    base = _default_settings(type(cfg), cfg.objective.name)
    changed = {k: v for k, v in flat_dict(to_dict(cfg)).items()
               if k not in NAME_FREE_KEYS and (k not in base or base[k] != v)}
    if not changed:
        return short
    legacy = Path(cfg.out_dir) / short / "config.yaml"
    if legacy.is_file() and _holds_config(legacy, cfg):
        return short
    return f"{cfg.objective.name}__{config_hash(changed)[:8]}__s{cfg.seed}"


@functools.lru_cache(maxsize=8)
def _default_settings(root, objective: str) -> dict:
    preset = PRESETS[objective] if objective in PRESETS else PRESETS["grpo"]
    return flat_dict(to_dict(root(objective=preset)))


def _holds_config(path: Path, cfg) -> bool:
    try:
        old = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(old, dict) and not config_differences(old, cfg)


def config_differences(old: dict, cfg) -> list[str]:
    """The settings in which a run folder's config.yaml (``old``) differs from ``cfg``, as dotted keys. A setting
    that the old file lacks because it was added to objbench later reads as its declared neutral value
    (``config.added_later``); one without a declared value is a difference, marked "(absent)"."""
    task = old.get("task") if isinstance(old.get("task"), dict) else {}
    now = flat_dict(to_dict(cfg))
    then = {**{k: v for k, v in absent_values(type(cfg), task.get("name")).items() if k in now}, **flat_dict(old)}
    keys = sorted((set(then) | set(now)) - set(LOCATION_KEYS))
    return [k if k in then else f"{k} (absent)" for k in keys if then.get(k, _ABSENT) != now.get(k, _ABSENT)]



ABSENT_MEANS = "absent_means"  # field metadata key; envs' task configs spell it out (they import nothing of ours)


def added_later(absent_means) -> dict:
    """Metadata of a setting added after run folders were written: the value that a config.yaml without it
    behaved as (the old code's neutral value; a dataclass for a whole section). Resuming or skipping such a run
    reads the absent setting as this value, so an upgrade does not strand runs in progress (``absent_values``)."""
    return {ABSENT_MEANS: absent_means}

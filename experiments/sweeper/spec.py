"""Sweep specs: the YAML file ``objbench sweep`` reads, as a frozen, validated ``SweepSpec``.

A sweep spec is plain data (YAML)::

    name: quickstart                 # folder name under out_dir (default: the spec file's name)
    base: ../configs/quickstart.yaml # optional base run config, relative to this file
    out_dir: results/runs            # optional (default results/runs; relative to where the command runs)
    seeds: [0, 1, 2]                 # or a count: 3 = [0, 1, 2]
    set:                             # overrides applied to every arm (dotted keys)
      train.steps: 200
    arms:                            # named arms: overrides per arm (objective: <preset> picks a preset)
      grpo: {objective: grpo}
      dapo: {objective: dapo}
    grid:                            # optional cartesian product of field values, crossed with the arms
      objective.loss.agg: [token_mean, seq_mean_token_mean]
    resources:                       # optional: what one run needs (the --gpus-per-run flag overrides it)
      gpus_per_run: 1                # default: 1 when model.device is cuda (or auto with CUDA present), else 0
    report: {...}                    # optional: the declared comparisons (analysis/prereg.py documents its keys)
    imports: [my_objective.py]       # optional plug-ins (.py files relative to this file, or module names), loaded
                                     # in the sweep process and in every worker before any config is validated
    description: ...                 # optional free text

``arms: [grpo, dapo]`` is shorthand for ``{grpo: {objective: grpo}, dapo: {objective: dapo}}``; no arms is one
arm ``base`` without overrides. Each arm x grid point is one arm label ``<arm>[-<field>=<value>...]``.

``load_spec(path)`` reads and checks a file: the structure of the spec, the seeds, the resources, the base config
file, the arm labels (unique) and the ``report:`` section. It raises ConfigError naming the spec file and the
key. The run configs themselves are resolved by ``experiments.sweep.load_sweep``, which expands a spec into runs.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from objbench.experiments.config.errors import ConfigError
from objbench.experiments.config.identity import check_name

__all__ = ["RESOURCE_KEYS", "SPEC_KEYS", "SweepResources", "SweepSpec", "check_gpus_per_run", "load_spec"]


def check_gpus_per_run(value, where: str) -> float:
    """A GPU count per run: 0, a whole number, or a fraction in (0, 1) (several runs share one GPU)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
        raise ConfigError(f"{where} must be a number >= 0 (GPUs per run), got {value!r}")
    if value >= 1 and value != int(value):
        raise ConfigError(f"{where}={value}: use a whole number of GPUs, or a fraction below 1 to share one GPU")
    return float(value)


def _fmt(v) -> str:
    return str(v).replace("/", "_").replace(" ", "")


@dataclass(frozen=True)
class SweepResources:
    """The spec's ``resources:`` section: what one run needs."""

    gpus_per_run: float | None = None
    """GPUs per run: 0, a whole number, or a fraction below 1 (runs share a GPU); None = decided from
    model.device (experiments.sweep.resolve_gpus)"""

    def __post_init__(self):
        if self.gpus_per_run is not None:
            object.__setattr__(self, "gpus_per_run",
                               check_gpus_per_run(self.gpus_per_run, "resources.gpus_per_run"))


RESOURCE_KEYS = frozenset(f.name for f in fields(SweepResources))


@dataclass(frozen=True)
class SweepSpec:
    """A sweep spec (see the module doc), validated and normalised when constructed: ``seeds`` a tuple of
    distinct seeds, ``arms`` a mapping arm name -> overrides, ``set``/``grid`` mappings, ``resources`` a
    SweepResources. Raises ConfigError naming ``path`` and the key."""

    path: Path
    """the spec file: it names the sweep by default, a relative ``base`` is found next to it, errors name it"""
    name: str = ""
    """folder of the sweep under out_dir; empty = the spec file's stem"""
    base: str | None = None
    """base run config, relative to the spec file; None = the built-in defaults"""
    out_dir: str | None = None
    """where sweep folders go; None = results/runs (``--out`` overrides it)"""
    seeds: tuple = (0,)
    """non-negative, distinct seeds (a count n in the file means 0..n-1)"""
    set: dict = field(default_factory=dict)
    """dotted-key overrides applied to every arm"""
    arms: dict = field(default_factory=dict)
    """arm name -> dotted-key overrides"""
    grid: dict = field(default_factory=dict)
    """dotted key -> non-empty list of values; the cartesian product is crossed with the arms"""
    description: Any = None
    report: Any = None
    """the declared comparisons (analysis.prereg.check_report_spec checks them); None = nothing declared"""
    resources: SweepResources = field(default_factory=SweepResources)
    imports: tuple = ()
    """plug-ins (experiments.plugins): .py files relative to the spec file, or module names"""
    spec_hash: str = ""
    """sha256 prefix of the spec file's text (load_spec), recorded in sweep.json and every run's meta.json"""

    def __post_init__(self):
        path = Path(self.path)
        object.__setattr__(self, "path", path)
        if self.name and not isinstance(self.name, str):
            raise ConfigError(f"{path}: 'name' must be a string (the sweep's folder), got {self.name!r}")
        for key in ("base", "out_dir"):
            value = getattr(self, key)
            if value and not isinstance(value, str):
                raise ConfigError(f"{path}: '{key}' must be a path, got {value!r}")
        object.__setattr__(self, "name", self.name or path.stem)
        check_name(self.name, f"{path}: name")  # the sweep's folder under out_dir
        object.__setattr__(self, "base", self.base or None)
        imports = [self.imports] if isinstance(self.imports, str) else self.imports
        if not isinstance(imports, (list, tuple)) or not all(isinstance(i, str) and i.strip() for i in imports):
            raise ConfigError(f"{path}: 'imports' must be a list of plug-in files (.py, relative to the spec) or "
                              f"module names, got {self.imports!r}")
        object.__setattr__(self, "imports", tuple(imports))
        self._check_seeds()
        self._check_arms()
        object.__setattr__(self, "resources", self._resources(self.resources))
        self._check_grid()
        base_path = self.base_path
        if base_path is not None and not base_path.is_file():
            raise ConfigError(f"{path}: base config {self.base!r} not found (looked at {base_path})")
        for arm, over in self.arms.items():
            if not isinstance(over, dict):
                raise ConfigError(f"{path}: arms.{arm} must be a mapping of overrides")
        labels = self.arm_labels
        for label in labels:  # a run is <arm>__s<seed>: a folder under the sweep's
            check_name(label, f"{path}: arm")
        if len(set(labels)) != len(labels):
            raise ConfigError(f"{path}: arm names collide: {labels}")
        from objbench.analysis.prereg import check_report_spec  # analysis.prereg documents the report: keys

        try:
            check_report_spec(self.report, labels)
        except ValueError as e:
            raise ConfigError(f"{path}: {e}") from None

    def _check_seeds(self):
        seeds = self.seeds
        if isinstance(seeds, int):
            seeds = list(range(seeds))
        if not isinstance(seeds, (list, tuple)) or not seeds or \
                not all(isinstance(s, int) and s >= 0 for s in seeds):
            raise ConfigError(f"{self.path}: seeds must be a non-empty list of non-negative integers (or a count)")
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"{self.path}: seeds has duplicates: {list(seeds)}")
        object.__setattr__(self, "seeds", tuple(seeds))

    def _check_arms(self):
        common, arms = self.set or {}, self.arms or {"base": {}}
        if isinstance(arms, list):  # [grpo, dapo] shorthand: arm name = preset name
            arms = {a: {"objective": a} for a in arms}
        if not isinstance(arms, dict) or not isinstance(common, dict):
            raise ConfigError(f"{self.path}: 'arms' must be a mapping of arm name -> overrides and 'set' a mapping")
        object.__setattr__(self, "set", common)
        object.__setattr__(self, "arms", {arm: {} if over is None else over for arm, over in arms.items()})

    def _resources(self, resources) -> SweepResources:
        if isinstance(resources, SweepResources):
            return resources
        resources = resources or {}
        if not isinstance(resources, dict) or set(resources) - RESOURCE_KEYS:
            raise ConfigError(f"{self.path}: 'resources' must be a mapping with optional key(s) "
                              f"{sorted(RESOURCE_KEYS)}")
        try:
            return SweepResources(**resources)
        except ConfigError as e:
            raise ConfigError(f"{self.path}: {e}") from None

    def _check_grid(self):
        grid = self.grid or {}
        if not isinstance(grid, dict):
            raise ConfigError(f"{self.path}: 'grid' must be a mapping of dotted key -> list of values")
        for k, vals in grid.items():
            if not isinstance(vals, list) or not vals:
                raise ConfigError(f"{self.path}: grid.{k} must be a non-empty list of values")
        object.__setattr__(self, "grid", grid)

    @classmethod
    def from_mapping(cls, data, path: Path, spec_hash: str = "") -> SweepSpec:
        """The spec of a parsed YAML file: a mapping of the keys in SPEC_KEYS."""
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a sweep spec is a mapping")
        unknown = set(data) - SPEC_KEYS
        if unknown:
            raise ConfigError(f"{path}: unknown sweep key(s) {sorted(unknown)}; valid: {sorted(SPEC_KEYS)}")
        return cls(path=path, spec_hash=spec_hash, **data)

    @property
    def base_path(self) -> Path | None:
        """The base run config file (a relative ``base`` is relative to the spec file), or None."""
        if not self.base:
            return None
        return Path(self.base) if Path(self.base).is_absolute() else self.path.parent / self.base

    @property
    def gpus_per_run(self) -> float | None:
        return self.resources.gpus_per_run

    def arm_points(self) -> list[tuple[str, dict, dict]]:
        """``(label, arm overrides, grid point)`` for every arm x grid point, in run order; the label is
        ``<arm>[-<last part of the grid key>=<value>...]`` and the grid point maps grid keys to values."""
        points = []
        keys = list(self.grid)
        for arm, over in self.arms.items():
            for values in itertools.product(*(self.grid[k] for k in keys)):
                label = arm
                if values:
                    label += "-" + "-".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in zip(keys, values))
                points.append((label, over, dict(zip(keys, values))))
        return points

    @property
    def arm_labels(self) -> list[str]:
        return [label for label, _, _ in self.arm_points()]


SPEC_KEYS = frozenset(f.name for f in fields(SweepSpec)) - {"path", "spec_hash"}
"""the keys a spec file may hold"""


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec file. Raises ConfigError naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep spec not found: {path}")
    text = path.read_text()
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    return SweepSpec.from_mapping(data, path, spec_hash=hashlib.sha256(text.encode()).hexdigest()[:12])

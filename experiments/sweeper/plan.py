"""A sweep's plan: the spec read and checked, and its arms x seeds expanded into runs (RunSpec) with their resolved
configs, before anything runs."""


from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from objbench.experiments.config import ConfigError, TrainConfig, load_config
from objbench.experiments.config.plugins import PluginError, load_plugins
from objbench.experiments.sweeper.spec import SweepSpec, load_spec

RUN_FILES = ("metrics.jsonl", "eval.jsonl", "meta.json", "config.yaml", "done")  # as analysis/load.py reads them


class SweepFailed(RuntimeError):
    """Some runs of a sweep failed (the others finished); the message is one line."""


@dataclass(frozen=True)
class RunSpec:
    arm: str
    seed: int
    cfg: TrainConfig


@dataclass
class Sweep:
    """A sweep spec expanded into its runs (``load_sweep``); check_existing may give a run back the relative
    out_dir its folder was begun with."""

    spec: SweepSpec
    out_dir: Path
    """absolute folder that holds the sweep folder"""
    runs: list[RunSpec]
    plugins: tuple = ()
    """the plug-ins (experiments.plugins.Plugin) of the spec's imports and --import: every worker loads them"""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def path(self) -> Path:
        return self.spec.path

    @property
    def spec_hash(self) -> str:
        return self.spec.spec_hash

    @property
    def arms(self) -> list[str]:
        """arm labels, one per arm x grid point, in run order"""
        return self.spec.arm_labels

    @property
    def seeds(self) -> list[int]:
        return list(self.spec.seeds)

    @property
    def base(self) -> str | None:
        return self.spec.base

    @property
    def gpus_per_run(self) -> float | None:
        """the spec's resources.gpus_per_run (None = decided from model.device, see resolve_gpus)"""
        return self.spec.gpus_per_run

    @property
    def sweep_dir(self) -> Path:
        return self.out_dir / self.name


def load_sweep(path: str | Path, out_dir: str | None = None, extra_overrides: list[str] = (), *,
               check_device: bool = True, imports: list[str] = ()) -> Sweep:
    """Read a sweep spec (sweep_spec.load_spec), load its plug-ins (the spec's ``imports``, relative to the spec
    file, then ``imports`` from the command line) and resolve the run config of every (arm, grid point, seed).
    Raises ConfigError naming the problem. ``check_device=False`` (the Ray executor) leaves model.device to the
    workers: a CPU driver may submit GPU runs."""
    spec = load_spec(path)
    try:
        plugins = tuple(load_plugins(spec.imports, base_dir=spec.path.parent) + load_plugins(imports))
    except PluginError as e:
        raise PluginError(f"{spec.path}: {e}") from None
    # absolute: Ray workers (and anything else) run elsewhere, and must write where sweep.json goes
    out = Path(os.path.abspath(os.path.expanduser(out_dir or spec.out_dir or "results/runs")))
    runs = _expand(spec, out / spec.name, list(extra_overrides), check_device)
    _check_eval_windows(spec, runs)
    return Sweep(spec, out, runs, plugins)


def _check_eval_windows(spec: SweepSpec, runs: list[RunSpec]) -> None:
    """Refuse (ConfigError) a declared endpoint on an evaluation metric whose window holds no evaluation in some
    arm's schedule (analysis.prereg.eval_window_problems): it would give no value at all, after all the compute."""
    from objbench.analysis.prereg import eval_window_problems, parse_plan

    schedules = {r.arm: (r.cfg.train.steps, r.cfg.train.eval_every) for r in runs}
    problems = eval_window_problems(parse_plan(spec.report or {}, spec.arm_labels), schedules)
    if problems:
        raise ConfigError(f"{spec.path}: " + "; ".join(problems))


def _expand(spec: SweepSpec, sweep_dir: Path, extra_overrides: list[str], check_device: bool) -> list[RunSpec]:
    """One RunSpec per (arm, grid point, seed): set, then the arm's overrides, the grid point, the extra
    overrides (the command line), and the run's seed, name and folder."""
    runs = []
    for label, arm_over, point in spec.arm_points():
        for seed in spec.seeds:
            over = [f"{k}={_yaml_value(v)}" for k, v in spec.set.items()]
            over += [f"{k}={_yaml_value(v)}" for k, v in arm_over.items()]
            over += [f"{k}={_yaml_value(v)}" for k, v in point.items()]
            over += extra_overrides
            over += [f"seed={seed}", f"name={label}__s{seed}", f"out_dir={sweep_dir}"]
            try:
                cfg = load_config(spec.base_path, over, check_device=check_device)
            except ConfigError as e:
                raise ConfigError(f"{spec.path}: arm {label!r}, seed {seed}: {e}") from None
            runs.append(RunSpec(label, seed, cfg))
    return runs


def _yaml_value(v) -> str:
    """Render a Python value for an OmegaConf dotlist override."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_yaml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # a whole section (e.g. task: {name: mixture, components: [...]}): JSON is a flow
        return json.dumps(v)  # mapping the dotlist parser reads back exactly
    return str(v)


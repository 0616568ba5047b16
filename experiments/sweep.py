"""Sweep specs and the sweep runner.

A sweep spec is plain data (YAML)::

    name: quickstart                 # folder name under out_dir
    base: ../configs/quickstart.yaml # optional base run config, relative to this file
    out_dir: results/runs            # optional (default results/runs)
    seeds: [0, 1, 2]
    set:                             # overrides applied to every arm (dotted keys)
      train.steps: 200
    arms:                            # named arms: overrides per arm (objective: <preset> picks a preset)
      grpo: {objective: grpo}
      dapo: {objective: dapo}
    grid:                            # optional cartesian product of field values, crossed with the arms
      objective.loss.agg: [token_mean, seq_mean_token_mean]

Each (arm, grid point, seed) is one run named ``<arm>[-<grid values>]__s<seed>`` in ``<out_dir>/<name>/``.
Every arm of a seed shares the seed's cached SFT start and prompt stream (data_seed = seed), so arms differ
only by what the spec names. All runs are resolved and validated before any compute starts.

Runs execute in local worker processes (default: one per core, one torch thread each), or on a Ray cluster
(``--executor ray``) when a sweep outgrows one machine. Re-running the same command skips finished runs and
resumes cut-off runs from their last checkpoint.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path

import yaml

from experiments.config import ConfigError, TrainConfig, load_config

SPEC_KEYS = {"name", "base", "out_dir", "seeds", "set", "arms", "grid", "description", "report"}


@dataclass(frozen=True)
class RunSpec:
    arm: str
    seed: int
    cfg: TrainConfig


@dataclass
class Sweep:
    name: str
    path: Path
    spec: dict
    spec_hash: str
    out_dir: Path
    runs: list[RunSpec]
    arms: list[str]
    seeds: list[int]
    base: str | None

    @property
    def sweep_dir(self) -> Path:
        return self.out_dir / self.name


def _fmt(v) -> str:
    return str(v).replace("/", "_").replace(" ", "")


def load_sweep(path: str | Path, out_dir: str | None = None, extra_overrides: list[str] = ()) -> Sweep:
    """Parse, expand and validate a sweep spec. Raises ConfigError naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep spec not found: {path}")
    text = path.read_text()
    try:
        spec = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a sweep spec is a mapping")
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown sweep key(s) {sorted(unknown)}; valid: {sorted(SPEC_KEYS)}")
    name = spec.get("name") or path.stem
    seeds = spec.get("seeds", [0])
    if isinstance(seeds, int):
        seeds = list(range(seeds))
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ConfigError(f"{path}: seeds must be a non-empty list of non-negative integers (or a count)")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{path}: seeds has duplicates: {seeds}")
    common = spec.get("set") or {}
    arms = spec.get("arms") or {"base": {}}
    if isinstance(arms, list):  # [grpo, dapo] shorthand: arm name = preset name
        arms = {a: {"objective": a} for a in arms}
    if not isinstance(arms, dict) or not isinstance(common, dict):
        raise ConfigError(f"{path}: 'arms' must be a mapping of arm name -> overrides and 'set' a mapping")
    grid = spec.get("grid") or {}
    for k, vals in grid.items():
        if not isinstance(vals, list) or not vals:
            raise ConfigError(f"{path}: grid.{k} must be a non-empty list of values")
    base = spec.get("base")
    base_path = None
    if base:
        base_path = (path.parent / base) if not Path(base).is_absolute() else Path(base)
        if not base_path.is_file():
            raise ConfigError(f"{path}: base config {base!r} not found (looked at {base_path})")
    out = Path(out_dir or spec.get("out_dir") or "results/runs")
    sweep_dir = out / name

    runs, arm_names = [], []
    grid_keys = list(grid)
    for arm, arm_over in arms.items():
        if arm_over is None:
            arm_over = {}
        if not isinstance(arm_over, dict):
            raise ConfigError(f"{path}: arms.{arm} must be a mapping of overrides")
        for point in itertools.product(*(grid[k] for k in grid_keys)) if grid_keys else [()]:
            label = arm
            if point:
                label += "-" + "-".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in zip(grid_keys, point))
            arm_names.append(label)
            for seed in seeds:
                over = [f"{k}={_yaml_value(v)}" for k, v in common.items()]
                over += [f"{k}={_yaml_value(v)}" for k, v in arm_over.items()]
                over += [f"{k}={_yaml_value(v)}" for k, v in zip(grid_keys, point)]
                over += list(extra_overrides)
                over += [f"seed={seed}", f"name={label}__s{seed}", f"out_dir={sweep_dir}"]
                try:
                    cfg = load_config(base_path, over)
                except ConfigError as e:
                    raise ConfigError(f"{path}: arm {label!r}, seed {seed}: {e}") from None
                runs.append(RunSpec(label, seed, cfg))
    if len(set(arm_names)) != len(arm_names):
        raise ConfigError(f"{path}: arm names collide: {arm_names}")
    from analysis.prereg import check_report_spec  # the report: section (analysis.prereg documents its keys)
    try:
        check_report_spec(spec.get("report"), arm_names)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    spec_hash = hashlib.sha256(text.encode()).hexdigest()[:12]
    return Sweep(name, path, spec, spec_hash, out, runs, arm_names, list(seeds), str(base) if base else None)


def _yaml_value(v) -> str:
    """Render a Python value for an OmegaConf dotlist override."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_yaml_value(x) for x in v) + "]"
    return str(v)


def _run_one(cfg: TrainConfig, meta_extra: dict, threads: int) -> tuple[str, float]:
    """Worker entry: one run, no per-step progress bar."""
    import torch

    from experiments.train import train

    torch.set_num_threads(threads)
    t0 = time.time()
    train(cfg, progress=False, meta_extra=meta_extra)
    return cfg.run_name, time.time() - t0


def _warm_one(cfg: TrainConfig, threads: int) -> str:
    import torch

    from experiments.config import build_task
    from experiments.train import warm_start

    torch.set_num_threads(threads)
    if not cfg.model.path or cfg.sft.steps:  # a pretrained model without SFT has nothing to warm
        warm_start(cfg, build_task(cfg))
    return f"seed {cfg.seed}"


def write_sweep_files(sw: Sweep, command: str):
    from experiments.train import _git_commit

    sw.sweep_dir.mkdir(parents=True, exist_ok=True)
    (sw.sweep_dir / "sweep.yaml").write_text(sw.path.read_text())
    info = {"name": sw.name, "spec_hash": sw.spec_hash, "command": command, "arms": sw.arms,
            "seeds": sw.seeds, "commit": _git_commit(), "base_config": sw.base, "spec_path": str(sw.path),
            "report": sw.spec.get("report") or {}}
    (sw.sweep_dir / "sweep.json").write_text(json.dumps(info, indent=1))


def run_sweep(sw: Sweep, *, workers: int | None = None, executor: str = "local", command: str = "",
              report: bool = True) -> Path:
    from tqdm.auto import tqdm

    write_sweep_files(sw, command or f"objbench sweep {sw.path}")
    todo = [r for r in sw.runs if not (sw.sweep_dir / r.cfg.run_name / "done").exists()]
    n_done = len(sw.runs) - len(todo)
    workers = max(1, workers or os.cpu_count() or 1)
    threads = max(1, (os.cpu_count() or 1) // workers)
    print(f"sweep {sw.name}: {len(sw.runs)} runs ({len(sw.arms)} arms x {len(sw.seeds)} seeds), "
          f"{n_done} already finished; {workers} worker(s) x {threads} thread(s) -> {sw.sweep_dir}", flush=True)
    if todo:
        if executor == "ray":
            _run_ray(sw, todo, threads)
        else:
            _run_local(sw, todo, workers, threads, tqdm)
    if report:
        from analysis.report import write_report

        path = write_report(sw.sweep_dir)
        print(f"report: {path}", flush=True)
    return sw.sweep_dir


def _run_local(sw: Sweep, todo: list[RunSpec], workers: int, threads: int, tqdm):
    ctx = get_context("spawn")  # fresh interpreters: no torch thread pools or RNG state shared across runs
    # warm starts first, one per distinct (seed, task, model, sft) so two workers never train the same start
    starts = {}
    for r in todo:
        key = (r.cfg.seed, repr(r.cfg.task), repr(r.cfg.model), repr(r.cfg.sft))
        starts.setdefault(key, r.cfg)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futs = [pool.submit(_warm_one, c, threads) for c in starts.values()]
        for f in tqdm(futs, desc="warm starts", unit="start"):
            f.result()
        bar = tqdm(total=len(todo), desc=f"sweep {sw.name}", unit="run")
        pending = {pool.submit(_run_one, r.cfg, {"arm": r.arm, "sweep": sw.name, "spec_hash": sw.spec_hash},
                               threads): r for r in todo}
        errors = []
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                r = pending.pop(f)
                try:
                    name, secs = f.result()
                    bar.write(f"  finished {name} in {secs:.0f}s")
                except Exception as e:  # keep the other runs going; report at the end
                    errors.append((r.cfg.run_name, e))
                    bar.write(f"  FAILED {r.cfg.run_name}: {type(e).__name__}: {e}")
                bar.update(1)
        bar.close()
    if errors:
        raise RuntimeError(f"{len(errors)} run(s) failed: " + "; ".join(f"{n}: {e}" for n, e in errors))


def _run_ray(sw: Sweep, todo: list[RunSpec], threads: int):
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'objbench[ray]'") from None
    ray.init(address=os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True)
    remote = ray.remote(num_cpus=threads)(_run_one)
    refs = [remote.remote(r.cfg, {"arm": r.arm, "sweep": sw.name, "spec_hash": sw.spec_hash}, threads)
            for r in todo]
    for name, secs in ray.get(refs):
        print(f"  finished {name} in {secs:.0f}s", flush=True)


def describe(sw: Sweep) -> str:
    lines = [f"sweep {sw.name} (spec {sw.spec_hash}) -> {sw.sweep_dir}"]
    for r in sw.runs:
        lines.append(f"  {r.cfg.run_name:40s} objective={r.cfg.objective.name} seed={r.seed}")
    return "\n".join(lines)

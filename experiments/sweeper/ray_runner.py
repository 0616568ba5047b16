"""The Ray executor of a sweep (``--executor ray``): warm starts first, then every run as a Ray task, on an existing
cluster (RAY_ADDRESS) or a local one; the runs' environment and the folder every node must see."""


from __future__ import annotations

import os
from pathlib import Path

from objbench.experiments.config import ConfigError, TrainConfig
from objbench.experiments.config.errors import ANSI, one_line
from objbench.experiments.sweeper.jobs import failure_record, run_one, warm_groups, warm_label, warm_one
from objbench.experiments.sweeper.plan import RunSpec, Sweep


def ray_connect():
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'objbench[ray]'") from None
    if ray.is_initialized():
        return ray, False
    ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=True)
    return ray, True


def ray_env() -> dict:
    """Environment of the Ray tasks (runtime_env env_vars): what a run reads from its environment."""
    from objbench.rollout.sft import default_cache_dir

    env = {k: v for k, v in os.environ.items()
           if k.startswith(("OBJBENCH_", "HF_", "WANDB_")) or k in ("TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM")}
    # the warm starts trained in stage 1 must be found by the runs, on whatever node: one absolute cache folder
    env["OBJBENCH_CACHE"] = os.path.abspath(os.path.expanduser(str(default_cache_dir())))
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():  # a source checkout: workers import this very code, not an install
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(root)]
        env["PYTHONPATH"] = os.pathsep.join([str(root)] + rest)
    return env


def _check_visible(sweep_dir: str):
    if not (Path(sweep_dir) / "sweep.json").is_file():
        import socket
        raise RuntimeError(f"{sweep_dir}/sweep.json is not visible on {socket.gethostname()}: a Ray sweep needs "
                           "its output folder on a filesystem every node shares (e.g. --out /shared/runs)")


def _ray_warm(cfg: TrainConfig, threads: int, sweep_dir: str, plugins: tuple = ()) -> str:
    _check_visible(sweep_dir)
    return warm_one(cfg, threads, plugins)


def _ray_run(cfg: TrainConfig, meta_extra: dict, threads: int, cwd: str, sweep_dir: str, _warm=None,
             plugins: tuple = ()):
    _check_visible(sweep_dir)
    if not os.path.isabs(cfg.out_dir):  # a folder begun before out_dirs were absolute (see check_existing)
        os.chdir(cwd)
    return run_one(cfg, meta_extra, threads, plugins)


def _ray_error(e: BaseException) -> tuple[str, str]:
    cause = getattr(e, "cause", None)
    detail = ANSI.sub("", str(e))
    return (one_line(cause) if isinstance(cause, BaseException) else one_line(e)), detail[-20000:]


def run_ray(ray, sw: Sweep, todo: list[RunSpec], threads: int, gpus: float, bar) -> list:
    """Warm starts, then runs (each after its start), as Ray tasks; failures are collected with ray.wait."""
    env = ray_env()
    opts = {"runtime_env": {"env_vars": env}, "max_retries": 1}
    warm_task, run_task = ray.remote(_ray_warm), ray.remote(_ray_run)
    groups = warm_groups(todo)
    refs, warm_ref = {}, {}  # ref -> (kind, label or RunSpec)
    for i, (key, runs) in enumerate(groups.items(), 1):
        label = warm_label(i, len(groups), runs)
        cfg = runs[0].cfg
        ref = warm_task.options(num_cpus=1, num_gpus=gpus if cfg.model.path else 0, name=f"warm-seed{cfg.seed}",
                                **opts).remote(cfg, threads, str(sw.sweep_dir), sw.plugins)
        refs[ref] = ("warm", label)
        for r in runs:
            warm_ref[r.cfg.run_name] = (ref, label)
        bar.write(f"  {label}: submitted")
    cwd = os.getcwd()
    for r in todo:
        meta = {"arm": r.arm, "sweep": sw.name, "spec_hash": sw.spec_hash}
        dep = warm_ref.get(r.cfg.run_name, (None, None))[0]
        ref = run_task.options(num_cpus=threads, num_gpus=gpus, name=r.cfg.run_name, **opts).remote(
            r.cfg, meta, threads, cwd, str(sw.sweep_dir), dep, sw.plugins)
        refs[ref] = ("run", r)
    failures, warm_failed = [], {}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            kind, what = refs[ref]
            try:
                value = ray.get(ref)
                ok, error, detail = True, "", ""
            except Exception as e:  # noqa: BLE001 - one run's failure is listed, the others go on
                value, ok = None, False
                error, detail = _ray_error(e)
            if kind == "warm":
                bar.write(f"  {what}: " + ("ready" if ok else f"FAILED: {error}"))
                if not ok:
                    warm_failed[what] = error
                continue
            if ok:
                name, secs = value
                bar.write(f"  finished {name} in {secs:.0f}s")
            else:
                label = warm_ref.get(what.cfg.run_name, (None, None))[1]
                if label in warm_failed:
                    error = f"its {label} failed: {warm_failed[label]}"
                bar.write(f"  FAILED {what.cfg.run_name}: {error}")
                failures.append(failure_record(sw, what, error, detail))
            bar.update(1)
    return failures


"""The jobs of a sweep, whatever process runs them: one run, one warm start (grouped by the start they share), a
failed run's record, and the GPUs a run gets (``resources.gpus_per_run``, slots of CUDA_VISIBLE_DEVICES)."""


from __future__ import annotations

import json
import time
from pathlib import Path

from objbench.experiments.config import ConfigError, TrainConfig
from objbench.experiments.config.plugins import ensure_loaded
from objbench.experiments.sweeper.plan import RunSpec, Sweep
from objbench.experiments.sweeper.spec import check_gpus_per_run


def cuda_count() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # a broken driver counts as no GPU; the runs then say why they cannot use one
        return 0


def resolve_gpus(sw: Sweep, gpus_per_run: float | None, cuda_present: bool) -> float:
    """GPUs one run needs: the flag, else the spec's resources.gpus_per_run, else 1 when the runs train on CUDA
    (model.device cuda, or auto with CUDA present), else 0. Raises ConfigError for combinations that cannot run."""
    g = gpus_per_run if gpus_per_run is not None else sw.gpus_per_run
    devices = sorted({r.cfg.model.device for r in sw.runs})
    if g is None:
        g = 1.0 if any(d.startswith("cuda") for d in devices) or ("auto" in devices and cuda_present) else 0.0
    g = check_gpus_per_run(g, "gpus per run")
    for d in devices:
        if d.startswith("cuda") and g == 0:
            raise ConfigError(f"model.device={d} but the sweep gives runs no GPU (gpus per run 0); set "
                              "--gpus-per-run (or resources.gpus_per_run in the spec)")
        if d.startswith("cuda:") and int(d[5:]) >= max(1, int(g)):
            raise ConfigError(f"model.device={d}: a sweep run sees only its own {max(1, int(g))} GPU(s), numbered "
                              "from 0; use model.device=cuda")
    return g


def gpu_slots(g: float, visible: list[str]) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each local worker slot: len = how many runs fit on the GPUs at once."""
    if g == 0:
        return []
    if g < 1:
        per = int(1 / g + 1e-9)
        return [v for v in visible for _ in range(per)]
    n = int(g)
    return [",".join(visible[i * n:(i + 1) * n]) for i in range(len(visible) // n)]


def run_one(cfg: TrainConfig, meta_extra: dict, threads: int, plugins: tuple = ()) -> tuple[str, float]:
    """Worker entry: one run, no per-step progress bar (the sweep's plug-ins loaded first)."""
    import torch

    from objbench.experiments.run.train import train

    ensure_loaded(plugins)
    torch.set_num_threads(threads)
    t0 = time.time()
    train(cfg, progress=False, meta_extra=meta_extra)
    return cfg.run_name, time.time() - t0


def warm_one(cfg: TrainConfig, threads: int, plugins: tuple = ()) -> str:
    import torch

    from objbench.experiments.config import build_task
    from objbench.experiments.run.warmstart import warm_start

    ensure_loaded(plugins)  # a plug-in task must be registered before build_task
    torch.set_num_threads(threads)
    warm_start(cfg, build_task(cfg))  # trains with a fixed thread count (rollout.sft.WARM_START_THREADS)
    return f"seed {cfg.seed}"


def warm_groups(todo: list[RunSpec]) -> dict[tuple, list[RunSpec]]:
    """Runs by warm start: one group per distinct (seed, task, model, sft), so no two workers train one start."""
    groups: dict[tuple, list[RunSpec]] = {}
    for r in todo:
        c = r.cfg
        if c.model.path and not c.sft.steps:  # a pretrained model without SFT has nothing to warm
            continue
        key = (c.seed, repr(c.task), repr(c.model), repr(c.sft), c.rollout.chat_template)
        groups.setdefault(key, []).append(r)
    return groups


def warm_label(i: int, n: int, runs: list[RunSpec]) -> str:
    names = ", ".join(r.cfg.run_name for r in runs[:2]) + (f" +{len(runs) - 2}" if len(runs) > 2 else "")
    return f"warm start {i}/{n} (seed {runs[0].seed}: {names})"


def last_step(run_dir: Path) -> int | None:
    step = None
    try:
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            try:
                step = json.loads(line).get("step", step)
            except (json.JSONDecodeError, AttributeError):
                pass
    except OSError:
        pass
    return step


def failure_record(sw: Sweep, r: RunSpec, error: str, detail: str) -> dict:
    run_dir = sw.sweep_dir / r.cfg.run_name
    return {"run": r.cfg.run_name, "arm": r.arm, "seed": r.seed, "error": error, "detail": detail,
            "run_dir": str(run_dir), "last_step": last_step(run_dir)}


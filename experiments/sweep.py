"""The sweep runner: a sweep spec expanded into runs, and the runs run.

``load_sweep(path)`` reads a sweep spec (experiments/sweep_spec.py documents its keys and checks them) and
resolves the run config of every (arm, grid point, seed); ``run_sweep`` runs them.

Each (arm, grid point, seed) is one run named ``<arm>[-<grid values>]__s<seed>`` in ``<out_dir>/<name>/``, an
absolute folder (resolved where the command runs, so every executor writes to the same place). Every arm of a
seed shares the seed's cached SFT start and prompt stream (data_seed = seed), so arms differ only by what the
spec names. All runs are resolved and validated before any compute starts.

Existing run folders are checked before anything is written: a folder holding a different resolved config (the
spec was edited since) or a run the spec does not name (an arm or seed removed) stops the whole sweep, naming
the differing keys, so a report never mixes two specs. ``--rerun-changed`` moves such folders to
``<sweep>/.replaced/<timestamp>/`` (with the old sweep.yaml, sweep.json and report) and runs them anew; nothing
is ever deleted.

Executors. Local (default): ``--workers`` worker processes (default one per core, cores / workers torch threads
each; experiments/workers.py). Warm starts go first, one job per distinct start, and each run starts as soon as
its own start is ready. A worker dies with the sweep, however the sweep ends (``kill -9`` included: Linux
PR_SET_PDEATHSIG plus a parent watchdog); killing the process group (``kill -- -PGID``, Ctrl-C) stops all at
once too. Ray (``--executor ray``, ``RAY_ADDRESS`` for a running cluster): the same two stages as Ray tasks,
each with ``num_cpus`` = threads and ``num_gpus`` = gpus per run; the sweep folder and the warm-start cache
must be on a filesystem every node sees; workers get OBJBENCH_*, HF_*, WANDB_* and (from a source checkout)
PYTHONPATH through ``runtime_env``; a task is retried once after a lost worker (it resumes from its
checkpoint).

GPUs: with ``gpus_per_run`` > 0 no more runs are in flight than the GPUs hold; a local worker sees only its
own GPUs (CUDA_VISIBLE_DEVICES), numbered from 0, so runs say ``model.device=cuda`` (or auto). A fraction
(0.5) packs 1/fraction runs onto one GPU. With 0, local workers see no GPU.

Failures: a run that fails (an exception, or its worker dying) does not stop the others; the report is written
for the finished runs, the failed ones are listed on stdout and in ``<sweep>/failures.json`` (error, traceback
or exit status, last logged step), and the command exits with status 1 and a one-line message. Re-running the
same command skips finished runs and resumes cut-off or failed runs from their last checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from objbench.experiments.config import ConfigError, TrainConfig, config_differences, load_config, to_dict
from objbench.experiments.plugins import PluginError, ensure_loaded, load_plugins
from objbench.experiments.sweep_spec import SweepSpec, check_gpus_per_run, load_spec
from objbench.experiments.workers import ANSI, Job, Outcome, one_line, run_jobs

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


# ---------------------------------------------------------------------------------------------------------
# what the sweep folder already holds


@dataclass
class Conflict:
    """A run folder in the sweep folder that this spec would not produce."""

    run_dir: Path
    why: str  # "train.steps: 30 -> 40", or "not a run of this spec"
    finished: bool


def _short(v) -> str:
    s = json.dumps(v, default=str) if v is not None else "(absent)"
    return s if len(s) <= 40 else s[:37] + "..."


def _key(difference: str) -> str:
    return difference.removesuffix(" (absent)")


def _get(d, key: str):
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _compare(sw: Sweep, r: RunSpec) -> tuple[str, str, RunSpec]:
    """(state, why, run) of one run of the spec against its folder: state new | resume | done | changed.

    out_dir is where a run lives, not what it is (experiments.config.LOCATION_KEYS): a moved sweep folder, or one
    begun when sweeps wrote out_dir relative to the working directory, resumes or is kept as it is. Any other
    difference is "changed", also for a run that failed before its first checkpoint (which a single
    ``objbench train`` would move aside): a sweep never mixes old and new configs silently.
    """
    from objbench.experiments.run_folder import run_status

    try:
        state = run_status(r.cfg)[1]
        if state != "replace":
            return state, "", r
    except ConfigError:
        pass
    run_dir = sw.sweep_dir / r.cfg.run_name
    old = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    new = to_dict(r.cfg)
    keys = config_differences(old, r.cfg)  # a setting added to objbench later reads as its declared old value
    why = "; ".join(f"{k}: {_short(_get(old, _key(k)))} -> {_short(_get(new, _key(k)))}" for k in keys[:6])
    if len(keys) > 6:
        why += f"; and {len(keys) - 6} more key(s)"
    return "changed", why, r


def check_existing(sw: Sweep) -> list[Conflict]:
    """Compare every run of the spec with what its folder holds, before anything is written or computed.

    Returns the run folders that do not belong to this spec: a folder whose config.yaml differs from the run's
    resolved config (experiments.run_folder.run_status would refuse it; the differing keys are named with old -> new
    values), and run folders the spec does not name. Changes nothing on disk; may give a RunSpec back the
    relative out_dir its folder was begun with (see _compare).
    """
    conflicts, names = [], set()
    for i, r in enumerate(sw.runs):
        names.add(r.cfg.run_name)
        state, why, sw.runs[i] = _compare(sw, r)
        if state == "changed":
            run_dir = sw.sweep_dir / r.cfg.run_name
            conflicts.append(Conflict(run_dir, why, (run_dir / "done").exists()))
    if sw.sweep_dir.is_dir():
        for d in sorted(sw.sweep_dir.iterdir()):
            if d.is_dir() and d.name not in names and not d.name.startswith(".") and \
                    any((d / f).exists() for f in RUN_FILES):
                conflicts.append(Conflict(d, "not a run of this spec", (d / "done").exists()))
    return conflicts


def conflict_message(sw: Sweep, conflicts: list[Conflict]) -> str:
    lines = [f"sweep {sw.name}: {len(conflicts)} folder(s) in {sw.sweep_dir} hold runs this spec would not "
             "produce (it was edited since they ran); nothing was run, nothing changed:"]
    for c in conflicts[:20]:
        lines.append(f"  {c.run_dir.name} ({'finished' if c.finished else 'unfinished'}): {c.why}")
    if len(conflicts) > 20:
        lines.append(f"  ... and {len(conflicts) - 20} more")
    lines.append("Either keep them and write the new runs elsewhere (another `name:` in the spec, or --out DIR), "
                 f"or add --rerun-changed to move them to {sw.sweep_dir / '.replaced'}/<timestamp>/ (nothing is "
                 "deleted) and run the new spec there.")
    return "\n".join(lines)


def set_aside(sw: Sweep, conflicts: list[Conflict]) -> Path:
    """Move conflicting run folders, with the old sweep.yaml, sweep.json, failures.json and report, into
    ``<sweep>/.replaced/<timestamp>/``. Returns that folder."""
    root = sw.sweep_dir / ".replaced"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, k = root / stamp, 1
    while dest.exists():
        k += 1
        dest = root / f"{stamp}-{k}"
    dest.mkdir(parents=True)
    for c in conflicts:
        os.replace(c.run_dir, dest / c.run_dir.name)
    for name in ("sweep.yaml", "sweep.json", "failures.json", "report"):
        if (sw.sweep_dir / name).exists():
            os.replace(sw.sweep_dir / name, dest / name)
    return dest


def run_state(sw: Sweep, r: RunSpec) -> str:
    """new | resume | done | changed, for --dry-run."""
    return _compare(sw, r)[0]


# ---------------------------------------------------------------------------------------------------------
# resources


def _cuda_count() -> int:
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


def _gpu_slots(g: float, visible: list[str]) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each local worker slot: len = how many runs fit on the GPUs at once."""
    if g == 0:
        return []
    if g < 1:
        per = int(1 / g + 1e-9)
        return [v for v in visible for _ in range(per)]
    n = int(g)
    return [",".join(visible[i * n:(i + 1) * n]) for i in range(len(visible) // n)]


# ---------------------------------------------------------------------------------------------------------
# the sweep


def _run_one(cfg: TrainConfig, meta_extra: dict, threads: int, plugins: tuple = ()) -> tuple[str, float]:
    """Worker entry: one run, no per-step progress bar (the sweep's plug-ins loaded first)."""
    import torch

    from objbench.experiments.train import train

    ensure_loaded(plugins)
    torch.set_num_threads(threads)
    t0 = time.time()
    train(cfg, progress=False, meta_extra=meta_extra)
    return cfg.run_name, time.time() - t0


def _warm_one(cfg: TrainConfig, threads: int, plugins: tuple = ()) -> str:
    import torch

    from objbench.experiments.config import build_task
    from objbench.experiments.warmstart import warm_start

    ensure_loaded(plugins)  # a plug-in task must be registered before build_task
    torch.set_num_threads(threads)
    warm_start(cfg, build_task(cfg))  # trains with a fixed thread count (rollout.sft.WARM_START_THREADS)
    return f"seed {cfg.seed}"


def _warm_groups(todo: list[RunSpec]) -> dict[tuple, list[RunSpec]]:
    """Runs by warm start: one group per distinct (seed, task, model, sft), so no two workers train one start."""
    groups: dict[tuple, list[RunSpec]] = {}
    for r in todo:
        c = r.cfg
        if c.model.path and not c.sft.steps:  # a pretrained model without SFT has nothing to warm
            continue
        key = (c.seed, repr(c.task), repr(c.model), repr(c.sft), c.rollout.chat_template)
        groups.setdefault(key, []).append(r)
    return groups


def _warm_label(i: int, n: int, runs: list[RunSpec]) -> str:
    names = ", ".join(r.cfg.run_name for r in runs[:2]) + (f" +{len(runs) - 2}" if len(runs) > 2 else "")
    return f"warm start {i}/{n} (seed {runs[0].seed}: {names})"


def write_sweep_files(sw: Sweep, command: str):
    from objbench.analysis.prereg import parse_plan, unresolvable_warning
    from objbench.experiments.provenance import git_commit, unknown_commit_warning

    commit = git_commit()
    for warning in (unknown_commit_warning(commit),
                    unresolvable_warning(parse_plan(sw.spec.report or {}, sw.spec.arm_labels), len(sw.seeds))):
        if warning:
            print(warning, file=sys.stderr, flush=True)
    sw.sweep_dir.mkdir(parents=True, exist_ok=True)
    (sw.sweep_dir / "sweep.yaml").write_text(sw.path.read_text())
    info = {"name": sw.name, "spec_hash": sw.spec_hash, "command": command, "arms": sw.arms,
            "seeds": sw.seeds, "commit": commit, "base_config": sw.base, "spec_path": str(sw.path),
            "report": sw.spec.report or {}, "plugins": [p.record() for p in sw.plugins]}
    (sw.sweep_dir / "sweep.json").write_text(json.dumps(info, indent=1))


def run_sweep(sw: Sweep, *, workers: int | None = None, executor: str = "local", command: str = "",
              report: bool = True, gpus_per_run: float | None = None, rerun_changed: bool = False) -> Path:
    """Run every unfinished run of ``sw``, then write its report; returns the sweep folder.

    Raises ConfigError (before anything is written) when the sweep folder holds runs of an edited spec and
    ``rerun_changed`` is off, and SweepFailed (after the report) when some runs failed.
    """
    conflicts = check_existing(sw)
    if conflicts and not rerun_changed:
        raise ConfigError(conflict_message(sw, conflicts))
    ray, ray_started = _ray_connect() if executor == "ray" else (None, False)
    try:
        return _run_sweep(sw, ray, workers, command, report, gpus_per_run, conflicts)
    finally:
        if ray_started:
            ray.shutdown()


def _run_sweep(sw: Sweep, ray, workers, command, report, gpus_per_run, conflicts) -> Path:
    from tqdm.auto import tqdm

    if ray is not None:
        gpus = resolve_gpus(sw, gpus_per_run, ray.cluster_resources().get("GPU", 0) > 0)
    else:
        gpus = resolve_gpus(sw, gpus_per_run, _cuda_count() > 0)
    workers = max(1, workers or os.cpu_count() or 1)
    slots = None
    if ray is None and gpus:  # never more runs in flight than the GPUs hold
        n = _cuda_count()
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        slots = _gpu_slots(gpus, (visible or [str(i) for i in range(n)])[:n])
        if not slots:
            raise ConfigError(f"each run needs {gpus:g} GPU(s) and this machine has {n}; set --gpus-per-run")
        workers = min(workers, len(slots))
    if conflicts:  # from here on the sweep folder changes
        dest = set_aside(sw, conflicts)
        print(f"sweep {sw.name}: moved {len(conflicts)} run folder(s) of the old spec to {dest}", flush=True)
    write_sweep_files(sw, command or f"objbench sweep {sw.path}")
    (sw.sweep_dir / "failures.json").unlink(missing_ok=True)  # it described an earlier attempt
    todo = [r for r in sw.runs if not (sw.sweep_dir / r.cfg.run_name / "done").exists()]
    # seed by seed (every arm of seed 0, then of seed 1, ...): a sweep cut off part-way, or run in parts, leaves
    # whole seeds, which the seed-paired comparisons can use
    todo.sort(key=lambda r: sw.seeds.index(r.seed))
    n_done = len(sw.runs) - len(todo)
    threads = max(1, (os.cpu_count() or 1) // workers)
    where = "Ray" if ray is not None else f"{workers} worker(s)"
    print(f"sweep {sw.name}: {len(sw.runs)} runs ({len(sw.arms)} arms x {len(sw.seeds)} seeds), "
          f"{n_done} already finished; {where} x {threads} thread(s), {gpus:g} GPU(s) per run -> {sw.sweep_dir}",
          flush=True)
    failures = []
    if todo:
        bar = tqdm(total=len(todo), desc=f"sweep {sw.name}", unit="run")
        try:
            if ray is not None:
                failures = _run_ray(ray, sw, todo, threads, gpus, bar)
            else:
                failures = _run_local(sw, todo, workers, threads, slots, bar)
        finally:
            bar.close()
    if failures:
        path = sw.sweep_dir / "failures.json"
        path.write_text(json.dumps(failures, indent=1))
        print(f"{len(failures)} of {len(sw.runs)} runs failed (details: {path}):", flush=True)
        for f in failures:
            at = f" (last logged step {f['last_step']})" if f["last_step"] is not None else ""
            print(f"  {f['run']}{at}: {f['error']}", flush=True)
    if report:
        from objbench.analysis.report import write_report

        try:
            print(f"report: {write_report(sw.sweep_dir)}", flush=True)
        except ValueError as e:  # no finished run to report on
            if not failures:
                raise
            print(f"no report: {e}", flush=True)
    if failures:
        names = ", ".join(f["run"] for f in failures[:3]) + (" ..." if len(failures) > 3 else "")
        raise SweepFailed(f"{len(failures)} of {len(sw.runs)} runs failed ({names}: see "
                          f"{sw.sweep_dir / 'failures.json'}); re-run the same command to retry them")
    return sw.sweep_dir


def _last_step(run_dir: Path) -> int | None:
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


def _failure(sw: Sweep, r: RunSpec, error: str, detail: str) -> dict:
    run_dir = sw.sweep_dir / r.cfg.run_name
    return {"run": r.cfg.run_name, "arm": r.arm, "seed": r.seed, "error": error, "detail": detail,
            "run_dir": str(run_dir), "last_step": _last_step(run_dir)}


def _run_local(sw: Sweep, todo: list[RunSpec], workers: int, threads: int, slots: list[str] | None, bar) -> list:
    groups = _warm_groups(todo)
    jobs, run_of = [], {}
    warm_of = {}
    for i, (key, runs) in enumerate(groups.items(), 1):
        name = _warm_label(i, len(groups), runs)
        jobs.append(Job(name, _warm_one, (runs[0].cfg, threads, sw.plugins)))
        for r in runs:
            warm_of[r.cfg.run_name] = name
    for r in todo:
        meta = {"arm": r.arm, "sweep": sw.name, "spec_hash": sw.spec_hash}
        jobs.append(Job(r.cfg.run_name, _run_one, (r.cfg, meta, threads, sw.plugins),
                        after=warm_of.get(r.cfg.run_name)))
        run_of[r.cfg.run_name] = r
    gpu_free = {"CUDA_VISIBLE_DEVICES": ""} if _cuda_count() else {}  # runs that need no GPU see none
    envs = [{"CUDA_VISIBLE_DEVICES": s} for s in slots] if slots else [gpu_free] * workers
    failures = []

    def started(job):
        if job.name not in run_of:
            bar.write(f"  {job.name}: started")

    def ended(out: Outcome):
        r = run_of.get(out.job.name)
        if r is None:
            bar.write(f"  {out.job.name}: " + (f"ready in {out.seconds:.0f}s" if out.ok else f"FAILED: {out.error}"))
            return
        if out.ok:
            bar.write(f"  finished {r.cfg.run_name} in {out.seconds:.0f}s")
        else:
            bar.write(f"  FAILED {r.cfg.run_name}: {out.error}")
            failures.append(_failure(sw, r, out.error, out.detail))
        bar.update(1)

    run_jobs(jobs, envs, on_start=started, on_end=ended)
    return failures


# ---------------------------------------------------------------------------------------------------------
# Ray


def _ray_connect():
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
    from objbench import experiments
    from objbench.rollout.sft import default_cache_dir

    env = {k: v for k, v in os.environ.items()
           if k.startswith(("OBJBENCH_", "HF_", "WANDB_")) or k in ("TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM")}
    # the warm starts trained in stage 1 must be found by the runs, on whatever node: one absolute cache folder
    env["OBJBENCH_CACHE"] = os.path.abspath(os.path.expanduser(str(default_cache_dir())))
    root = Path(experiments.__file__).resolve().parent.parent
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
    return _warm_one(cfg, threads, plugins)


def _ray_run(cfg: TrainConfig, meta_extra: dict, threads: int, cwd: str, sweep_dir: str, _warm=None,
             plugins: tuple = ()):
    _check_visible(sweep_dir)
    if not os.path.isabs(cfg.out_dir):  # a folder begun before out_dirs were absolute (see check_existing)
        os.chdir(cwd)
    return _run_one(cfg, meta_extra, threads, plugins)


def _ray_error(e: BaseException) -> tuple[str, str]:
    cause = getattr(e, "cause", None)
    detail = ANSI.sub("", str(e))
    return (one_line(cause) if isinstance(cause, BaseException) else one_line(e)), detail[-20000:]


def _run_ray(ray, sw: Sweep, todo: list[RunSpec], threads: int, gpus: float, bar) -> list:
    """Warm starts, then runs (each after its start), as Ray tasks; failures are collected with ray.wait."""
    env = ray_env()
    opts = {"runtime_env": {"env_vars": env}, "max_retries": 1}
    warm_task, run_task = ray.remote(_ray_warm), ray.remote(_ray_run)
    groups = _warm_groups(todo)
    refs, warm_ref = {}, {}  # ref -> (kind, label or RunSpec)
    for i, (key, runs) in enumerate(groups.items(), 1):
        label = _warm_label(i, len(groups), runs)
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
                failures.append(_failure(sw, what, error, detail))
            bar.update(1)
    return failures


def describe(sw: Sweep) -> str:
    """The runs of a sweep and what the sweep folder holds for each (new, resume, done, changed), for --dry-run."""
    lines = [f"sweep {sw.name} (spec {sw.spec_hash}) -> {sw.sweep_dir}"]
    conflicts = {c.run_dir.name: c for c in check_existing(sw)}
    for r in sw.runs:
        c = conflicts.pop(r.cfg.run_name, None)
        state = f"changed: {c.why}" if c else run_state(sw, r)
        lines.append(f"  {r.cfg.run_name:40s} objective={r.cfg.objective.name} seed={r.seed} [{state}]")
    for name, c in conflicts.items():
        lines.append(f"  {name:40s} [{c.why}]")
    if any(" [changed" in line or "not a run" in line for line in lines):
        lines.append("a sweep would stop before any compute: see --rerun-changed")
    return "\n".join(lines)

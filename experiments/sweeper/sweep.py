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
from pathlib import Path

from objbench.experiments.config import ConfigError
from objbench.experiments.run.nonfinite import FAILED_FILE, failed_record
from objbench.experiments.run.progress import progress_bar
from objbench.experiments.sweeper.existing import check_existing, conflict_message, set_aside
from objbench.experiments.sweeper.jobs import (
    cuda_count,
    failure_record,
    gpu_slots,
    resolve_gpus,
    run_one,
    warm_groups,
    warm_label,
    warm_one,
)
from objbench.experiments.sweeper.plan import RunSpec, Sweep, SweepFailed
from objbench.experiments.sweeper.ray_runner import ray_connect, run_ray
from objbench.experiments.sweeper.workers import Job, Outcome, run_jobs

# ---------------------------------------------------------------------------------------------------------
# what the sweep folder already holds




















# ---------------------------------------------------------------------------------------------------------
# resources








# ---------------------------------------------------------------------------------------------------------
# the sweep










def write_sweep_files(sw: Sweep, command: str):
    from objbench.analysis.prereg import parse_plan, unresolvable_warning
    from objbench.experiments.run.provenance import git_commit, unknown_commit_warning

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
              report: bool = True, gpus_per_run: float | None = None, rerun_changed: bool = False,
              retry_failed: bool = False) -> Path:
    """Run every unfinished run of ``sw``, then write its report; returns the sweep folder. A run that stopped on a
    non-finite value (its ``failed`` file) is counted as failed again, not retried, unless ``retry_failed``.

    Raises ConfigError (before anything is written) when the sweep folder holds runs of an edited spec and
    ``rerun_changed`` is off, and SweepFailed (after the report) when some runs failed.
    """
    conflicts = check_existing(sw)
    if conflicts and not rerun_changed:
        raise ConfigError(conflict_message(sw, conflicts))
    ray, ray_started = ray_connect() if executor == "ray" else (None, False)
    try:
        return _run_sweep(sw, ray, workers, command, report, gpus_per_run, conflicts, retry_failed)
    finally:
        if ray_started:
            ray.shutdown()


def _run_sweep(sw: Sweep, ray, workers, command, report, gpus_per_run, conflicts, retry_failed=False) -> Path:
    if ray is not None:
        gpus = resolve_gpus(sw, gpus_per_run, ray.cluster_resources().get("GPU", 0) > 0)
    else:
        gpus = resolve_gpus(sw, gpus_per_run, cuda_count() > 0)
    workers = max(1, workers or os.cpu_count() or 1)
    slots = None
    if ray is None and gpus:  # never more runs in flight than the GPUs hold
        n = cuda_count()
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        slots = gpu_slots(gpus, (visible or [str(i) for i in range(n)])[:n])
        if not slots:
            raise ConfigError(f"each run needs {gpus:g} GPU(s) and this machine has {n}; set --gpus-per-run")
        workers = min(workers, len(slots))
    if conflicts:  # from here on the sweep folder changes
        dest = set_aside(sw, conflicts)
        print(f"sweep {sw.name}: moved {len(conflicts)} run folder(s) of the old spec to {dest}", flush=True)
    write_sweep_files(sw, command or f"objbench sweep {sw.path}")
    (sw.sweep_dir / "failures.json").unlink(missing_ok=True)  # it described an earlier attempt
    todo = [r for r in sw.runs if not (sw.sweep_dir / r.cfg.run_name / "done").exists()]
    todo, failed_before = split_failed(sw, todo, retry_failed)
    # seed by seed (every arm of seed 0, then of seed 1, ...): a sweep cut off part-way, or run in parts, leaves
    # whole seeds, which the seed-paired comparisons can use
    todo.sort(key=lambda r: sw.seeds.index(r.seed))
    n_done = len(sw.runs) - len(todo)
    threads = max(1, (os.cpu_count() or 1) // workers)
    where = "Ray" if ray is not None else f"{workers} worker(s)"
    print(f"sweep {sw.name}: {len(sw.runs)} runs ({len(sw.arms)} arms x {len(sw.seeds)} seeds), "
          f"{n_done} already finished; {where} x {threads} thread(s), {gpus:g} GPU(s) per run -> {sw.sweep_dir}",
          flush=True)
    failures = failed_before
    if todo:
        bar = progress_bar(len(todo), f"sweep {sw.name}", "run")
        try:
            if ray is not None:
                failures += run_ray(ray, sw, todo, threads, gpus, bar)
            else:
                failures += _run_local(sw, todo, workers, threads, slots, bar)
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






def _run_local(sw: Sweep, todo: list[RunSpec], workers: int, threads: int, slots: list[str] | None, bar) -> list:
    groups = warm_groups(todo)
    jobs, run_of = [], {}
    warm_of = {}
    for i, (key, runs) in enumerate(groups.items(), 1):
        name = warm_label(i, len(groups), runs)
        jobs.append(Job(name, warm_one, (runs[0].cfg, threads, sw.plugins)))
        for r in runs:
            warm_of[r.cfg.run_name] = name
    for r in todo:
        meta = {"arm": r.arm, "sweep": sw.name, "spec_hash": sw.spec_hash}
        jobs.append(Job(r.cfg.run_name, run_one, (r.cfg, meta, threads, sw.plugins),
                        after=warm_of.get(r.cfg.run_name)))
        run_of[r.cfg.run_name] = r
    gpu_free = {"CUDA_VISIBLE_DEVICES": ""} if cuda_count() else {}  # runs that need no GPU see none
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
            failures.append(failure_record(sw, r, out.error, out.detail))
        bar.update(1)

    run_jobs(jobs, envs, on_start=started, on_end=ended)
    return failures


# ---------------------------------------------------------------------------------------------------------
# Ray


def split_failed(sw: Sweep, todo: list[RunSpec], retry_failed: bool) -> tuple[list[RunSpec], list[dict]]:
    """(the runs to run, the failure records of runs a non-finite value stopped before): those are not retried
    (the same seed fails the same way) unless ``retry_failed``, which clears their ``failed`` files."""
    failed = []
    for r in todo:
        record = failed_record(sw.sweep_dir / r.cfg.run_name)
        if record is None:
            continue
        if retry_failed:
            (sw.sweep_dir / r.cfg.run_name / FAILED_FILE).unlink()
            print(f"sweep {sw.name}: retrying {r.cfg.run_name}, which had failed ({record.get('error', '')})", flush=True)
        else:
            failed.append((r, record))
    kept = {id(r) for r, _ in failed}
    records = [failure_record(sw, r, f"failed earlier, not retried (--retry-failed retries it): "
                                     f"{record.get('error', '')}", "") for r, record in failed]
    return [r for r in todo if id(r) not in kept], records

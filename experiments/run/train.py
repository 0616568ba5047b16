"""The training loop: one function of (config, seed), readable top to bottom, never branching on a preset.

One RL step:
  prompts (envs, by index) -> G completions each (rollout engine, + behaviour log-probs) -> rewards (envs)
  -> shaping / dynamic sampling (algos.filters) -> reference log-probs and critic values (no grad)
  -> advantages (algos) -> n_epochs x n_minibatches optimizer steps on the policy loss (+ value loss)
  -> one JSON line of metrics, flushed.

This file holds the run's driver (train) and one step (train_step); each other job has its file in this package:
  update.py (advantages and the optimizer steps), setup.py (what the loop runs with), warmstart.py (the cached
  start policy), collect.py and sample.py (sampling, verification, dynamic sampling), batch.py, evaluate.py,
  scheduling.py (settings at a step), step_metrics.py, diagnostics.py (study measurements, a listener of the
  update), loop_state.py, checkpoint.py, run_folder.py (new / resume / done, the lock), logs.py, provenance.py,
  rng.py.

Files (run_dir = <out_dir>/<run name>/): config.yaml, meta.json, metrics.jsonl, eval.jsonl, samples.jsonl,
checkpoints/step-<N>/ with checkpoints/last linking the newest (safetensors weights, optimizer, RNG and loop state;
experiments/run/checkpoint.py: a kill at any point of a save leaves a complete one), done (written last).
A run that finds its folder with a checkpoint and no ``done`` resumes from the checkpoint; rows logged after
the checkpoint are dropped first, so no step appears twice and none is lost.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers.utils import logging as _hf_logging

from objbench.experiments.config import TrainConfig, check_model
from objbench.experiments.config.errors import RunFolderError, one_line
from objbench.experiments.config.plugins import resume_warning
from objbench.experiments.run.batch import Batch
from objbench.experiments.run.checkpoint import (
    load_checkpoint,
    save_checkpoint,
)
from objbench.experiments.run.collect import collect
from objbench.experiments.run.evaluate import evaluate
from objbench.experiments.run.logs import JsonlWriter, RunLogs
from objbench.experiments.run.loop_state import LoopState
from objbench.experiments.run.nonfinite import FAILED_FILE, NonFiniteError, all_finite, failed_record, mark_failed
from objbench.experiments.run.progress import LineProgress, eval_line, progress_bar
from objbench.experiments.run.provenance import (
    peak_rss_mb,
    run_meta,
)
from objbench.experiments.run.run_folder import prepare_run_dir, run_lock, run_status
from objbench.experiments.run.scheduling import at_step, control_temperature
from objbench.experiments.run.setup import (
    Setup,
    build_setup,
    make_optimizers,
    weights_copy,
)
from objbench.experiments.run.step_metrics import parse_warning, rollout_metrics
from objbench.experiments.run.update import update

# transformers' own per-file progress bars (save/load of a 0.5 MB checkpoint) would drown the sweep's bar
_hf_logging.disable_progress_bar()

NONDETERMINISTIC_KEYS = ("time", "time/", "mem/")  # excluded when comparing two runs for determinism
RUN_FILES = ("metrics.jsonl", "eval.jsonl", "samples.jsonl")


# ---------------------------------------------------------------------------------------------------------
# the run


def train(cfg: TrainConfig, *, progress: bool = True, cache_dir=None, meta_extra: dict | None = None,
          after_step: Callable[[int], None] | None = None) -> Path:
    """Run (or resume, or skip if finished) one training run; returns its folder.

    One process at a time per run folder: a second command for the same run stops at once (file lock).
    ``after_step(step)`` is called after each step is logged and checkpointed (tests use it to crash a run)."""
    with run_lock(cfg):
        return _train(cfg, progress=progress, cache_dir=cache_dir, meta_extra=meta_extra, after_step=after_step)


def _train(cfg: TrainConfig, *, progress: bool, cache_dir, meta_extra: dict | None, after_step) -> Path:
    model_info = check_model(cfg)
    run_dir, status = run_status(cfg)
    if status == "done":
        if progress:
            print(f"{run_dir}: already finished (delete its 'done' file to rerun)")
        return run_dir
    if status == "failed":
        raise RunFolderError(f"{run_dir} failed earlier ({failed_record(run_dir).get('error', 'see meta.json')}); "
                             f"delete {run_dir / FAILED_FILE} to retry it from its last checkpoint")
    # the start policy first: a bad model, data file or warm start fails before any run folder is written
    s = build_setup(cfg, cache_dir)
    run_dir, status = prepare_run_dir(cfg)
    s.policy.train()
    opt, critic_opt = make_optimizers(s)
    state = start_state(run_dir, s, opt, critic_opt, resume=status == "resume")
    before = changed_plugins(run_dir) if status == "resume" else None
    meta = run_meta(cfg, s, state, model_info, meta_extra)
    if before is not None:
        meta["plugins_before_resume"] = before
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    try:
        run_loop(s, run_dir, state, opt, critic_opt, meta, progress, after_step)
    except NonFiniteError as e:
        mark_failed(run_dir, meta, e)
        raise
    except Exception as e:  # the folder says why the run stopped (it stays resumable)
        meta["error"] = {"step": state.step + 1, "error": one_line(e)}
        (run_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
        raise
    finally:
        if s.reward_fns is not None:
            s.reward_fns.close()
    meta["end"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    meta["peak_rss_mb"] = peak_rss_mb()
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    (run_dir / "done").write_text("")
    return run_dir


def changed_plugins(run_dir: Path) -> list | None:
    """Resuming with plug-in files that changed since the run started: say so (the run goes on) and return the
    plug-ins its meta.json recorded before, for meta.json to keep; None when nothing changed."""
    try:
        old = json.loads((run_dir / "meta.json").read_text()).get("plugins")
    except (OSError, ValueError, AttributeError):
        return None
    warning = resume_warning(old)
    if not warning:
        return None
    print(f"{run_dir}: {warning}", file=sys.stderr)
    return old


def start_state(run_dir: Path, s: Setup, opt, critic_opt, resume: bool) -> LoopState:
    """The loop state to start from: the newest loadable checkpoint's (its logs cut back to its step), or step 0. A
    resumed folder with logs but no checkpoint at all (a run stopped before its first one) keeps its logs in a
    folder beside them; one whose checkpoints all fail to load is refused (load_checkpoint)."""
    state = load_checkpoint(run_dir, s, opt, critic_opt) if resume else None
    if state is None:
        logged = [run_dir / n for n in RUN_FILES if (run_dir / n).is_file() and (run_dir / n).stat().st_size]
        if logged:
            aside = run_dir / f"logs.before-restart-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
            aside.mkdir()
            for f in logged:
                os.replace(f, aside / f.name)
            print(f"{run_dir}: no checkpoint to resume from; starting at step 0, the earlier logs kept in {aside}",
                  file=sys.stderr)
        for name in RUN_FILES:
            (run_dir / name).unlink(missing_ok=True)
        return LoopState()
    for name in RUN_FILES:
        if note := JsonlWriter.truncate_after(run_dir / name, state.step):
            print(note, file=sys.stderr)
    s.engine.sync_weights(s.policy)  # the engine was built from the warm start, the policy is the checkpoint's
    return state


def run_loop(s: Setup, run_dir: Path, state: LoopState, opt, critic_opt, meta: dict, progress: bool,
             after_step) -> None:
    """Evaluate at step 0, then train step by step: log, evaluate, checkpoint."""
    cfg, steps = s.cfg, s.cfg.train.steps
    logs = RunLogs(run_dir, cfg, meta)
    bar = progress_bar(steps, cfg.run_name, "step", initial=state.step) if progress else None
    warned = False
    try:
        if state.step == 0:
            logs.eval.write({"step": 0, "tokens": 0, **evaluate(s, 0)})
        while state.step < steps:
            row, all_b = train_step(s, state, opt, critic_opt)
            step = state.step
            logs.metrics.write(row)
            if not warned and (warning := parse_warning(row, s.task)):
                warned = True
                warn_once(run_dir, meta, warning, bar)
            logs.write_samples(step, all_b, cfg.train.log_samples)
            if step % cfg.train.eval_every == 0 or step == steps:
                erow = {"step": step, "tokens": state.tokens, **evaluate(s, step)}
                logs.eval.write(erow)
                row.update(erow)
            logs.to_wandb(row, step)
            if (cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0) or step == steps:
                save_checkpoint(run_dir, s, opt, critic_opt, state)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(acc=f"{row['reward/acc']:.2f}", len=f"{row['length/mean']:.1f}")
                if isinstance(bar, LineProgress) and "eval/acc" in row:
                    bar.write(eval_line(cfg.run_name, step, steps, row))
            if after_step is not None:
                after_step(step)
    finally:
        logs.close()
        if bar is not None:
            bar.close()


def warn_once(run_dir: Path, meta: dict, warning: str, bar) -> None:
    """Print a warning above the progress bar (or to stderr) and keep it in meta.json's "warnings"."""
    import sys

    (bar.write if bar is not None else lambda text: print(text, file=sys.stderr))(warning)
    meta.setdefault("warnings", []).append(warning)
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))


# ---------------------------------------------------------------------------------------------------------
# one RL step


def train_step(s: Setup, state: LoopState, opt, critic_opt) -> tuple[dict, Batch]:
    """One RL step (collect, then update); advances ``state``. Returns (metrics row, everything sampled)."""
    step = state.step + 1
    s, sched = at_step(s, state, step)  # the objective and sampling temperature in effect at this step
    phases_before = dict(s.timers)
    t0 = time.perf_counter()
    if s.sampler is not None:  # stale rollouts: sample with the weights of len(history) - 1 training steps ago
        s.sampler.load_state_dict(s.history[0])
        s.engine.sync_weights(s.sampler)
        try:
            train_b, all_b, cm = collect(s, step, state)
        finally:
            s.engine.sync_weights(s.policy)  # evaluation samples the current weights
        cm["rollout/staleness"] = len(s.history) - 1
    else:
        train_b, all_b, cm = collect(s, step, state)
    t1 = time.perf_counter()
    m = {**rollout_metrics(all_b, s.task, s.cfg.objective.group_size), **cm, **sched}
    if train_b is not None and not all_finite(all_b.rewards):
        train_b = skip_or_stop(s, step, "reward", m)
    if train_b is not None:
        m.update(update(s, train_b, opt, critic_opt, step))
        s.engine.sync_weights(s.policy)  # the next rollout (and evaluation) samples from the updated weights
    if s.history is not None:
        s.history.append(weights_copy(s.policy))
        while len(s.history) > s.cfg.rollout.staleness + 1:
            s.history.popleft()
    control_temperature(s, state, m)  # rollout.temperature_control: the next step's temperature
    t2 = time.perf_counter()
    state.tokens += m["rollout/tokens"]
    state.elapsed += t2 - t0
    state.step = step
    row = {"step": step, "tokens": state.tokens, "time": round(state.elapsed, 4), **m,
           "time/rollout": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0,
           "mem/peak_rss_mb": peak_rss_mb()}
    if s.device.type == "cuda":  # the policy's device (make_setup moved it there)
        row["mem/gpu_peak_mb"] = torch.cuda.max_memory_allocated(s.device) / 2 ** 20
    row.update({f"time/{k}": v - phases_before.get(k, 0.0) for k, v in s.timers.items()})
    return row, all_b


def skip_or_stop(s: Setup, step: int, quantity: str, m: dict):
    """A non-finite quantity before the update: raise NonFiniteError (train.nan_policy=stop) or skip the step's whole
    update (skip_step; every optimizer step of it counted as skipped). Returns the batch to train on (None)."""
    if s.cfg.train.nan_policy == "stop":
        raise NonFiniteError(step, quantity)
    m["optim/nonfinite_skipped"] = s.cfg.objective.n_epochs * s.cfg.objective.n_minibatches
    return None

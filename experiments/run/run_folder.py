"""The run folder: new, resume or done, a refusal when it holds another config, and the folder of a run
that failed before its first checkpoint moved aside."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import yaml

from objbench.experiments.config import (
    ConfigError,
    TrainConfig,
    absent_values,
    config_differences,
    flat_dict,
    to_dict,
    to_yaml,
)
from objbench.experiments.config.errors import RunFolderError
from objbench.experiments.run.checkpoint import latest_checkpoint
from objbench.experiments.run.nonfinite import FAILED_FILE


def run_status(cfg: TrainConfig) -> tuple[Path, str]:
    """(run_dir, status) with status in new|resume|done|failed (a non-finite value stopped it), writing nothing.

    A folder that holds a different resolved config is never overwritten: that is an error.
    """
    run_dir = Path(cfg.out_dir) / cfg.run_name
    if (run_dir / "config.yaml").is_file():
        try:
            old = yaml.safe_load((run_dir / "config.yaml").read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise RunFolderError(f"{run_dir}/config.yaml cannot be read ({type(e).__name__}); the folder is not a "
                                 f"usable run: move or delete {run_dir}, or choose another name=") from None
        if not isinstance(old, dict) or undeclared_missing_sections(old, cfg):
            raise RunFolderError(f"{run_dir}/config.yaml is incomplete (cut off while it was written?); the folder "
                                 f"is not a usable run: move or delete {run_dir}, or choose another name=")
        diff = config_differences(old, cfg)
        if diff:
            if latest_checkpoint(run_dir) is None and not (run_dir / "done").exists():
                return run_dir, "replace"  # a run that failed before its first checkpoint: nothing to resume
            raise ConfigError(
                f"{run_dir} already holds a run with a different config (differs in: {', '.join(diff[:8])}); "
                "choose another name= or out_dir=, or delete that folder yourself")
        if (run_dir / "done").exists():
            return run_dir, "done"
        if (run_dir / FAILED_FILE).exists():
            return run_dir, "failed"
        return run_dir, "resume"
    return run_dir, "new"


def undeclared_missing_sections(old: dict, cfg: TrainConfig) -> list[str]:
    """Top-level sections of ``cfg`` that ``old`` lacks although not all their settings were added later: a
    config.yaml cut off while it was written (or not an objbench config at all)."""
    declared = absent_values(type(cfg), cfg.task.get("name"))
    now = flat_dict(to_dict(cfg))
    missing = {k.split(".")[0] for k in now} - set(old)
    return sorted(sec for sec in missing if any(k.split(".")[0] == sec and k not in declared for k in now))


def prepare_run_dir(cfg: TrainConfig) -> tuple[Path, str]:
    """Create or reopen the run folder. Returns (run_dir, status) with status in new|resume|done."""
    run_dir, status = run_status(cfg)
    if status == "replace":  # moved aside, never deleted: it may hold the logs of why it failed
        aside = run_dir.with_name(f"{run_dir.name}.failed-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}")
        os.replace(run_dir, aside)
        print(f"{run_dir} held a different config and no checkpoint (a run that failed early); moved it to "
              f"{aside}", file=sys.stderr)
        status = "new"
    if status == "new":
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return run_dir, status


@contextlib.contextmanager
def run_lock(cfg: TrainConfig):
    """Hold the run folder's lock file (``<out_dir>/.<name>.lock``) for the block: one process at a time per run."""
    lock_path = Path(cfg.out_dir) / f".{cfg.run_name}.lock"
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(lock_path, "w")
    except OSError as e:
        raise RunFolderError(f"cannot write to out_dir={cfg.out_dir!r} ({type(e).__name__}: {e.strerror or e}); "
                             "choose another out_dir=") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderError(f"another objbench process is running {Path(cfg.out_dir) / cfg.run_name} "
                                 f"(lock {lock_path}); wait for it or stop it") from None
        yield

"""Non-finite values stop the run (train.nan_policy=stop, the default) or skip the optimizer step they would poison
(train.nan_policy=skip_step): the step's rewards, and each optimizer step's loss and gradient norm, are checked with
one reduction and one read per check, before anything is applied. A stopped run keeps its last good checkpoint, and
its folder says why it failed: meta.json's "failed" and a ``failed`` file (never ``done``), with the step, the
quantity and its likely cause. A sweep counts such a run as failed, its report lists it apart, and re-running the
sweep does not retry it unless asked (``--retry-failed``): the same seed would fail the same way."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from objbench.experiments.config.errors import NonFiniteError

FAILED_FILE = "failed"


def all_finite(*tensors: torch.Tensor) -> bool:
    """Whether every value of the tensors is finite: one reduction per tensor and one read for them all."""
    flags = [torch.isfinite(t.detach()).all() for t in tensors if t is not None]
    return bool(torch.stack(flags).all()) if flags else True


def mark_failed(run_dir: Path, meta: dict, error: NonFiniteError) -> None:
    """meta.json's "failed" and the ``failed`` file: the step, the quantity and its likely cause."""
    record = error.record()  # once: both files carry the same time
    meta["failed"] = record
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    (run_dir / FAILED_FILE).write_text(json.dumps(record, indent=1))


def failed_record(run_dir: Path) -> dict | None:
    """What a failed run's ``failed`` file says (None when the run has not failed)."""
    path = run_dir / FAILED_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = None
    return record if isinstance(record, dict) else {"error": "failed (its 'failed' file is not readable)"}

"""Checkpoints: weights (safetensors), optimizer and its learning-rate schedule, RNG and loop state, in a folder per
step (checkpoints/step-00000020/), with ``checkpoints/last`` a symbolic link to the newest.

A save survives a kill at any instruction: the new checkpoint is written into a hidden folder, its files flushed to
disk, and only then renamed to its step's name (one atomic rename: a ``step-*`` folder is always complete); then
``last`` is switched to it (a new link renamed over the old one, atomic too), and only then are older checkpoints
removed (each renamed away first, so a half-deleted folder never carries a step's name). Loading takes the newest
checkpoint that reads back whole, with finite weights; older ones are the fallback. Folders of the format before
this one (a ``last`` folder, and the ``old`` that a kill between its two renames could leave) load the same way.

``SAVE_HOOK`` is None in production; a test sets it to a function of (point, step), called at every point of the
save (``SAVE_POINTS``), to kill the process there.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import torch

from objbench.experiments.config.errors import RunFolderError
from objbench.experiments.run.loop_state import LoopState
from objbench.experiments.run.setup import Setup

SAVE_POINTS = ("start", "policy", "optimizer", "lr_schedule", "critic", "rng", "history", "state", "flushed",
               "renamed", "link_made", "link_switched", "old_removed")
SAVE_HOOK: Callable[[str, int], None] | None = None


def _at(point: str, step: int) -> None:
    if SAVE_HOOK is not None:
        SAVE_HOOK(point, step)


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:08d}"


def save_checkpoint(run_dir: Path, s: Setup, opt, critic_opt, state: LoopState) -> Path:
    """Write the checkpoint of ``state.step`` (see the module docstring for the order); returns its folder."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".partial-{state.step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _at("start", state.step)
    write_files(tmp, s, opt, critic_opt, state)
    for f in tmp.rglob("*"):
        if f.is_file():
            _fsync(f)
    _fsync(tmp)
    _at("flushed", state.step)
    final = step_dir(run_dir, state.step)
    if final.exists():  # this step saved before (a resume from an older one): out of the way first
        _discard(final)
    os.replace(tmp, final)
    _fsync(root)
    _at("renamed", state.step)
    switch_last(root, final.name, state.step)
    remove_older(root, keep=final.name)
    _at("old_removed", state.step)
    return final


def write_files(folder: Path, s: Setup, opt, critic_opt, state: LoopState) -> None:
    """The checkpoint's files, state.json last."""
    step = state.step
    s.policy.save_pretrained(folder / "policy")  # safetensors
    _at("policy", step)
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    _at("optimizer", step)
    if s.lr_schedule is not None:  # optim.lr_schedule / warmup_steps: where the schedule stands
        torch.save(s.lr_schedule.state_dict(), folder / "lr_schedule.pt")
    _at("lr_schedule", step)
    if s.critic is not None:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in s.critic.state_dict().items()}, folder / "critic.safetensors")
        torch.save(critic_opt.state_dict(), folder / "critic_optimizer.pt")
    _at("critic", step)
    torch.save({"torch": torch.get_rng_state()}, folder / "rng.pt")
    _at("rng", step)
    if s.history is not None:  # the stale sampler's weights to come
        torch.save(list(s.history), folder / "sampler_history.pt")
    _at("history", step)
    (folder / "state.json").write_text(json.dumps(state.to_json()))
    _at("state", step)


def switch_last(root: Path, name: str, step: int) -> None:
    """Point ``last`` at ``name``: a new link, renamed over the old (a ``last`` folder of the old format is renamed
    to its step's name first; until the switch the loader finds the checkpoints by their names)."""
    link = root / ".last-new"
    link.unlink(missing_ok=True)
    link.symlink_to(name)
    _at("link_made", step)
    last = root / "last"
    if last.is_dir() and not last.is_symlink():
        legacy_step = read_step(last)
        if legacy_step is None or (root / f"step-{legacy_step:08d}").exists():
            _discard(last)
        else:
            os.replace(last, root / f"step-{legacy_step:08d}")
    os.replace(link, last)
    _fsync(root)
    _at("link_switched", step)


def remove_older(root: Path, keep: str) -> None:
    """Every other checkpoint folder, partial save and folder of the old format, renamed away, then deleted."""
    for p in sorted(root.iterdir()):
        if p.name in (keep, "last") or p.is_symlink():
            continue
        if p.name.startswith(("step-", ".partial-", ".trash-")) or p.name in ("old", "tmp"):
            _discard(p)


def _discard(p: Path) -> None:
    trash = p.with_name(f".trash-{p.name.lstrip('.')}")
    if p != trash:
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(p, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_step(folder: Path) -> int | None:
    """The step a checkpoint folder holds, from its state.json (written last); None when it is not readable."""
    try:
        step = json.loads((folder / "state.json").read_text())["step"]
        return step if isinstance(step, int) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoint folders that name a step, newest first ('last' and 'old' of the old format included)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = {}
    for p in root.iterdir():
        if p.name.startswith("step-") or (p.name in ("last", "old") and not p.is_symlink()):
            step = read_step(p)
            if step is not None:
                found.setdefault(p.resolve(), (step, p))
    return [p for _, p in sorted(found.values(), key=lambda sp: (-sp[0], sp[1].name))]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint folder that names a step (not yet loaded: see load_checkpoint), or None."""
    found = checkpoints(run_dir)
    return found[0] if found else None


def load_checkpoint(run_dir: Path, s: Setup, opt, critic_opt) -> LoopState | None:
    """Load the newest checkpoint that reads back whole with finite weights (older ones are the fallback); None when
    the run has none. Raises RunFolderError when it has checkpoints and none of them loads."""
    found = checkpoints(run_dir)
    problems = []
    for folder in found:
        try:
            return _load_checkpoint(folder, s, opt, critic_opt)
        except Exception as e:
            problems.append(f"{folder.name}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
    if not found:
        return None
    raise RunFolderError(f"{run_dir}: no checkpoint of it can be loaded ({'; '.join(problems)}); delete "
                         f"{run_dir / 'checkpoints'} to restart this run from step 0, or delete {run_dir}")


def _load_checkpoint(last: Path, s: Setup, opt, critic_opt) -> LoopState:
    from safetensors.torch import load_file
    pol = type(s.policy).from_pretrained(last / "policy", dtype=next(s.policy.parameters()).dtype)
    check_finite(pol.state_dict(), "the policy's weights")
    critic = load_file(last / "critic.safetensors") if s.critic is not None else None
    if critic is not None:
        check_finite(critic, "the critic's weights")
    s.policy.load_state_dict(pol.state_dict())
    opt.load_state_dict(torch.load(last / "optimizer.pt", weights_only=True, map_location=s.device))
    if s.lr_schedule is not None:  # after the optimizer's: its param groups hold the learning rate in effect
        s.lr_schedule.load_state_dict(torch.load(last / "lr_schedule.pt", weights_only=True))
    if critic is not None:
        s.critic.load_state_dict(critic)
        critic_opt.load_state_dict(torch.load(last / "critic_optimizer.pt", weights_only=True,
                                              map_location=s.device))
    torch.set_rng_state(torch.load(last / "rng.pt", weights_only=True)["torch"])
    if s.history is not None:
        s.history.clear()
        s.history.extend(torch.load(last / "sampler_history.pt", weights_only=True, map_location=s.device))
    return LoopState.from_json(json.loads((last / "state.json").read_text()))


def check_finite(tensors: dict, what: str) -> None:
    """Raise ValueError naming the first tensor with a NaN or an infinity (a damaged file loads silently)."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"{what}: {name} holds {bad} non-finite value(s) of {t.numel()}")
    if not tensors:
        raise ValueError(f"{what}: no tensors")

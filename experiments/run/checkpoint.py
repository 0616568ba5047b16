"""Checkpoints: weights (safetensors), optimizer and its learning-rate schedule, RNG and loop state, written
atomically to checkpoints/last."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from objbench.experiments.config.errors import RunFolderError
from objbench.experiments.run.loop_state import LoopState
from objbench.experiments.run.setup import Setup


def save_checkpoint(run_dir: Path, s: Setup, opt, critic_opt, state: LoopState):
    tmp = run_dir / "checkpoints" / "tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    s.policy.save_pretrained(tmp / "policy")  # safetensors
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    if s.lr_schedule is not None:  # optim.lr_schedule / warmup_steps: where the schedule stands
        torch.save(s.lr_schedule.state_dict(), tmp / "lr_schedule.pt")
    if s.critic is not None:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in s.critic.state_dict().items()}, tmp / "critic.safetensors")
        torch.save(critic_opt.state_dict(), tmp / "critic_optimizer.pt")
    torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
    if s.history is not None:  # the stale sampler's weights to come
        torch.save(list(s.history), tmp / "sampler_history.pt")
    (tmp / "state.json").write_text(json.dumps(state.to_json()))
    last = run_dir / "checkpoints" / "last"
    old = run_dir / "checkpoints" / "old"
    shutil.rmtree(old, ignore_errors=True)
    if last.exists():
        os.replace(last, old)
    os.replace(tmp, last)  # the checkpoint becomes visible only when complete
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(run_dir: Path, s: Setup, opt, critic_opt) -> LoopState | None:
    last = run_dir / "checkpoints" / "last"
    if not (last / "state.json").is_file():
        return None
    try:
        return _load_checkpoint(last, s, opt, critic_opt)
    except Exception as e:
        raise RunFolderError(
            f"{run_dir}: its checkpoint {last} cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:200]}). "
            f"Delete {last} to restart this run from step 0, or delete {run_dir}") from None


def _load_checkpoint(last: Path, s: Setup, opt, critic_opt) -> LoopState:
    from safetensors.torch import load_file
    pol = type(s.policy).from_pretrained(last / "policy", dtype=next(s.policy.parameters()).dtype)
    s.policy.load_state_dict(pol.state_dict())
    opt.load_state_dict(torch.load(last / "optimizer.pt", weights_only=True, map_location=s.device))
    if s.lr_schedule is not None:  # after the optimizer's: its param groups hold the learning rate in effect
        s.lr_schedule.load_state_dict(torch.load(last / "lr_schedule.pt", weights_only=True))
    if s.critic is not None:
        s.critic.load_state_dict(load_file(last / "critic.safetensors"))
        critic_opt.load_state_dict(torch.load(last / "critic_optimizer.pt", weights_only=True,
                                              map_location=s.device))
    torch.set_rng_state(torch.load(last / "rng.pt", weights_only=True)["torch"])
    if s.history is not None:
        s.history.clear()
        s.history.extend(torch.load(last / "sampler_history.pt", weights_only=True, map_location=s.device))
    return LoopState.from_json(json.loads((last / "state.json").read_text()))

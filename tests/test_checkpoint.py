"""Checkpoints survive a kill at any point of a save: a kill injected at every point of save_checkpoint (its test
hook) leaves a checkpoint that loads whole, either the previous step's or the new one's, never a mix; the next save
cleans up. Folders of the previous format ('last', and the 'old' that a kill between its two renames left behind),
damaged weights, and the run-level resume after such a kill (every step logged once) are tested too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import objbench.experiments.run.checkpoint as C
from objbench.experiments.config.errors import RunFolderError
from objbench.experiments.run.loop_state import LoopState
from objbench.rollout.models import build_policy

FAST = ["sft.steps=20", "sft.batch_size=16", "train.steps=4", "rollout.completions_per_step=16",
        "train.eval_size=6", "train.eval_samples=2", "train.eval_every=2", "train.checkpoint_every=1",
        "train.threads=1"]
CRASH_RUN = str(Path(__file__).with_name("crash_run.py"))


class Killed(BaseException):
    """A kill: nothing after it in the save runs (a BaseException, so no `except Exception` catches it)."""


def setup(seed: int):
    policy = build_policy("tiny", 24, seed=seed)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    s = SimpleNamespace(policy=policy, lr_schedule=None, critic=None, history=deque([{"w": torch.ones(2) * seed}]),
                        device=torch.device("cpu"))
    return s, opt


def train_a_little(s, opt, seed: int):
    """One optimizer step, so that the optimizer has state and the weights differ from step to step."""
    torch.manual_seed(seed)
    loss = sum((p * torch.randn_like(p)).sum() for p in s.policy.parameters())
    opt.zero_grad()
    loss.backward()
    opt.step()


def weights(model) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def saved_at(run_dir, step, seed):
    s, opt = setup(seed)
    train_a_little(s, opt, seed)
    C.save_checkpoint(run_dir, s, opt, None, LoopState(step=step))
    return weights(s.policy)


@pytest.mark.parametrize("point", C.SAVE_POINTS)
def test_a_kill_at_any_point_of_a_save_leaves_a_whole_checkpoint(tmp_path, point, monkeypatch):
    w1 = saved_at(tmp_path, 1, seed=1)
    s, opt = setup(seed=2)
    train_a_little(s, opt, 2)
    w2 = weights(s.policy)

    def kill(at, step):
        if at == point:
            raise Killed(at)

    monkeypatch.setattr(C, "SAVE_HOOK", kill)
    with pytest.raises(Killed):
        C.save_checkpoint(tmp_path, s, opt, None, LoopState(step=2))
    monkeypatch.setattr(C, "SAVE_HOOK", None)
    fresh, fresh_opt = setup(seed=3)
    state = C.load_checkpoint(tmp_path, fresh, fresh_opt, None)
    after_rename = C.SAVE_POINTS.index(point) >= C.SAVE_POINTS.index("renamed")
    assert state.step == (2 if after_rename else 1)
    want = w2 if after_rename else w1
    assert all(torch.equal(fresh.policy.state_dict()[k], v) for k, v in want.items())
    assert fresh.history[0]["w"].equal(torch.ones(2) * (2 if after_rename else 1))
    # the next save succeeds and leaves one checkpoint and the link to it
    C.save_checkpoint(tmp_path, fresh, fresh_opt, None, LoopState(step=3))
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["last", "step-00000003"], names
    assert (tmp_path / "checkpoints" / "last").resolve().name == "step-00000003"


def test_the_save_calls_its_hook_at_every_declared_point(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(C, "SAVE_HOOK", lambda at, step: seen.append(at))
    saved_at(tmp_path, 1, seed=1)
    assert tuple(seen) == C.SAVE_POINTS


def legacy_folder(run_dir: Path, name: str, step: int, seed: int) -> dict:
    """A checkpoint in the previous format's folder name (checkpoints/last or checkpoints/old)."""
    w = saved_at(run_dir / "tmp-legacy", step, seed)
    src = C.step_dir(run_dir / "tmp-legacy", step)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), run_dir / "checkpoints" / name)
    shutil.rmtree(run_dir / "tmp-legacy")
    return w


def test_the_previous_format_loads_and_the_old_folder_a_kill_left_is_found(tmp_path):
    w = legacy_folder(tmp_path / "a", "last", 4, seed=1)
    s, opt = setup(seed=3)
    assert C.load_checkpoint(tmp_path / "a", s, opt, None).step == 4
    assert all(torch.equal(s.policy.state_dict()[k], v) for k, v in w.items())
    C.save_checkpoint(tmp_path / "a", s, opt, None, LoopState(step=5))  # the old folder gives way to the new format
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == ["last", "step-00000005"]
    # the previous format's kill between 'last -> old' and 'tmp -> last': only 'old' (and a partial tmp) remain
    w = legacy_folder(tmp_path / "b", "old", 6, seed=2)
    (tmp_path / "b" / "checkpoints" / "tmp").mkdir()
    s, opt = setup(seed=3)
    assert C.load_checkpoint(tmp_path / "b", s, opt, None).step == 6
    assert all(torch.equal(s.policy.state_dict()[k], v) for k, v in w.items())


def test_damaged_weights_are_refused_and_an_older_checkpoint_is_used(tmp_path, monkeypatch):
    w1 = saved_at(tmp_path, 1, seed=1)
    keep = C.step_dir(tmp_path, 1)
    shutil.copytree(keep, tmp_path / "keep")
    saved_at(tmp_path, 2, seed=2)
    shutil.copytree(tmp_path / "keep", keep)  # two checkpoints on disk, as after a kill before the clean-up
    weights_file = C.step_dir(tmp_path, 2) / "policy" / "model.safetensors"
    data = bytearray(weights_file.read_bytes())
    data[-64:] = b"\xff" * 64  # the last 64 bytes of the last tensor: NaN in float32
    weights_file.write_bytes(bytes(data))
    s, opt = setup(seed=3)
    assert C.load_checkpoint(tmp_path, s, opt, None).step == 1
    assert all(torch.equal(s.policy.state_dict()[k], v) for k, v in w1.items())
    shutil.rmtree(keep)
    with pytest.raises(RunFolderError, match="non-finite"):
        C.load_checkpoint(tmp_path, *setup(seed=3), None)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.robustness
@pytest.mark.parametrize("point", ["policy", "state", "renamed", "link_switched"])
def test_a_run_killed_inside_a_save_resumes_with_every_step_logged_once(tmp_path, point):
    """A real kill (os._exit in the hook) inside step 3's save; the same command then resumes and finishes."""
    args = [*FAST, f"out_dir={tmp_path}", "name=r"]
    env = {**os.environ, "OBJBENCH_TEST_KILL_IN_SAVE": f"{point}:3", "OBJBENCH_CACHE": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, CRASH_RUN, "train", "--quiet", *args], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 9, p.stderr[-2000:]
    env.pop("OBJBENCH_TEST_KILL_IN_SAVE")
    p = subprocess.run([sys.executable, "-m", "objbench", "train", "--quiet", *args], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert [r["step"] for r in _rows(tmp_path / "r" / "metrics.jsonl")] == [1, 2, 3, 4]
    assert [r["step"] for r in _rows(tmp_path / "r" / "eval.jsonl")] == [0, 2, 4]

"""The CUDA path: the same code as on CPU, on a GPU. Skipped where torch sees no CUDA device; out of the default
run by the ``gpu`` marker (``python -m pytest -m gpu tests/test_gpu.py``).

What these check: scoring and every preset's loss on CUDA equal the CPU's on identical tensors (fp32; the lean
CPU forward is not used on a GPU, so this is transformers on CUDA against the CPU path); the default toy run and a
Hugging Face model folder (Qwen2 + byte-level BPE built here) train on CUDA in fp32 and bf16 with finite values;
the same config and seed give the same metrics on CUDA; a run resumes on CUDA; GPU peak memory is logged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from objbench.experiments.config import load_config
from objbench.experiments.run.train import NONDETERMINISTIC_KEYS, train

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

FAST = ["sft.steps=40", "train.steps=4", "rollout.completions_per_step=32", "train.eval_size=16",
        "train.eval_samples=2", "train.eval_every=2", "train.checkpoint_every=2"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory):
    from objbench.rollout.toy_hf import write_toy_model

    return write_toy_model(tmp_path_factory.mktemp("models") / "toy-qwen2")


def _rows(path):
    return [json.loads(line) for line in open(path)]


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC_KEYS)} for r in rows]


def _finite(rows):
    bad = [(r["step"], k, v) for r in rows for k, v in r.items()
           if isinstance(v, float) and not math.isfinite(v) and not k.startswith(("time", "length/"))]
    # length/correct is NaN on a step with no correct answer, by definition
    assert not bad, f"non-finite metrics: {bad[:5]}"


def test_scoring_on_cuda_equals_cpu():
    from objbench.rollout.models import build_policy
    from objbench.rollout.scoring import score

    torch.manual_seed(0)
    model = build_policy("tiny", 20, seed=0).eval()
    B, P, T = 8, 6, 10
    pids = torch.randint(3, 20, (B, P))
    pmask = torch.ones(B, P, dtype=torch.bool)
    pmask[:3, :2] = False  # left padding
    rids = torch.randint(3, 20, (B, T))
    rmask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B, 1))
    with torch.no_grad():
        cpu = score(model, pids, pmask, rids, rmask)
        model.cuda()
        gpu = score(model, pids.cuda(), pmask.cuda(), rids.cuda(), rmask.cuda())
    d = (cpu.logp - gpu.logp.cpu())[rmask].abs().max().item()
    assert d < 1e-4, f"CUDA and CPU log-probs differ by {d}"


@pytest.mark.parametrize("objective", ["ppo", "grpo", "dr_grpo", "dapo", "gspo"])
def test_every_preset_loss_on_cuda_equals_cpu(objective):
    from objbench import algos

    cfg = algos.get_preset(objective, group_size=1 if objective == "ppo" else 4)
    B, T = 8, 7
    g = torch.Generator().manual_seed(1)
    mask = torch.arange(T)[None, :] < torch.randint(2, T + 1, (B, 1), generator=g)
    logp = -torch.rand(B, T, generator=g) * 2
    old = logp + 0.1 * torch.randn(B, T, generator=g)
    ref = logp + 0.1 * torch.randn(B, T, generator=g)
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    values = torch.randn(B, T, generator=g) if objective == "ppo" else None

    def run(device):
        dev = lambda t: None if t is None else t.to(device)  # noqa: E731
        adv, _, _ = algos.compute_advantages(cfg, rewards=dev(rewards), mask=dev(mask), values=dev(values),
                                             old_logp=dev(old), ref_logp=dev(ref), max_len=T)
        lp = logp.clone().to(device).requires_grad_(True)
        loss, _ = algos.compute_loss(cfg, logp=lp, old_logp=dev(old), advantages=adv, mask=dev(mask),
                                     ref_logp=dev(ref), max_len=T)
        loss.backward()
        return adv.cpu(), loss.detach().cpu(), lp.grad.cpu()

    for c, k, name in zip(run("cpu"), run("cuda"), ("advantages", "loss", "grad")):
        assert torch.allclose(c, k, atol=1e-6, rtol=1e-5), (objective, name, (c - k).abs().max().item())


def test_default_run_trains_on_cuda_and_repeats(tmp_path):
    cfg = [*FAST, "model.device=cuda", "objective=grpo", f"out_dir={tmp_path}"]
    a = train(load_config(None, cfg + ["name=a"]), progress=False)
    b = train(load_config(None, cfg + ["name=b"]), progress=False)
    ra, rb = _rows(a / "metrics.jsonl"), _rows(b / "metrics.jsonl")
    _finite(ra)
    assert len(ra) == 4 and all(r["mem/gpu_peak_mb"] > 0 for r in ra)
    assert _strip(ra) == _strip(rb), "the same config and seed gave different metrics on CUDA"
    assert _rows(a / "eval.jsonl") == _rows(b / "eval.jsonl")


@pytest.mark.parametrize("objective", ["ppo", "gspo"])
def test_presets_with_a_critic_or_sequence_ratio_train_on_cuda(tmp_path, objective):
    run = train(load_config(None, [*FAST, "model.device=cuda", f"objective={objective}", f"out_dir={tmp_path}",
                                   f"name={objective}"]), progress=False)
    _finite(_rows(run / "metrics.jsonl"))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_model_folder_trains_and_resumes_on_cuda(tmp_path, toy_model, dtype):
    import os
    import subprocess
    import sys

    base = [f"model.path={toy_model}", "task.name=arithmetic", "model.device=cuda", f"model.dtype={dtype}",
            "sft.steps=40", "rollout.completions_per_step=32", "train.eval_size=16", "train.eval_samples=2",
            "train.eval_every=2", "train.checkpoint_every=2", "train.steps=5", f"out_dir={tmp_path}"]
    cmd = [sys.executable, "-m", "objbench.experiments.cli.main", "train", "--quiet", *base, "name=r"]
    crash = [sys.executable, str(Path(__file__).with_name("crash_run.py")), *cmd[3:]]  # hard crash after step 3
    p = subprocess.run(crash, env={**os.environ, "OBJBENCH_TEST_CRASH_AT_STEP": "3"}, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 3, p.stderr[-2000:]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    resumed = _rows(tmp_path / "r" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    _finite(resumed)
    ref = train(load_config(None, base + ["name=ref"]), progress=False)
    assert _strip(resumed) == _strip(_rows(ref / "metrics.jsonl")), "a resumed CUDA run differs from an uninterrupted one"

"""Non-finite values stop the run (train.nan_policy): a run whose loss, gradient or rewards go NaN or infinite ends
`failed` with the step, the quantity and its likely cause in meta.json and a `failed` file, never `done`; its last
good checkpoint stays; a sweep counts it as failed, its report lists it apart, and a rerun does not retry it unless
asked. skip_step leaves the weights, the optimizer state and the schedule untouched and counts the skipped steps.
Each way in below finished as `done`, exit 0, before (two of the three issue 44 names; the third, damaged
checkpoint weights, is in tests/test_checkpoint.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from objbench.experiments.cli.main import main

FAST = ["sft.steps=20", "sft.batch_size=16", "train.steps=3", "rollout.completions_per_step=16",
        "train.eval_size=6", "train.eval_samples=2", "train.eval_every=2", "train.checkpoint_every=1",
        "train.threads=1"]

# finite on the conformance check's random batches (ratio != 1), NaN at ratio 1: on-policy, the first update
NAN_AT_RATIO_ONE = '''
from objbench.algos import SURROGATES, Surrogate


def nan_at_one(*, ratio, logp, adv, mask, opts):
    return -adv * ratio * (ratio - 1) / (ratio - 1), {}


SURROGATES.register("nan_at_one", Surrogate(nan_at_one, reads=(), levels=("token",)))
'''

HUGE_REWARD = '''
def huge(prompts, completions, **kwargs):
    return [3e38 for _ in completions]  # finite, but 10 x 3e38 is not a float32
'''


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def objbench(*args: str) -> subprocess.CompletedProcess:
    """The command line in a process of its own: a plug-in registers into this process's registries for good, and
    every later run of the test session would list it in its meta.json."""
    return subprocess.run([sys.executable, "-m", "objbench", *args], capture_output=True, text=True, timeout=600,
                          env=os.environ.copy())


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def nan_plugin(tmp_path_factory) -> Path:
    """One file for the module: a surrogate name registers once per process."""
    plug = tmp_path_factory.mktemp("plug") / "nan_plugin.py"
    plug.write_text(NAN_AT_RATIO_ONE)
    return plug


def test_a_nan_loss_stops_the_run_failed_with_the_reason(tmp_path, nan_plugin):
    args = ["train", "--quiet", "--import", str(nan_plugin), *FAST, f"out_dir={tmp_path}", "name=n",
            "objective.ratio.surrogate=nan_at_one"]
    p = objbench(*args)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "step 1: loss is not finite" in p.stderr
    run = tmp_path / "n"
    assert not (run / "done").exists() and (run / "failed").exists()
    failed = json.loads((run / "meta.json").read_text())["failed"]
    assert failed["step"] == 1 and failed["quantity"] == "loss" and "plug-in" in failed["cause"]
    assert json.loads((run / "failed").read_text())["quantity"] == "loss"
    assert _rows(run / "metrics.jsonl") == []  # the step was never applied, so never logged
    # the same command again does not silently rerun it
    p = objbench(*args)
    assert p.returncode == 2 and "failed earlier" in p.stderr


def test_skip_step_leaves_the_weights_and_counts_the_skipped_steps(tmp_path, nan_plugin):
    p = objbench("train", "--quiet", "--import", str(nan_plugin), *FAST, f"out_dir={tmp_path}", "name=s",
                 "objective.ratio.surrogate=nan_at_one", "train.nan_policy=skip_step")
    assert p.returncode == 0, p.stderr[-2000:]
    run = tmp_path / "s"
    assert (run / "done").exists()
    rows = _rows(run / "metrics.jsonl")
    assert [r["optim/nonfinite_skipped"] for r in rows] == [1, 1, 1]  # one optimizer step per RL step, each skipped
    opt = torch.load(run / "checkpoints" / "last" / "optimizer.pt", weights_only=True)
    assert opt["state"] == {}  # AdamW never stepped


def test_a_reward_sum_that_overflows_stops_the_run(tmp_path):
    fns = tmp_path / "fns.py"
    fns.write_text(HUGE_REWARD)
    code = main(["train", "--quiet", *FAST, f"out_dir={tmp_path}", "name=r", f"reward.fns=[{fns}:huge]",
                 "reward.weights=[10.0]"])
    assert code == 1
    failed = json.loads((tmp_path / "r" / "failed").read_text())
    assert failed["step"] == 1 and failed["quantity"] == "reward"


@pytest.mark.robustness  # three whole sweeps (~25 s): CI runs it with the robustness runs
def test_a_sweep_counts_a_failed_run_lists_it_apart_and_does_not_retry_it(tmp_path, nan_plugin):
    spec = {"name": "sw", "seeds": 1, "imports": [str(nan_plugin)], "set": dict(a.split("=", 1) for a in FAST),
            "arms": {"grpo": {"objective": "grpo"},
                     "nan": {"objective": "grpo", "objective.ratio.surrogate": "nan_at_one"}}}
    path = tmp_path / "sw.yaml"
    path.write_text(yaml.safe_dump(spec))
    args = ["sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "1"]
    assert objbench(*args).returncode == 1
    sweep = tmp_path / "out" / "sw"
    assert (sweep / "grpo__s0" / "done").exists() and (sweep / "nan__s0" / "failed").exists()
    report = (sweep / "report" / "report.md").read_text()
    assert "`nan__s0`: failed: step 1, loss not finite (never averaged in)" in report
    assert json.loads((sweep / "failures.json").read_text())[0]["run"] == "nan__s0"
    before = (sweep / "nan__s0" / "meta.json").read_text()
    p = objbench(*args)  # counted as failed again, not rerun
    assert p.returncode == 1 and "not retried" in p.stdout
    assert (sweep / "nan__s0" / "meta.json").read_text() == before
    p = objbench(*args, "--retry-failed")  # retried (and fails the same way again)
    assert p.returncode == 1 and "retrying nan__s0" in p.stdout

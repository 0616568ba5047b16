"""Reward functions (reward.fns): TRL's signature, abstaining, weights, the worker process and its failures."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from objbench.envs.base import Problem
from objbench.envs.reward_fns import RewardFnError, RewardFunctions, check_fn_spec, columns_of, fn_names
from objbench.experiments.cli.main import main
from objbench.experiments.config import ConfigError, load_config

FAST = ["sft.steps=20", "sft.batch_size=16", "train.steps=2", "rollout.completions_per_step=16",
        "task.eval_per_difficulty=2", "train.eval_samples=2", "train.eval_every=2"]

FNS = '''
import os
import time


def short_bonus(prompts, completions, **columns):
    """1 for a response of at most 3 characters, None (abstain) for an empty one, else 0."""
    print("user code printing to stdout must not break the protocol")
    return [None if not c else float(len(c) <= 3) for c in completions]


def echo_columns(prompts, completions, answer, difficulty, **rest):
    return [float(len(a)) + d / 10 for a, d in zip(answer, difficulty)]


def raises(prompts, completions, **columns):
    raise ValueError("no reward today")


def hangs(prompts, completions, **columns):
    time.sleep(60)


def dies(prompts, completions, **columns):
    os._exit(3)


def too_few(prompts, completions, **columns):
    return [1.0]


def not_finite(prompts, completions, **columns):
    return [float("nan")] * len(completions)
'''


@pytest.fixture
def fns_file(tmp_path) -> Path:
    p = tmp_path / "my_rewards.py"
    p.write_text(textwrap.dedent(FNS))
    return p


def test_specs_names_and_columns():
    check_fn_spec("my_rewards:short_bonus")
    for bad in ("short_bonus", "mod:", ":fn", "mod:not-a-name", "nowhere.py:fn"):
        with pytest.raises(ValueError, match="reward.fns entry"):
            check_fn_spec(bad)
    assert fn_names(["a:fmt", "b.py:fmt", "c:task"]) == ["fmt", "fmt_2", "task_2"]
    probs = [Problem("u1", "1+1=", "2", 1, meta=(("source", "x"),)), Problem("u2", "3+4=", "7", 2)]
    assert columns_of(probs) == {"answer": ["2", "7"], "difficulty": [1, 2], "source": ["x", None]}


def test_the_worker_calls_functions_and_reports_every_failure(fns_file):
    names = ["short_bonus", "echo_columns", "raises", "hangs", "dies", "too_few", "not_finite"]
    fns = RewardFunctions([f"{fns_file}:{n}" for n in names], timeout=2.0)
    cols = {"answer": ["12", "7"], "difficulty": [2, 1]}
    assert fns.values(0, ["p", "q"], ["12", ""], cols) == [1.0, None]
    assert fns.values(1, ["p", "q"], ["a", "b"], cols) == [2.2, 1.1]
    with pytest.raises(RewardFnError, match=r"my_rewards.py:raises raised ValueError: no reward today\n"):
        fns.values(2, ["p"], ["a"], {"answer": ["1"], "difficulty": [1]})  # the traceback follows the line
    with pytest.raises(RewardFnError, match="must return a list of 2 values"):
        fns.values(5, ["p", "q"], ["a", "b"], cols)
    with pytest.raises(RewardFnError, match="returned nan for completion 0"):
        fns.values(6, ["p", "q"], ["a", "b"], cols)
    with pytest.raises(RewardFnError, match=r"hangs did not return within 2 s \(reward.timeout\)"):
        fns.values(3, ["p"], ["a"], {"answer": ["1"], "difficulty": [1]})
    fns = RewardFunctions([f"{fns_file}:dies"], timeout=5.0)
    with pytest.raises(RewardFnError, match=r"dies: its worker process ended \(exit code 3\)"):
        fns.values(0, ["p"], ["a"], {"answer": ["1"], "difficulty": [1]})


def test_config_checks_weights_and_specs(fns_file, tmp_path):
    base = [*FAST, f"out_dir={tmp_path}"]
    cfg = load_config(None, [*base, f"reward.fns=[{fns_file}:short_bonus]", "reward.weights=[0.5]"])
    assert cfg.reward.fns == [f"{fns_file}:short_bonus"] and cfg.reward.weights == [0.5]
    with pytest.raises(ConfigError, match="reward.weights has 2 value"):
        load_config(None, [*base, f"reward.fns=[{fns_file}:short_bonus]", "reward.weights=[1,2]"])
    with pytest.raises(ConfigError, match="reward.timeout must be > 0"):
        load_config(None, [*base, "reward.timeout=0"])


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_reward_function_adds_a_logged_term_and_leaves_correct_alone(fns_file, tmp_path):
    out = tmp_path / "runs"
    assert main(["train", "--quiet", *FAST, f"out_dir={out}", "name=plain"]) == 0
    assert main(["train", "--quiet", *FAST, f"out_dir={out}", "name=fn", f"reward.fns=[{fns_file}:short_bonus]",
                 "reward.weights=[0.5]", "reward.task_weight=2"]) == 0
    plain, fn = _rows(out / "plain")[0], _rows(out / "fn")[0]  # step 1: same policy, seed and samples
    assert fn["reward/acc"] == plain["reward/acc"]  # the verifier alone decides correct
    assert fn["reward/task"] == pytest.approx(plain["reward/mean"])
    assert 0 <= fn["reward/short_bonus"] <= 1 and "reward/short_bonus_abstained" in fn
    scored = 1 - fn["reward/short_bonus_abstained"]
    assert fn["reward/mean"] == pytest.approx(2 * fn["reward/task"] + 0.5 * fn["reward/short_bonus"] * scored)
    assert "reward/short_bonus" not in plain


def test_a_function_that_cannot_load_stops_before_the_run_folder(tmp_path, capsys, fns_file):
    out = tmp_path / "runs"
    assert main(["train", "--quiet", *FAST, f"out_dir={out}", f"reward.fns=[{fns_file}:missing_fn]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot load" in err[0] and "has no function 'missing_fn'" in err[0]
    assert not (out / "grpo__s0").exists() and not any(out.glob("*/config.yaml"))


def test_a_function_that_raises_mid_run_fails_the_run_with_its_name(tmp_path, capsys, fns_file):
    out = tmp_path / "runs"
    assert main(["train", "--quiet", *FAST, f"out_dir={out}", "name=r", f"reward.fns=[{fns_file}:raises]"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"objbench: reward function {fns_file}:raises raised ValueError: no reward today"
    assert not (out / "r" / "done").exists()


def test_a_data_set_task_gives_its_own_columns_as_in_the_file(tmp_path):
    """TRL's convention: a reward function sees the data set's columns (here GSM8K's question, answer with its
    '####' solution, level); objbench's parsed ground truth and level fill only names the file does not use."""
    from objbench.envs.dataset import DatasetConfig, DatasetTask, write_synthetic_gsm8k

    path = tmp_path / "g.jsonl"
    write_synthetic_gsm8k(str(path), 40, seed=0, difficulty=True)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    task = DatasetTask(DatasetConfig(path=str(path), format="gsm8k", eval_size=8))
    probs = task.prompts(0, 0, 5) + task.eval_set()[:2]
    cols = columns_of(probs, task)
    by_question = {row["question"]: row for row in lines}
    for k, p in enumerate(probs):
        row = by_question[cols["question"][k]]
        assert cols["answer"][k] == row["answer"] and "####" in cols["answer"][k]  # the file's, not the parsed "7"
        assert cols["level"][k] == row["level"] == cols["difficulty"][k] == p.difficulty
        assert cols["split"][k] == ("train" if k < 5 else "eval")

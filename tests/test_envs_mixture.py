"""The mixture task (envs/mixture.py): difficulty = component number, components' own held-out rules, rewards and
reference answers, per-component warm-start noise; and the per-difficulty advantage-weight share it feeds
(experiments.train.weight_shares), against numbers worked out by hand."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch

from objbench.envs import make_task, task_spec
from objbench.envs.base import NumericProblem

ADD1 = {"name": "arithmetic", "ops": "+", "max_digits": 1, "difficulty_weights": {1: 1}, "eval_per_difficulty": 6}
SUB2 = {"name": "arithmetic", "ops": "-", "max_digits": 2, "difficulty_weights": {2: 1}, "eval_per_difficulty": 6}
MUL1 = {"name": "arithmetic", "ops": "*", "max_digits": 1, "difficulty_weights": {1: 1}, "eval_per_difficulty": 6}


def mix(**kw):
    return make_task("mixture", components=[ADD1, SUB2, MUL1], **kw)


def test_difficulty_is_the_component_and_problems_are_the_components():
    t = mix()
    assert t.difficulties == (1, 2, 3)
    for p in t.prompts(0, 0, 300):
        op = {1: "+", 2: "-", 3: "*"}[p.difficulty]
        assert isinstance(p, NumericProblem) and p.op == op
        assert p.uid.startswith(f"mixture:{p.difficulty}:arithmetic:train:0:")
        assert dict(p.meta)["component"] == p.difficulty
        a, b = p.operands
        assert p.answer == str(eval(f"{a}{op}{b}")).replace("-", "")[::-1] if op != "-" or a >= b else True
        assert not t.is_held_out(p)
    # "3+5" as the + component would write it: reversed answer "8"; a wrong answer and garbage earn nothing
    p = next(p for p in t.prompts(0, 0, 50) if p.difficulty == 1)
    assert t.reward(p, p.answer).correct and t.reward(p, p.answer).reward == 1.0
    assert not t.reward(p, p.answer + "1").correct and t.reward(p, "x+").malformed
    assert t.sft_target(p, random.Random(0)) == p.answer


def test_the_stream_is_a_pure_function_and_follows_the_weights():
    t = mix(weights=[3, 1, 0.5])
    again = mix(weights=[3, 1, 0.5])
    assert [p.uid for p in t.prompts(4, 10, 40)] == [p.uid for p in again.prompts(4, 10, 40)]
    n = Counter(p.difficulty for p in t.prompts(0, 0, 4500))
    # expected 3/4.5, 1/4.5, 0.5/4.5 of 4500 = 3000, 1000, 500 (binomial sd <= 32)
    assert abs(n[1] - 3000) < 150 and abs(n[2] - 1000) < 120 and abs(n[3] - 500) < 100


def test_eval_set_holds_each_components_trained_difficulties_round_robin():
    t = mix()
    ev = t.eval_set()
    # SUB2 would evaluate difficulties 1 and 2 on its own; in the mixture only the 2-digit problems it trains on
    assert [p.difficulty for p in ev] == [1, 2, 3] * 6
    assert all(len(str(p.operands[0])) == 2 for p in ev if p.difficulty == 2)
    assert all(t.is_held_out(p) for p in ev)
    assert len({p.uid for p in ev}) == len(ev)


def test_spec_round_trips_through_json():
    t = mix(weights=[1, 2, 1], sft_noise=[0.1, None, 0.9])
    spec = json.loads(json.dumps(task_spec(t)))
    again = make_task(**spec)
    assert task_spec(again) == task_spec(t)
    assert [p.uid for p in again.prompts(0, 0, 20)] == [p.uid for p in t.prompts(0, 0, 20)]
    p1, p2 = (next(p for p in t.prompts(0, 0, 50) if p.difficulty == d) for d in (1, 2))
    assert t.sft_noise(p1) == 0.1 and t.sft_noise(p2) is None
    assert mix().sft_noise(p1) is None


@pytest.mark.parametrize("kw, says", [
    ({"components": [ADD1]}, "at least 2"),
    ({"components": [ADD1, {"ops": "+"}]}, "components[1] must be a mapping of task settings with a name"),
    ({"components": [ADD1, {"name": "mixture", "components": [ADD1, SUB2]}]}, "cannot contain a mixture"),
    ({"components": [ADD1, {**SUB2, "digits": 2}]}, "components[1] (arithmetic): unknown setting"),
    ({"components": [ADD1, {"name": "arithmetic", "filler_max": 2, "filler_position": "after", "verdict": True}]},
     "verdict"),
    ({"components": [ADD1, SUB2], "weights": [1]}, "1 numbers for 2 components"),
    ({"components": [ADD1, SUB2], "weights": [1, 0]}, "weights[1] must be a finite number > 0"),
    ({"components": [ADD1, SUB2], "sft_noise": [0.1, 1.5]}, "sft_noise[1] must be a number in [0, 1]"),
    ({"components": [ADD1, SUB2], "sft_noise": [0.1]}, "1 values for 2 components"),
])
def test_bad_settings_name_the_problem(kw, says):
    with pytest.raises(ValueError) as e:
        make_task("mixture", **kw)
    assert says in str(e.value)


def test_weight_shares_by_hand():
    from objbench.experiments.run.diagnostics import weight_shares

    # four responses, sequence-level advantages +1, -1 (difficulty 1) and +0.5, -0.5 (difficulty 2), lengths 1 2 2 4
    adv = torch.tensor([[1.0, 1, 1, 1], [-1, -1, -1, -1], [0.5, 0.5, 0.5, 0.5], [-0.5, -0.5, -0.5, -0.5]])
    lens = torch.tensor([1, 2, 2, 4])
    mask = torch.arange(4)[None, :] < lens[:, None]
    diff = torch.tensor([1, 1, 2, 2])
    # seq_mean_token_mean: each response weighs |A_i| / 4 -> d1 (1 + 1) / 3 = 2/3, d2 (0.5 + 0.5) / 3 = 1/3
    s = weight_shares(adv, mask, diff, (1, 2), "seq_mean_token_mean", None)
    assert s["adv/weight_share_d1"] == pytest.approx(2 / 3) and s["adv/weight_share_d2"] == pytest.approx(1 / 3)
    # token_mean: each token weighs |A| / 9 -> d1 1*1 + 1*2 = 3, d2 0.5*2 + 0.5*4 = 3 of 6 -> 1/2 each
    s = weight_shares(adv, mask, diff, (1, 2), "token_mean", None)
    assert s["adv/weight_share_d1"] == pytest.approx(0.5) and s["adv/weight_share_d2"] == pytest.approx(0.5)
    # Dr. GRPO's constant normaliser gives token_mean's proportions here too
    s = weight_shares(adv, mask, diff, (1, 2), "seq_mean_token_sum_norm", 8)
    assert s["adv/weight_share_d1"] == pytest.approx(0.5)
    # a difficulty with no responses gets 0; all-zero advantages give NaN, not a division error
    s = weight_shares(adv, mask, diff, (1, 2, 3), "seq_mean_token_mean", None)
    assert s["adv/weight_share_d3"] == 0.0
    s = weight_shares(torch.zeros(4, 4), mask, diff, (1, 2), "seq_mean_token_mean", None)
    assert all(v != v for v in s.values())


def test_warm_start_demonstrations_use_each_components_noise():
    """experiments.train.demonstrations (what the warm start trains on): component 1 at noise 0 keeps every
    reference answer, component 2 at 1.0 has one digit wrong in every one, component 3 (None) falls back to
    sft.noise = 0.5; the clean phase corrupts nothing."""
    from objbench.experiments.config import load_config
    from objbench.experiments.run.warmstart import demonstrations

    task = make_task("mixture", components=[ADD1, SUB2, MUL1], sft_noise=[0.0, 1.0, None])
    cfg = load_config(None, ["sft.noise=0.5"])
    probs = task.prompts(7919, 0, 3000)
    noisy = demonstrations(cfg, task, probs, random.Random(0), True)
    right = {d: [t == p.answer for p, t in zip(probs, noisy) if p.difficulty == d] for d in (1, 2, 3)}
    assert all(right[1]) and not any(right[2])
    assert 0.45 < sum(right[3]) / len(right[3]) < 0.55  # ~1000 draws at 0.5: sd 0.016
    for p, t in zip(probs, noisy):  # a corrupted answer differs in exactly one digit
        assert len(t) == len(p.answer) and sum(a != b for a, b in zip(t, p.answer)) <= 1
    clean = demonstrations(cfg, task, probs, random.Random(0), False)
    assert clean == [p.answer for p in probs]


def test_a_training_run_logs_per_component_metrics(tmp_path, monkeypatch):
    """A few steps of GRPO on a two-component mixture through the CLI (a YAML config): per-component accuracy,
    weight shares that sum to 1, per-component held-out pass rates."""
    from objbench.experiments.cli.main import main

    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    cfgfile = tmp_path / "mix.yaml"
    cfgfile.write_text(json.dumps({"task": {"name": "mixture", "components": [ADD1, SUB2], "sft_noise": [0.0, 1.0]}}))
    rc = main(["train", "--quiet", "--config", str(cfgfile), "sft.steps=60", "sft.until_acc=0", "sft.batch_size=32",
               "sft.noise_start=0.5", "train.steps=2", "train.eval_every=2", "train.eval_samples=2",
               "rollout.completions_per_step=32", f"out_dir={tmp_path}", "name=m"])
    assert rc == 0
    rows = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        assert "reward/acc_d1" in r or "reward/acc_d2" in r
        shares = [r[k] for k in ("adv/weight_share_d1", "adv/weight_share_d2")]
        assert all(v != v for v in shares) or sum(shares) == pytest.approx(1.0)
    evals = [json.loads(x) for x in (tmp_path / "m" / "eval.jsonl").read_text().splitlines()]
    assert {"eval/pass@1_d1", "eval/pass@1_d2"} <= set(evals[-1])


def test_a_whole_task_section_as_one_override_and_in_a_sweep_spec(tmp_path):
    """`task={...}` on the command line and `set: {task: {...}}` in a sweep spec replace the task (both were
    silently dropped before: the default arithmetic task trained instead)."""
    from objbench.experiments.config import load_config
    from objbench.experiments.sweeper.plan import load_sweep

    section = {"name": "mixture", "components": [ADD1, SUB2], "sft_noise": [0.1, None]}
    cfg = load_config(None, ["task=" + json.dumps(section), "task.weights=[2,1]"])
    assert cfg.task["name"] == "mixture" and cfg.task["sft_noise"] == [0.1, None] and cfg.task["weights"] == [2.0, 1.0]
    assert load_config(None, ["task=countdown"]).task["name"] == "countdown"
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"name": "s", "seeds": [0], "set": {"task": section},
                                "arms": {"a": {"objective.adv.scale": "none"}}}))
    (run,) = load_sweep(spec, out_dir=str(tmp_path)).runs
    assert run.cfg.task["name"] == "mixture" and len(run.cfg.task["components"]) == 2


def test_tasks_of_different_kinds_mix():
    """Arithmetic with countdown: each problem keeps its own verifier (a countdown expression is checked by
    safe_eval, never executed) and the length limits are the larger of the two."""
    from objbench.envs.countdown import CountdownTask

    t = make_task("mixture", components=[ADD1, {"name": "countdown", "eval_per_difficulty": 4}])
    cd = next(p for p in t.prompts(0, 0, 50) if p.difficulty == 2)
    assert isinstance(t.component(cd), CountdownTask)
    assert t.reward(cd, cd.answer).correct and not t.reward(cd, "__import__('os')").correct
    assert t.max_response_len() == max(c.max_response_len() for c in t.tasks)
    assert {p.difficulty for p in t.eval_set()} == {1, 2}

"""envs/scratchpad.py: the long-response task. Scratchpads worked out by hand, the grammar the verifier accepts,
the filler and step counts, the shared held-out rule, the response budget, bad settings; one short training run on
the character model and one on a model folder with a BPE tokenizer."""

import json
import random

import pytest

from objbench.envs import ArithmeticConfig, ArithmeticTask, make_task
from objbench.envs.scratchpad import ScratchpadConfig, ScratchpadTask, reference_length, scratchpad


def test_scratchpads_by_hand():
    # 47 + 85 = 132: 7+5+0 = 12 (write 2, carry 1), 4+8+1 = 13 (write 3, carry 1), carry-out 1: reversed "231"
    assert scratchpad(47, 85, 2) == (["7+5+0=12", "4+8+1=13"], "231")
    # 5017 + 2808 = 7825: 7+8 = 15, 1+0+1 = 02, 0+8+0 = 08, 5+2+0 = 07 -> "5287"
    assert scratchpad(5017, 2808, 4) == (["7+8+0=15", "1+0+1=02", "0+8+0=08", "5+2+0=07"], "5287")
    assert scratchpad(0, 3, 1) == (["0+3+0=03"], "3") and scratchpad(5, 7, 1) == (["5+7+0=12"], "21")
    t = ScratchpadTask()
    p = t.make_problem(47, 85)
    assert p.prompt == "47+85=" and p.answer == "231" and p.difficulty == 2
    assert t.sft_target(p, random.Random(0)).startswith("7+5+0=12 4+8+1=13#231")
    # at most 10d + 1 characters before the filler: 2 digits 8*2 + 1 + "#" + 3 = 21; 4 digits 32 + 3 + 1 + 5 = 41
    assert reference_length(2) == 21 and reference_length(4) == 41


def test_every_reference_completion_is_correct_and_its_answer_is_the_arithmetic_answer():
    t = ScratchpadTask(ScratchpadConfig(max_digits=5, difficulty_weights={1: 1, 2: 1, 3: 1, 4: 1, 5: 1}))
    rng = random.Random(0)
    for p in t.prompts(0, 0, 300) + t.eval_set():
        target = t.sft_target(p, rng)
        assert t.reward(p, target).correct and t.reward(p, target).reward == 1.0
        _, answer = scratchpad(*p.operands, p.difficulty)
        assert answer == p.answer == str(sum(p.operands))[::-1]
        assert len(target) + 1 <= t.max_response_len() and t.scratchpad_steps(target) == p.difficulty
        assert 0 <= t.filler_length(target) <= t.config.filler_demo_max


@pytest.mark.parametrize("text,correct,malformed", [
    ("7+5+0=12 4+8+1=13#231", True, False),
    ("7+5+0=12 4+8+1=13#231" + "." * 16, True, False),         # filler_max 16
    ("7+5+0=12#231", True, False),                             # the steps' number and content are not checked
    ("7+5+0=12 4+8+1=13 0+0+1=01#231", True, False),           # an extra step: free length
    ("1+1+0=99 4+8+1=13#231", True, False),                    # wrong working, right answer: correct (outcome)
    ("7+5+0=12 4+8+1=13#232", False, False),                   # wrong answer, well formed
    ("7+5+0=12 4+8+1=13#231" + "." * 17, False, True),         # too much filler
    ("231", False, True),                                      # no scratchpad
    ("7+5+0=12  4+8+1=13#231", False, True),                   # two separators
    ("7+5+2=12#231", False, True),                             # carry must be 0 or 1
    ("7+5+0=2#231", False, True),                              # the step's sum has two digits
    ("7+5+0=12 4+8+1=13#", False, True),                       # no answer
    ("7+5+0=12 4+8+1=13#231.x", False, True),
])
def test_the_grammar_the_verifier_accepts(text, correct, malformed):
    t = ScratchpadTask()
    r = t.reward(t.make_problem(47, 85), text)
    assert (r.correct, r.malformed) == (correct, malformed)
    assert (t.filler_length(text) is None) == malformed


def test_truncated_is_never_correct_and_non_text_is_malformed():
    t = ScratchpadTask()
    p = t.make_problem(47, 85)
    assert not t.reward(p, "7+5+0=12 4+8+1=13#231", truncated=True).correct
    assert t.reward(p, None).malformed and t.reward(p, "x" * 10_000).malformed
    assert t.scratchpad_steps("7+5+0=12 4+8+1=13 0+0+1=01#231") == 3 and t.scratchpad_steps("nope") is None


def test_the_verdict_follows_the_answer_and_the_grammar():
    t = ScratchpadTask(ScratchpadConfig(verdict=True, filler_max=8))
    p = t.make_problem(47, 85)
    assert t.interjection_marker == "/" and ScratchpadTask().interjection_marker is None
    assert t.sft_target(p, random.Random(0)).startswith("7+5+0=12 4+8+1=13#231/+")
    assert t.interjection(p, "7+5+0=12 4+8+1=13#231/") == "+"
    assert t.interjection(p, "7+5+0=12 4+8+1=13#232/") == "-"      # wrong answer
    assert t.interjection(p, "7+5+0=12 4+8+1=13231/") == "-"       # no "#": not a scratchpad
    assert t.interjection(p, "7+5+0=12#231") == "-"                 # no marker
    # a noisy demonstration's verdict is rewritten to match its (altered) answer; an altered step keeps "+"
    assert t.relabel(p, "7+5+0=12 4+8+1=13#232/+..") == "7+5+0=12 4+8+1=13#232/-.."
    assert t.relabel(p, "7+5+0=19 4+8+1=13#231/+..") == "7+5+0=19 4+8+1=13#231/+.."
    r = t.reward(p, "7+5+0=12 4+8+1=13#231/+...")
    assert r.correct and t.filler_length("7+5+0=12 4+8+1=13#231/+...") == 3
    assert t.reward(p, "7+5+0=12 4+8+1=13#231...").malformed  # the verdict is part of the grammar
    # budget: the first part is at most 10d + 1 characters plus the marker; then the verdict, filler and <eos>
    assert t.interjection_window() == 42 and t.max_response_len() == 41 + 2 + 8 + 1


def test_problems_and_held_out_set_are_the_arithmetic_tasks():
    t = ScratchpadTask(ScratchpadConfig(max_digits=3, difficulty_weights={2: 1, 3: 1}))
    a = ArithmeticTask(ArithmeticConfig(max_digits=3, ops="+", difficulty_weights={2: 1, 3: 1}))
    ours, theirs = t.prompts(3, 0, 50), a.prompts(3, 0, 50)
    assert [p.prompt for p in ours] == [p.prompt for p in theirs]
    assert all(p.uid.startswith("scratchpad:train:3:") for p in ours)
    # the eval set: the arithmetic task's held-out problems of the trained difficulties (2 and 3), in its order
    assert [p.prompt for p in t.eval_set()] == [p.prompt for p in a.eval_set() if p.difficulty > 1]
    assert {p.difficulty for p in t.eval_set()} == {2, 3} and len(t.eval_set()) == 48
    assert all(t.is_held_out(p) for p in t.eval_set()) and not any(t.is_held_out(p) for p in ours)
    assert t.difficulties == (2, 3)


@pytest.mark.parametrize("kwargs,needle", [
    ({"max_digits": 0}, "max_digits"),
    ({"difficulty_weights": {5: 1}}, "outside 1..max_digits"),
    ({"filler_demo_max": 20}, "filler_demo_max"),
    ({"filler_max": -1}, "filler_max"),
    ({"format_reward": 1.0}, "format_reward"),
    ({"max_completion_chars": 10}, "max_completion_chars"),
    ({"verdict": True, "filler_max": 0, "filler_demo_max": 0}, "verdict needs filler_max"),
    ({"verdict": "yes"}, "verdict must be a bool"),
])
def test_bad_settings_name_the_field(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        make_task("scratchpad", **kwargs)


def test_a_short_run_logs_long_responses_and_filler(tmp_path):
    from objbench.experiments.config import load_config
    from objbench.experiments.run.train import train

    cfg = load_config(None, ["task.name=scratchpad", "task.max_digits=2", "task.difficulty_weights={2: 1}",
                             "task.filler_max=4", "sft.steps=40", "train.steps=2", "train.eval_every=2",
                             "train.eval_samples=2", "rollout.completions_per_step=16", f"out_dir={tmp_path}",
                             "name=s"])
    run = train(cfg, progress=False)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("length/filler_gap" in r and "rollout/trunc_frac" in r for r in rows)
    assert all(r["length/mean"] >= 10 for r in rows)  # far beyond the arithmetic task's ~3.6 tokens


def test_a_model_folder_with_a_bpe_tokenizer_runs_the_task(tmp_path, monkeypatch):
    from objbench.experiments.cli.main import main
    from objbench.rollout.toy_hf import write_toy_model

    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    model = write_toy_model(tmp_path / "toy-qwen2")
    out = tmp_path / "runs"
    rc = main(["train", "--quiet", f"model.path={model}", "task.name=scratchpad", "task.max_digits=2",
               "task.difficulty_weights={2: 1}", "task.filler_max=4", "sft.steps=20", "sft.batch_size=16",
               "train.steps=2", "train.eval_every=2", "train.eval_samples=2", "rollout.completions_per_step=16",
               f"out_dir={out}", "name=b"])
    assert rc == 0
    rows = [json.loads(x) for x in (out / "b" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("length/filler_correct" in r for r in rows)


def test_a_short_run_with_the_verdict_interjects_it(tmp_path):
    import re

    from objbench.experiments.config import load_config
    from objbench.experiments.run.train import train

    cfg = load_config(None, ["task.name=scratchpad", "task.max_digits=1", "task.difficulty_weights={1: 1}",
                             "task.filler_max=4", "task.verdict=true", "sft.steps=150", "train.steps=2",
                             "train.eval_every=2", "train.eval_samples=2", "rollout.completions_per_step=16",
                             "train.log_samples=16", f"out_dir={tmp_path}", "name=v"])
    run = train(cfg, progress=False)
    texts = [json.loads(x)["response"] for x in (run / "samples.jsonl").read_text().splitlines()]
    marked = [t for t in texts if "/" in t]
    assert marked, texts  # 150 warm-start steps teach the marker
    assert all(re.search(r"/[+-]", t) for t in marked)  # the environment's verdict follows every marker

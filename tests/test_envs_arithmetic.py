import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from objbench.envs import make_task, task_spec
from objbench.envs.arithmetic import ArithmeticTask, format_answer, holdout_key, operand_range

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def task():
    return make_task("arithmetic")


# ------------------------------------------------------------------------------------------- canonical answers


def test_canonical_answer_form():
    assert format_answer(46, reverse=True) == "64"
    assert format_answer(100, reverse=True) == "001"  # trailing zeros of the number lead in reversed form
    assert format_answer(0, reverse=True) == "0"
    assert format_answer(-64, reverse=True) == "-46"  # sign first, then reversed digits
    assert format_answer(46, reverse=False) == "46"
    assert format_answer(-7, reverse=False) == "-7"


def test_make_problem_hand_values(task):
    p = task.make_problem(12, "+", 34)
    assert (p.prompt, p.answer, p.difficulty, p.op, p.operands, p.target) == ("12+34=", "64", 2, "+", (12, 34), 46)
    p = make_task("arithmetic", reverse_answer=False).make_problem(58, "+", 67)
    assert (p.prompt, p.answer) == ("58+67=", "125")
    p = make_task("arithmetic", ops=["-"]).make_problem(3, "-", 70)
    assert (p.prompt, p.answer, p.target) == ("3-70=", "-76", -67)
    p = make_task("arithmetic", ops=["*"]).make_problem(25, "*", 4)
    assert (p.answer, p.target) == ("001", 100)


# ------------------------------------------------------------------------------------------- the prompt stream


def test_problem_at_is_deterministic(task):
    first = [task.problem_at(3, i) for i in range(200)]
    again = [task.problem_at(3, i) for i in reversed(range(200))][::-1]  # order of calls does not matter
    other = make_task("arithmetic")  # a second object with the same settings
    assert first == again == [other.problem_at(3, i) for i in range(200)]
    assert task.prompts(3, 50, 20) == first[50:70]
    assert len({p.uid for p in first}) == 200
    assert [p.prompt for p in first] != [task.problem_at(4, i).prompt for i in range(200)]


def test_problem_at_does_not_depend_on_hash_seed(task):
    code = (
        "import json; from objbench.envs import make_task; t = make_task('arithmetic', ops=['+','-','*']); "
        "print(json.dumps([t.problem_at(7, i).prompt for i in range(100)] + [p.prompt for p in t.eval_set()]))"
    )
    expected = make_task("arithmetic", ops=["+", "-", "*"])
    want = [expected.problem_at(7, i).prompt for i in range(100)] + [p.prompt for p in expected.eval_set()]
    for hash_seed in ("1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(REPO))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert json.loads(out.stdout) == want


def test_difficulty_and_operands_agree(task):
    for p in task.prompts(0, 0, 2000):
        lo, hi = operand_range(p.difficulty)
        assert all(lo <= x <= hi for x in p.operands)
        assert p.prompt == f"{p.operands[0]}{p.op}{p.operands[1]}="
        assert p.answer == format_answer(p.target, reverse=True)
        assert p.target == p.operands[0] + p.operands[1]


def test_difficulty_mixture_matches_weights():
    task = make_task("arithmetic", ops=["+", "-", "*"], difficulty_weights={1: 0.25, 2: 0.5, 3: 0.25})
    problems = task.prompts(0, 0, 20_000)
    counts = Counter(p.difficulty for p in problems)
    for d, w in {1: 0.25, 2: 0.5, 3: 0.25}.items():
        assert abs(counts[d] / 20_000 - w) < 0.02  # binomial sd is <= 0.0036
    ops = Counter(p.op for p in problems)
    for op in "+-*":
        assert abs(ops[op] / 20_000 - 1 / 3) < 0.02


def test_zero_weight_difficulty_is_eval_only():
    task = make_task("arithmetic", max_digits=4, difficulty_weights={1: 1, 2: 1, 3: 0})
    assert task.difficulties == (1, 2, 3, 4)
    assert {p.difficulty for p in task.prompts(0, 0, 2000)} == {1, 2}
    assert Counter(p.difficulty for p in task.eval_set()) == {1: 24, 2: 24, 3: 24, 4: 24}


# -------------------------------------------------------------------------------------------- the held-out set


def test_eval_set_fixed_balanced_and_held_out(task):
    ev = task.eval_set()
    assert ev == make_task("arithmetic").eval_set()
    assert Counter(p.difficulty for p in ev) == {1: 24, 2: 24, 3: 24}
    assert len({p.prompt for p in ev}) == len(ev)
    assert all(task.is_held_out(p) for p in ev)
    assert all(p.uid.startswith("arithmetic:eval:") for p in ev)


@pytest.mark.parametrize("ops", [("+",), ("+", "-", "*")])
def test_eval_set_disjoint_from_training(ops):
    task = make_task("arithmetic", ops=list(ops))
    eval_keys = {holdout_key(*p.operands[:1], p.op, p.operands[1]) for p in task.eval_set()}
    eval_prompts = {p.prompt for p in task.eval_set()}
    for seed in (0, 1, 2) if len(ops) == 1 else (5,):
        for p in task.prompts(seed, 0, 20_000):
            assert not task.is_held_out(p)
            assert p.prompt not in eval_prompts
            # Not even the commuted twin of an eval problem (3+5 vs 5+3) is trained on.
            assert holdout_key(p.operands[0], p.op, p.operands[1]) not in eval_keys


def test_one_digit_split_leaves_most_pairs_for_training():
    task = make_task("arithmetic", ops=["+", "-", "*"])
    for op in "+-*":
        training = [(a, b) for a in range(10) for b in range(10) if not task._held_out(a, op, b)]
        assert len(training) >= 70
        pool = 100 - len(training)
        assert pool >= 24 // 3  # enough held-out pairs to fill that op's eval share
    drawn = {p.prompt for p in task.prompts(0, 0, 20_000) if p.difficulty == 1}
    assert len(drawn) >= 3 * 70  # the stream actually visits them


def test_eval_set_respects_size_setting():
    task = make_task("arithmetic", eval_per_difficulty=7, ops=["+", "*"], max_digits=2, difficulty_weights={1: 1, 2: 1})
    ev = task.eval_set()
    assert Counter((p.difficulty, p.op) for p in ev) == {(1, "+"): 4, (1, "*"): 3, (2, "+"): 4, (2, "*"): 3}


# ---------------------------------------------------------------------------------------------------- rewards


def test_reward_correct_and_wrong(task):
    p = task.make_problem(12, "+", 34)  # 46 -> "64"
    r = task.reward(p, "64")
    assert (r.reward, r.correct, r.format_ok, r.malformed) == (1.0, True, True, False)
    for wrong in ("46", "65", "640", "064", "-64", "0", "6"):
        r = task.reward(p, wrong)
        assert (r.reward, r.correct, r.format_ok, r.malformed) == (0.0, False, True, False), wrong


def test_reward_reversed_trailing_zero_is_significant():
    task = make_task("arithmetic")
    p = task.make_problem(55, "+", 45)  # 100 -> "001"
    assert task.reward(p, "001").correct
    assert not task.reward(p, "1").correct
    assert not task.reward(p, "100").correct
    normal = make_task("arithmetic", reverse_answer=False)
    q = normal.make_problem(12, "+", 34)
    assert normal.reward(q, "46").correct
    assert not normal.reward(q, "046").correct  # zero padding is not canonical


def test_reward_negative_answers():
    task = make_task("arithmetic", ops=["-"])
    p = task.make_problem(3, "-", 70)  # -67 -> "-76"
    assert task.reward(p, "-76").correct
    assert not task.reward(p, "76").correct
    assert task.reward(p, "76").format_ok
    assert task.reward(p, "--76").malformed
    assert task.reward(p, "76-").malformed


HOSTILE = [
    "",
    " 64",
    "64 ",
    "6 4",
    "+64",
    "64\n",
    "64<eos>",
    "0x40",
    "6.4",
    "-",
    "\uff16\uff14",  # fullwidth digits
    "\u0666\u0664",  # Arabic-Indic digits
    "9**9**9",
    "__import__('os').system('rm -rf /')",
    "(lambda: 1)()",
    "6" * 300,  # digits only, over the examination cap
    "x" * 1_000_000,
    "\x00",
    "\ud800",  # lone surrogate
]


@pytest.mark.parametrize("completion", HOSTILE, ids=range(len(HOSTILE)))
def test_reward_malformed_and_adversarial(task, completion):
    p = task.make_problem(12, "+", 34)
    for truncated in (False, True):
        r = task.reward(p, completion, truncated=truncated)
        assert (r.reward, r.correct, r.format_ok, r.malformed) == (0.0, False, False, True)


@pytest.mark.parametrize("bad", [None, b"64", 64, ["6", "4"], object()])
def test_reward_non_strings_do_not_crash(task, bad):
    r = task.reward(task.make_problem(12, "+", 34), bad)
    assert r.malformed and r.reward == 0.0


def test_reward_time_is_bounded(task):
    p = task.make_problem(12, "+", 34)
    huge = "1" * 10_000_000
    start = time.perf_counter()
    for _ in range(100):
        task.reward(p, huge)
    assert time.perf_counter() - start < 0.5


def test_truncated_is_never_correct(task):
    p = task.make_problem(12, "+", 34)
    r = task.reward(p, "64", truncated=True)
    assert (r.reward, r.correct, r.format_ok, r.malformed) == (0.0, False, False, False)
    fr = make_task("arithmetic", format_reward=0.1)
    r = fr.reward(p, "65", truncated=True)
    assert (r.reward, r.format_ok) == (0.0, False)  # no format credit for an unfinished answer


def test_format_reward(task):
    t = make_task("arithmetic", format_reward=0.1)
    p = t.make_problem(12, "+", 34)
    assert t.reward(p, "64").reward == 1.0
    assert t.reward(p, "65").reward == 0.1
    assert t.reward(p, "-65").reward == 0.1
    assert t.reward(p, "6a").reward == 0.0


def test_filler_is_ignored_and_bounded():
    t = make_task("arithmetic", filler_max=3)
    p = t.make_problem(12, "+", 34)
    for k in range(4):
        assert t.reward(p, "." * k + "64").correct
    r = t.reward(p, "....64")
    assert r.malformed and r.reward == 0.0  # more filler than filler_max
    assert t.reward(p, "...").malformed  # filler only
    assert t.reward(p, "").malformed
    assert t.reward(p, "64.").malformed  # filler only before the answer
    assert t.reward(p, ".6.4").malformed
    assert not t.reward(p, "..65").correct and t.reward(p, "..65").format_ok
    no_filler = make_task("arithmetic")
    assert no_filler.reward(p, ".64").malformed


def test_filler_after_the_answer():
    t = make_task("arithmetic", filler_max=3, filler_position="after")
    p = t.make_problem(12, "+", 34)
    for k in range(4):
        assert t.reward(p, "64" + "." * k).correct and t.filler_length("64" + "." * k) == k
    assert t.reward(p, "64....").malformed and t.filler_length("64....") is None  # more than filler_max
    assert t.reward(p, ".64").malformed  # filler only after the answer
    assert not t.reward(p, "65..").correct and t.reward(p, "65..").format_ok and t.filler_length("65..") == 2
    assert make_task("arithmetic", filler_max=3).filler_length("..64") == 2  # before
    assert make_task("arithmetic").filler_length("64") == 0 and make_task("arithmetic").filler_length("6x") is None


def test_filler_demo_max_and_bad_filler_settings():
    t = make_task("arithmetic", filler_max=32, filler_position="after", filler_demo_max=2)
    p = t.make_problem(12, "+", 34)
    rng = random.Random(0)
    assert {t.sft_target(p, rng) for _ in range(300)} == {"64", "64.", "64.."}  # 0..2 filler, after the answer
    assert t.max_response_len() == 32 + 4 + 1  # the room to grow is filler_max
    for bad, match in (({"filler_max": 3, "filler_position": "middle"}, "filler_position"),
                       ({"filler_max": 3, "filler_demo_max": 4}, "filler_demo_max"),
                       ({"filler_position": "after"}, "read only with filler_max > 0"),
                       ({"filler_demo_max": 0}, "read only with filler_max > 0")):
        with pytest.raises(ValueError, match=match):
            make_task("arithmetic", **bad)


def test_verdict_format_interjection_and_relabel():
    t = make_task("arithmetic", filler_max=3, filler_position="after", verdict=True, filler_demo_max=1)
    p = t.make_problem(12, "+", 34)  # answer "64" (reversed 46)
    assert t.interjection_marker == "=" and t.interjection_window() == 4 + 1  # 999+999 = 1998: 4 digits + "="
    assert t.interjection(p, "64=") == "+" and t.interjection(p, "65=") == "-" and t.interjection(p, "6=") == "-"
    assert t.reward(p, "64=+..").correct and t.filler_length("64=+..") == 2
    assert not t.reward(p, "65=-.").correct and t.reward(p, "65=-.").format_ok and t.filler_length("65=-.") == 1
    for bad in ("64", "64..", "64=", "64=+....", "64=x.", "64.=+"):  # no verdict, too much filler, junk
        assert t.reward(p, bad).malformed, bad
    rng = random.Random(0)
    assert {t.sft_target(p, rng) for _ in range(200)} == {"64=+", "64=+."}
    assert t.relabel(p, "65=+.") == "65=-." and t.relabel(p, "64=+.") == "64=+."  # a noisy demonstration
    assert t.max_response_len() == 3 + 4 + 2 + 1  # filler, answer, "=" and verdict, <eos>
    assert make_task("arithmetic", filler_max=3, filler_position="after").interjection_marker is None
    for bad in ({"verdict": True}, {"filler_max": 3, "verdict": True}, {"filler_max": 3, "filler_position": "after",
                                                                        "verdict": 1}):
        with pytest.raises(ValueError, match="verdict"):
            make_task("arithmetic", **bad)


# ------------------------------------------------------------------------------------ SFT targets and lengths


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"ops": ["+", "-", "*"], "max_digits": 4, "difficulty_weights": {1: 1, 2: 1, 3: 1, 4: 1}},
        {"filler_max": 5, "reverse_answer": False},
        {"filler_max": 3, "ops": ["-"], "format_reward": 0.2},
    ],
)
def test_sft_targets_earn_full_reward_and_fit(settings):
    task = make_task("arithmetic", **settings)
    rng = random.Random(0)
    budget = task.max_response_len()
    for p in task.prompts(0, 0, 2000) + task.eval_set():
        target = task.sft_target(p, rng)
        assert task.reward(p, target).reward == 1.0
        assert len(target) + 1 <= budget  # + <eos>
        assert len(p.prompt) <= task.max_prompt_len()


def test_max_response_len_hand_values():
    # 999+999=1998 (4), 999*999=998001 (6), 100-999=-899 (4); plus filler and <eos>.
    assert make_task("arithmetic").max_response_len() == 4 + 1
    assert make_task("arithmetic", ops=["*"]).max_response_len() == 6 + 1
    assert make_task("arithmetic", ops=["-"]).max_response_len() == 4 + 1
    assert make_task("arithmetic", ops=["-"], max_digits=1, difficulty_weights={1: 1}).max_response_len() == 2 + 1
    assert make_task("arithmetic", filler_max=7).max_response_len() == 7 + 4 + 1
    assert make_task("arithmetic").max_prompt_len() == 8


def test_sft_filler_counts_are_uniform():
    task = make_task("arithmetic", filler_max=3)
    p = task.make_problem(12, "+", 34)
    rng = random.Random(0)
    counts = Counter(len(task.sft_target(p, rng)) - 2 for _ in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(abs(c / 4000 - 0.25) < 0.04 for c in counts.values())
    # the rng passed in decides: same rng state, same targets
    assert [task.sft_target(p, random.Random(5)) for _ in range(3)] == [task.sft_target(p, random.Random(5))] * 3


def test_spec_round_trip():
    task = make_task("arithmetic", ops=["+", "*"], difficulty_weights={"1": 1, "2": 3}, max_digits=2, filler_max=2)
    spec = task_spec(task)
    assert spec["difficulty_weights"] == [[1, 1.0], [2, 3.0]]
    rebuilt = make_task(**json.loads(json.dumps(spec)))
    assert isinstance(rebuilt, ArithmeticTask)
    assert rebuilt.config == task.config
    assert rebuilt.problem_at(0, 9) == task.problem_at(0, 9)


def test_eval_set_prefix_is_balanced():
    task = make_task("arithmetic", ops="+-*")
    ev = task.eval_set()
    assert [p.difficulty for p in ev[:6]] == [1, 2, 3, 1, 2, 3]
    prefix = ev[:36]
    assert Counter(p.difficulty for p in prefix) == {1: 12, 2: 12, 3: 12}
    assert Counter(p.op for p in prefix) == {"+": 12, "-": 12, "*": 12}

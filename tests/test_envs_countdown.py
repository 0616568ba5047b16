import random
from collections import Counter

import pytest

from objbench.envs import NumericProblem, make_task
from objbench.envs.safe_eval import safe_eval


@pytest.fixture(scope="module")
def task():
    return make_task("countdown")


def _problem(numbers, target):
    return NumericProblem("t", " ".join(map(str, numbers)) + f"#{target}=", "", len(numbers),
                          op="countdown", operands=tuple(numbers), target=target)


def test_stream_is_deterministic_and_well_formed(task):
    first = task.prompts(0, 0, 300)
    assert first == make_task("countdown").prompts(0, 0, 300)
    for p in first:
        assert p.difficulty == len(p.operands) in task.difficulties
        assert all(1 <= x <= 9 for x in p.operands)
        assert 1 <= p.target <= 99
        assert p.prompt == " ".join(map(str, p.operands)) + f"#{p.target}="
        r = safe_eval(p.answer)
        assert r.value == p.target
        assert Counter(r.literals) == Counter(p.operands)  # the reference uses every number once


def test_mixture_and_eval_set(task):
    counts = Counter(p.difficulty for p in task.prompts(1, 0, 4000))
    for d, w in {2: 0.25, 3: 0.5, 4: 0.25}.items():
        assert abs(counts[d] / 4000 - w) < 0.04
    ev = task.eval_set()
    assert ev == make_task("countdown").eval_set()
    assert Counter(p.difficulty for p in ev) == {2: 24, 3: 24, 4: 24}
    assert all(task.is_held_out(p) for p in ev)


def test_eval_disjoint_from_training(task):
    keys = {(tuple(sorted(p.operands)), p.target) for p in task.eval_set()}
    for seed in (0, 1):
        for p in task.prompts(seed, 0, 5000):
            assert (tuple(sorted(p.operands)), p.target) not in keys


def test_reward_hand_cases(task):
    p = _problem((2, 3, 4), 6)
    assert task.reward(p, "4/(2/3)").correct  # fractional intermediate, exact result
    assert task.reward(p, "2*3").correct  # not every number must be used
    assert task.reward(p, "(4-2)*3").correct
    r = task.reward(p, "2+3")
    assert (r.reward, r.format_ok, r.malformed) == (0.0, True, False)
    assert task.reward(p, " 2 * 3 ").correct  # spaces are allowed inside and around expressions
    for bad in ("3+3", "2*3*1", "6", "-2+4+4", "-(2-3)*4+2", "2**3", "4/(2-2)", "", "2*3=", "x"):
        r = task.reward(p, bad)
        assert (r.reward, r.correct, r.format_ok, r.malformed) == (0.0, False, False, True), bad


def test_repeated_numbers_may_be_used_as_often_as_given(task):
    p = _problem((3, 3, 5), 11)
    assert task.reward(p, "3+3+5").correct
    assert task.reward(p, "3+3+5+3").malformed


def test_truncated_and_format_reward():
    t = make_task("countdown", format_reward=0.1)
    p = _problem((2, 3, 4), 6)
    assert t.reward(p, "2+3").reward == 0.1
    assert t.reward(p, "2*3").reward == 1.0
    r = t.reward(p, "2*3", truncated=True)
    assert (r.reward, r.correct, r.format_ok, r.malformed) == (0.0, False, False, False)
    assert t.reward(p, "9**9**9").reward == 0.0
    assert t.reward(p, None).malformed
    assert t.reward(p, "1" * 1_000_000).malformed


@pytest.mark.parametrize(
    "settings",
    [{}, {"ops": ["+", "-", "*", "/"], "max_numbers": 6, "max_number": 25, "difficulty_weights": {4: 1, 6: 1}}],
)
def test_sft_targets_earn_full_reward_and_fit(settings):
    task = make_task("countdown", **settings)
    rng = random.Random(0)
    for p in task.prompts(0, 0, 500) + task.eval_set():
        target = task.sft_target(p, rng)
        assert task.reward(p, target).reward == 1.0
        assert len(target) + 1 <= task.max_response_len()
        assert len(p.prompt) <= task.max_prompt_len()

"""Multi-digit addition written as a scratchpad: the long-response task of the fast toy path.

Prompt "a+b=" as in the arithmetic task (both operands of d digits for difficulty d). The completion works the sum
digit by digit, least significant first, one step per digit, then writes the answer, then optional filler:

    47+85=   ->   7+5+0=12 4+8+1=13#231..

- Step i is "x+y+c=s": x and y the i-th digits of a and b from the right, c the carry into the digit (0 or 1), s
  the two-digit sum x + y + c with a leading zero ("05"); the carry into the next step is the first digit of s.
- "#" ends the scratchpad; the answer is the sum's digits least significant first (the arithmetic task's reversed
  form: 132 -> "231"), the carry-out digit included.
- Then 0..filler_max "." characters the verifier ignores (the length-bias studies' free length: the answer is
  written when the length is picked), and <eos>.

A d-digit problem's reference completion has 10d characters before the filler, 10d + 1 with a carry-out (2 digits:
20-21 tokens, 4 digits: 40-41), so responses are 20-80 tokens long with filler, against ~3.6 in the arithmetic
task.

With ``verdict=True`` the policy ends its answer with "/", the environment appends "+" (the scratchpad is well
formed and its answer right) or "-", and the policy goes on with the filler and <eos>: "...#231/+..". As in the
arithmetic task's verdict, the environment's character is not the policy's (the training loop keeps it out of the
loss): the length-bias study's positive control, where correctness is visible when the length is picked.

Verifier: the completion must have the grammar above (one or more steps of the form "x+y+c=s" with single digits x,
y, a carry 0 or 1 and a two-digit s, separated by single spaces; "#"; digits; filler); it is correct when the
answer equals the reference. The steps are the policy's working: their content is not checked, and their number is
free (a policy may write more steps than digits, or fewer), so response length can drift in the scratchpad as well
as in the filler. Truncated completions (no <eos> within max_response_len) are never correct: with the longest
reference completion as the budget, a policy that writes extra steps runs out of room, which is how a runaway
response shows (rollout/trunc_frac). Problems and the held-out rule are the arithmetic task's for op "+" (the same
problems are held out in both tasks); the eval set is the arithmetic task's for the trained difficulties only
(difficulties with positive weight): in a pilot the tiny model never answered an untrained 1-digit problem in the
scratchpad form (greedy 0/24) while it solved every held-out 2-4-digit one, so untrained difficulties would only
put a constant floor under every eval metric.
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass

from .arithmetic import VERDICTS, ArithmeticConfig, ArithmeticTask
from .base import (
    DEFAULT_MAX_COMPLETION_CHARS,
    NumericProblem,
    Problem,
    RewardResult,
    Task,
    check_format_reward,
    check_int,
    normalize_weights,
    pattern_result,
    relabel_verdict,
)

STEP_SEPARATOR = " "
ANSWER_MARK = "#"
FILLER = "."
VERDICT_MARK = "/"  # the policy ends its answer with it (verdict=True); the environment then appends VERDICTS
_STEP = r"[0-9]\+[0-9]\+[01]=[0-9]{2}"


@dataclass(frozen=True)
class ScratchpadConfig:
    """Settings of the scratchpad task (lists and dicts are accepted and stored as tuples)."""

    max_digits: int = 4
    """Largest difficulty (operand digits)."""
    difficulty_weights: tuple[tuple[int, float], ...] = ((2, 1 / 3), (3, 1 / 3), (4, 1 / 3))
    """Training mixture over difficulties (forms as in the arithmetic task); the default keeps every reference
    completion >= 21 tokens."""
    filler_max: int = 16
    """Filler "." characters allowed after the answer; 0 = none."""
    filler_demo_max: int = 2
    """Warm-start demonstrations draw their filler count from 0..filler_demo_max (<= filler_max): RL starts short,
    with room to grow."""
    format_reward: float = 0.0
    """Reward of a well-formed, finished but wrong completion (0 <= format_reward < 1)."""
    holdout_modulus: int = 4
    """As in the arithmetic task: a problem is held out when its stable hash % holdout_modulus == 0."""
    eval_per_difficulty: int = 24
    """Eval-set problems per difficulty."""
    max_completion_chars: int = DEFAULT_MAX_COMPLETION_CHARS
    """Completions longer than this are malformed without being examined further."""
    verdict: bool = False
    """The environment writes "+" / "-" after the policy's "/" that ends its answer, before the filler (module
    docstring); needs filler_max > 0."""

    def __post_init__(self) -> None:
        check_int("max_digits", self.max_digits, low=1, high=9)
        weights = normalize_weights(self.difficulty_weights, first=1)
        for k, _ in weights:
            if not 1 <= k <= self.max_digits:
                raise ValueError(f"difficulty_weights: difficulty {k} outside 1..max_digits={self.max_digits}")
        if sum(w for _, w in weights) <= 0:
            raise ValueError(f"difficulty_weights must have a positive sum, got {self.difficulty_weights!r}")
        object.__setattr__(self, "difficulty_weights", weights)
        check_int("filler_max", self.filler_max, low=0, high=128)
        check_int("filler_demo_max", self.filler_demo_max, low=0, high=self.filler_max)
        object.__setattr__(self, "format_reward", check_format_reward(self.format_reward))
        check_int("holdout_modulus", self.holdout_modulus, low=2, high=1_000_000)
        check_int("eval_per_difficulty", self.eval_per_difficulty, low=1, high=100_000)
        check_int("max_completion_chars", self.max_completion_chars, low=1, high=100_000)
        if not isinstance(self.verdict, bool):
            raise ValueError(f"verdict must be a bool, got {self.verdict!r}")
        if self.verdict and self.filler_max == 0:
            raise ValueError("verdict needs filler_max > 0: it tells the policy whether its answer is right before "
                             "it writes the filler")
        if reference_length(self.max_digits) + self.filler_max > self.max_completion_chars:
            raise ValueError(f"max_completion_chars={self.max_completion_chars} is shorter than the longest "
                             f"reference completion ({reference_length(self.max_digits) + self.filler_max} chars)")


def reference_length(digits: int) -> int:
    """The most characters of a d-digit problem's reference completion without filler: d steps of 8, d - 1
    separators, "#", and an answer of d + 1 digits at most: 10d + 1."""
    return 8 * digits + (digits - 1) + 1 + digits + 1


def scratchpad(a: int, b: int, digits: int) -> tuple[list[str], str]:
    """The steps of a + b over ``digits`` digit positions and the reversed answer. 47 + 85 over 2 digits:
    (["7+5+0=12", "4+8+1=13"], "231")."""
    steps, out, carry = [], [], 0
    for i in range(digits):
        x, y = a // 10 ** i % 10, b // 10 ** i % 10
        s = x + y + carry
        steps.append(f"{x}+{y}+{carry}={s:02d}")
        out.append(str(s % 10))
        carry = s // 10
    if carry:
        out.append("1")
    return steps, "".join(out)


class ScratchpadTask(Task):
    name = "scratchpad"

    def __init__(self, config: ScratchpadConfig | None = None) -> None:
        self.config = cfg = config if config is not None else ScratchpadConfig()
        self.difficulties = tuple(d for d, w in cfg.difficulty_weights if w > 0)  # trained and evaluated
        self._problems = ArithmeticTask(ArithmeticConfig(
            max_digits=cfg.max_digits, ops=("+",), difficulty_weights=cfg.difficulty_weights,
            holdout_modulus=cfg.holdout_modulus, eval_per_difficulty=cfg.eval_per_difficulty))
        worked = rf"(?P<pad>{_STEP}(?:{re.escape(STEP_SEPARATOR)}{_STEP})*){re.escape(ANSWER_MARK)}(?P<answer>[0-9]+)"
        verdict = re.escape(VERDICT_MARK) + "[%s]" % re.escape("".join(VERDICTS.values())) if cfg.verdict else ""
        self._worked_re = re.compile(worked)
        self._completion_re = re.compile(worked + verdict + rf"(?P<filler>{re.escape(FILLER)}{{0,{cfg.filler_max}}})")

    def __repr__(self) -> str:
        return f"ScratchpadTask({self.config!r})"

    def _own(self, p: Problem) -> Problem:
        return dataclasses.replace(p, uid=p.uid.replace("arithmetic:", f"{self.name}:", 1))

    def problem_at(self, seed: int, index: int) -> Problem:
        return self._own(self._problems.problem_at(seed, index))

    def eval_set(self) -> list[Problem]:
        return [self._own(p) for p in self._problems.eval_set() if p.difficulty in self.difficulties]

    def is_held_out(self, problem: Problem) -> bool:
        return self._problems.is_held_out(problem)

    def make_problem(self, a: int, b: int, uid: str = "custom") -> NumericProblem:
        """The problem a + b (tests, probes)."""
        return self._problems.make_problem(a, "+", b, uid=uid)

    def reward(self, problem: Problem, completion: str, truncated: bool = False) -> RewardResult:
        """Correct when the completion has the scratchpad grammar and its answer equals the reference (module
        docstring); truncated completions are never correct."""
        return pattern_result(self._completion_re, problem.answer, completion, truncated, self.config.max_completion_chars,
                              self.config.format_reward)

    def sft_target(self, problem: Problem, rng: random.Random) -> str:
        a, b = problem.operands
        steps, answer = scratchpad(a, b, problem.difficulty)
        n = rng.randint(0, self.config.filler_demo_max)
        verdict = VERDICT_MARK + VERDICTS[True] if self.config.verdict else ""
        return STEP_SEPARATOR.join(steps) + ANSWER_MARK + answer + verdict + FILLER * n

    # ------------------------------------------------------------------- the verdict (verdict=True only)

    @property
    def interjection_marker(self) -> str | None:
        """The text that ends the policy's first part; the environment then appends interjection(...)."""
        return VERDICT_MARK if self.config.verdict else None

    def interjection_window(self) -> int:
        """The most tokens of the first part, marker included."""
        return reference_length(self.config.max_digits) + 1

    def interjection(self, problem: Problem, first_part: str) -> str:
        """The verdict on a first part ending in the marker: "+" when it is a well-formed scratchpad whose answer
        is right, else "-"."""
        m = self._worked_re.fullmatch(first_part[:-1]) if first_part.endswith(VERDICT_MARK) else None
        return VERDICTS[m is not None and m.group("answer") == problem.answer]

    def relabel(self, problem: Problem, text: str) -> str:
        """A demonstration whose digits were altered (noisy warm start) with the verdict the environment would
        write for it; unchanged without a verdict."""
        if not self.config.verdict:
            return text
        return relabel_verdict(text, VERDICT_MARK, lambda first: self.interjection(problem, first))

    def filler_length(self, completion: str) -> int | None:
        """Filler characters of a well-formed completion; None when it is malformed."""
        m = self._completion_re.fullmatch(completion) if isinstance(completion, str) else None
        return None if m is None else len(m.group("filler"))

    def scratchpad_steps(self, completion: str) -> int | None:
        """Steps written in a well-formed completion; None when it is malformed."""
        m = self._completion_re.fullmatch(completion) if isinstance(completion, str) else None
        return None if m is None else m.group("pad").count(STEP_SEPARATOR) + 1

    def max_response_len(self) -> int:
        verdict = 2 if self.config.verdict else 0  # "/" and the verdict
        return reference_length(self.config.max_digits) + verdict + self.config.filler_max + 1  # + <eos>

    def max_prompt_len(self) -> int:
        return 2 * self.config.max_digits + 2

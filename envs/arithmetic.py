"""Integer arithmetic with verifiable answers: prompt "a+b=", completion the answer.

Difficulty is the number of digits of both operands: difficulty 1 draws each operand from 0..9, difficulty
d >= 2 from 10^(d-1)..10^d - 1. The training stream draws the difficulty from `difficulty_weights`, then the
operation uniformly from `ops`, then the operands uniformly.

Answer format (the canonical form; the verifier compares strings exactly):
- the digits of |a op b| without leading zeros ("0" for zero), written REVERSED (least significant digit first)
  when `reverse_answer` is True (the default), preceded by "-" when the result is negative. 46 -> "64",
  100 -> "001", -64 -> "-46". Reversed answers make addition learnable for tiny causal transformers: the model
  emits the digit whose carry it has just computed, instead of having to plan the carry chain ahead
  (Lee et al., 2023, "Teaching Arithmetic to Small Transformers"). Set `reverse_answer=False` for normal order.
- Because the form is canonical, zero padding is wrong, not "equivalent": for 46, "064" (reversed mode) or "046"
  (normal mode) is a well-formed but incorrect answer. In reversed mode a leading "0" is legitimate exactly when
  the result ends in 0 (100 -> "001").
- Subtraction may give negative results (a and b are drawn independently); the sign comes first.
- With `filler_max > 0` the completion may hold 0..filler_max filler characters "." before the answer
  (`filler_position="before"`, the default) or after it (`"after"`); the verifier ignores them and the SFT
  target draws their count uniformly from 0..filler_demo_max (default filler_max). More than filler_max filler
  characters is malformed. This makes length a free choice for the length-bias study: after the answer, the
  policy has already written the answer when it chooses the filler length, so the length can depend on it.
- With `verdict=True` (filler after the answer only) the environment tells the policy whether its answer is right
  before the filler: the policy ends its answer with "=", the environment appends "+" (correct) or "-" (wrong),
  and the policy goes on with the filler and <eos>: "64=+..". The verdict is the environment's token, not the
  policy's: the training loop excludes it from the loss (experiments/train.py, rollout). The length-bias study's
  positive control: correctness is visible when the length is chosen.

Held-out rule: a problem is held out when `crc32("arithmetic|holdout|" + key) % holdout_modulus == 0`, where key
is "a<op>b" with the operands sorted for the commutative + and * (so 3+5 and 5+3 share their fate). Training
draws that land on a held-out problem redraw the operands (same difficulty and op, so the mixture is exact). The
eval set is a fixed sample of the held-out pool, `eval_per_difficulty` problems for every difficulty 1..max_digits
(split evenly over ops), so it is disjoint from every training problem of every seed and does not depend on the
data seed. It is ordered round-robin over difficulties (and over ops within a difficulty), so any prefix of it is
balanced too. With the default modulus 4 about a quarter of the 100 one-digit pairs are held out and three quarters
stay for training. The eval set covers every difficulty up to max_digits even when the training mixture gives some
of them weight 0, which measures length generalisation.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .base import (
    DEFAULT_MAX_COMPLETION_CHARS,
    NumericProblem,
    Problem,
    RewardResult,
    Task,
    check_format_reward,
    check_int,
    interleave,
    normalize_ops,
    normalize_weights,
    pattern_result,
    relabel_verdict,
    stable_hash,
    stream_rng,
)

OPS: tuple[str, ...] = ("+", "-", "*")
FILLER = "."
FILLER_POSITIONS = ("before", "after")
VERDICT_MARK = "="                   # the policy ends its answer with it (task.verdict)
VERDICTS = {True: "+", False: "-"}   # what the environment appends: right / wrong

# Enumerate a (difficulty, op) space exactly when it has at most this many operand pairs; sample above it.
_ENUMERATE_LIMIT = 100_000
# A redraw loop never needs more than a handful of tries (the held-out share is 1/holdout_modulus <= 1/2).
_MAX_REDRAWS = 10_000


@dataclass(frozen=True)
class ArithmeticConfig:
    """Settings of the arithmetic task. Lists and dicts are accepted and stored as tuples (hashable, frozen)."""

    max_digits: int = 3
    """Largest difficulty (operand digits). The eval set covers 1..max_digits."""
    ops: tuple[str, ...] = ("+",)
    """Operations drawn uniformly: any non-empty subset of "+", "-", "*" (a string "+-*" is accepted)."""
    difficulty_weights: tuple[tuple[int, float], ...] = ((1, 0.25), (2, 0.5), (3, 0.25))
    """Training mixture over difficulties: a mapping, (difficulty, weight) pairs, or a flat list of weights of
    difficulties 1, 2, ...; normalised by the sum. The default was measured with the "tiny" policy (2 layers,
    0.13M parameters), SFT 800 steps x 64 at lr 3e-3, greedy accuracy on held-out problems, seeds 0-2:
    1-digit 0.92-1.0, 2-digit 0.78-0.99, 3-digit 0.005-0.125, so RL starts at intermediate accuracy with the
    3-digit problems as headroom. Heavier 3-digit mixtures were erratic ({1: .1, 2: .3, 3: .6}: 3-digit 0.86 for
    seed 0, nothing learnt at all for seed 1); 300 steps at lr 1e-3 learns almost nothing with any mixture."""
    reverse_answer: bool = True
    """Write the answer's digits least significant first (see module docstring)."""
    filler_max: int = 0
    """Completions may hold 0..filler_max filler "." characters that the verifier ignores; 0 = none."""
    filler_position: str = field(default="before", metadata={"absent_means": "before"})  # added later: see
    """Where the filler goes: before | after the answer (read only with filler_max > 0)."""
    filler_demo_max: int | None = field(default=None, metadata={"absent_means": None})  # added later
    """SFT targets draw their filler count from 0..filler_demo_max, <= filler_max; unset = filler_max (read only
    with filler_max > 0). A small value starts RL with short filler and leaves room to grow."""
    format_reward: float = 0.0
    """Reward of a well-formed, finished but wrong answer (0 <= format_reward < 1). A correct answer earns 1.0."""
    holdout_modulus: int = 4
    """A problem is held out when its stable hash % holdout_modulus == 0 (1/modulus of each space)."""
    eval_per_difficulty: int = 24
    """Eval-set problems per difficulty (fewer only if a tiny held-out pool has fewer)."""
    max_completion_chars: int = DEFAULT_MAX_COMPLETION_CHARS
    """Completions longer than this are malformed without being examined further."""

    verdict: bool = field(default=False, metadata={"absent_means": False})  # added later
    """The environment writes "+" / "-" (right / wrong) after the policy's "=" that ends its answer, before the
    filler (see module docstring); needs filler_position=after."""

    def __post_init__(self) -> None:
        _set = object.__setattr__  # normalise in place on a frozen dataclass
        check_int("max_digits", self.max_digits, low=1, high=18)
        _set(self, "ops", normalize_ops(self.ops, OPS))
        weights = normalize_weights(self.difficulty_weights, first=1)
        for k, _ in weights:
            if not 1 <= k <= self.max_digits:
                raise ValueError(
                    f"difficulty_weights: difficulty {k} outside 1..max_digits={self.max_digits}"
                )
        if sum(w for _, w in weights) <= 0:
            raise ValueError(f"difficulty_weights must have a positive sum, got {self.difficulty_weights!r}")
        _set(self, "difficulty_weights", weights)
        if not isinstance(self.reverse_answer, bool):
            raise ValueError(f"reverse_answer must be a bool, got {self.reverse_answer!r}")
        check_int("filler_max", self.filler_max, low=0, high=128)
        if self.filler_position not in FILLER_POSITIONS:
            raise ValueError(f"filler_position must be one of {list(FILLER_POSITIONS)}, got {self.filler_position!r}")
        if self.filler_demo_max is not None:
            check_int("filler_demo_max", self.filler_demo_max, low=0, high=self.filler_max)
        if not isinstance(self.verdict, bool):
            raise ValueError(f"verdict must be a bool, got {self.verdict!r}")
        if self.verdict and (self.filler_max == 0 or self.filler_position != "after"):
            raise ValueError("verdict needs filler after the answer (filler_max > 0, filler_position=after): it "
                             "tells the policy whether its answer is right before it writes the filler")
        if self.filler_max == 0 and (self.filler_position != "before" or self.filler_demo_max is not None):
            raise ValueError("filler_position and filler_demo_max are read only with filler_max > 0 (no filler "
                             "otherwise); set filler_max or leave them at their defaults")
        _set(self, "format_reward", check_format_reward(self.format_reward))
        check_int("holdout_modulus", self.holdout_modulus, low=2, high=1_000_000)
        check_int("eval_per_difficulty", self.eval_per_difficulty, low=1, high=100_000)
        check_int("max_completion_chars", self.max_completion_chars, low=1, high=100_000)
        longest = self.filler_max + _longest_answer(self.max_digits, self.ops) + 2 * self.verdict
        if longest > self.max_completion_chars:
            raise ValueError(
                f"max_completion_chars={self.max_completion_chars} is shorter than the longest reference "
                f"completion ({longest} chars)"
            )


def operand_range(difficulty: int) -> tuple[int, int]:
    """Inclusive operand range of a difficulty: 1 -> (0, 9), d -> (10^(d-1), 10^d - 1)."""
    return (0 if difficulty == 1 else 10 ** (difficulty - 1), 10**difficulty - 1)


def apply_op(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown op {op!r}")


def format_answer(value: int, reverse: bool) -> str:
    """Canonical answer text of an integer: sign first, then the digits of |value| (reversed if asked)."""
    digits = str(abs(value))
    if reverse:
        digits = digits[::-1]
    return ("-" if value < 0 else "") + digits


def _longest_answer(max_digits: int, ops: Sequence[str]) -> int:
    # |a op b| is largest at the ends of the operand ranges, so the four corner pairs bound every answer length.
    best = 0
    for d in range(1, max_digits + 1):
        lo, hi = operand_range(d)
        for op in ops:
            for a in (lo, hi):
                for b in (lo, hi):
                    best = max(best, len(format_answer(apply_op(a, op, b), reverse=False)))
    return best


def holdout_key(a: int, op: str, b: int) -> str:
    """The text hashed by the held-out rule; + and * are commutative, so their operands are sorted."""
    if op in ("+", "*") and a > b:
        a, b = b, a
    return f"{a}{op}{b}"


class ArithmeticTask(Task):
    name = "arithmetic"

    def __init__(self, config: ArithmeticConfig | None = None) -> None:
        self.config = config if config is not None else ArithmeticConfig()
        cfg = self.config
        self.difficulties = tuple(range(1, cfg.max_digits + 1))
        # Training mixture: only difficulties with positive weight are drawn.
        self._train_difficulties = tuple(k for k, w in cfg.difficulty_weights if w > 0)
        self._train_weights = tuple(w for _, w in cfg.difficulty_weights if w > 0)
        filler, answer = r"(?P<filler>\.{0,%d})" % cfg.filler_max, r"(?P<answer>-?[0-9]+)"
        if cfg.verdict:
            answer += re.escape(VERDICT_MARK) + "[%s]" % re.escape("".join(VERDICTS.values()))
        self._answer_re = re.compile(answer + filler if cfg.filler_position == "after" else filler + answer)
        self._eval_cache: tuple[Problem, ...] | None = None

    def __repr__(self) -> str:
        return f"ArithmeticTask({self.config!r})"

    # ----------------------------------------------------------------------------------------------- problems

    def _make(self, uid: str, a: int, op: str, b: int, difficulty: int) -> Problem:
        value = apply_op(a, op, b)
        return NumericProblem(
            uid=uid,
            prompt=f"{a}{op}{b}=",
            answer=format_answer(value, self.config.reverse_answer),
            difficulty=difficulty,
            op=op,
            operands=(a, b),
            target=value,
        )

    def make_problem(self, a: int, op: str, b: int, uid: str = "custom") -> Problem:
        """A problem for given operands (tests, probes); difficulty is the digit count of the larger operand."""
        for name, x in (("a", a), ("b", b)):
            if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                raise ValueError(f"{name} must be a non-negative int, got {x!r}")
        if op not in OPS:
            raise ValueError(f"op: unknown op {op!r}; valid ops are {OPS}")
        return self._make(uid, a, op, b, max(len(str(a)), len(str(b))))

    def _held_out(self, a: int, op: str, b: int) -> bool:
        return stable_hash("arithmetic|holdout|" + holdout_key(a, op, b)) % self.config.holdout_modulus == 0

    def is_held_out(self, problem: Problem) -> bool:
        a, b = problem.operands
        return self._held_out(a, problem.op, b)

    def problem_at(self, seed: int, index: int) -> Problem:
        rng = stream_rng(self.name, seed, index)
        difficulty = rng.choices(self._train_difficulties, weights=self._train_weights)[0]
        op = rng.choice(self.config.ops)
        lo, hi = operand_range(difficulty)
        for _ in range(_MAX_REDRAWS):
            a, b = rng.randint(lo, hi), rng.randint(lo, hi)
            if not self._held_out(a, op, b):
                return self._make(f"{self.name}:train:{seed}:{index}", a, op, b, difficulty)
        raise RuntimeError(f"no training problem found for difficulty {difficulty}, op {op!r}")  # pragma: no cover

    def eval_set(self) -> list[Problem]:
        if self._eval_cache is None:
            self._eval_cache = tuple(self._build_eval_set())
        return list(self._eval_cache)

    def _build_eval_set(self) -> list[Problem]:
        cfg = self.config
        per_difficulty: list[list[tuple[int, str, int, int]]] = []  # (difficulty, op, a, b)
        for d in self.difficulties:
            per_op: list[list[tuple[int, str, int, int]]] = []
            lo, hi = operand_range(d)
            n_values = hi - lo + 1
            for j, op in enumerate(cfg.ops):
                # Split eval_per_difficulty evenly over ops (the first ops take the remainder).
                want = cfg.eval_per_difficulty // len(cfg.ops) + (j < cfg.eval_per_difficulty % len(cfg.ops))
                rng = random.Random(f"{self.name}|eval|{d}|{op}")
                if n_values * n_values <= _ENUMERATE_LIMIT:
                    pool = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1) if self._held_out(a, op, b)]
                    pairs = rng.sample(pool, min(want, len(pool)))
                else:
                    # The space dwarfs `want`: draw until `want` distinct held-out pairs (about modulus*want draws).
                    seen: set[tuple[int, int]] = set()
                    pairs = []
                    while len(pairs) < want:
                        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
                        if (a, b) not in seen and self._held_out(a, op, b):
                            seen.add((a, b))
                            pairs.append((a, b))
                per_op.append([(d, op, a, b) for a, b in pairs])
            per_difficulty.append(interleave(per_op))
        # Interleaved (d1, d2, d3, d1, ...) so that a prefix of the eval set is still balanced.
        chosen = interleave(per_difficulty)
        return [self._make(f"{self.name}:eval:{k:04d}", a, op, b, d) for k, (d, op, a, b) in enumerate(chosen)]

    # ---------------------------------------------------------------------------------------------- verifier

    def reward(self, problem: Problem, completion: str, truncated: bool = False) -> RewardResult:
        """Exact match of the answer part against the canonical answer (see module docstring). Truncated
        completions are never correct and earn nothing (see `well_formed_result`)."""
        return pattern_result(self._answer_re, problem.answer, completion, truncated, self.config.max_completion_chars,
                              self.config.format_reward)

    def sft_target(self, problem: Problem, rng: random.Random) -> str:
        cfg = self.config
        if cfg.filler_max == 0:
            return problem.answer
        n = rng.randint(0, cfg.filler_max if cfg.filler_demo_max is None else cfg.filler_demo_max)
        if cfg.filler_position == "before":
            return FILLER * n + problem.answer
        verdict = VERDICT_MARK + VERDICTS[True] if cfg.verdict else ""
        return problem.answer + verdict + FILLER * n

    # ------------------------------------------------------------------- the verdict (task.verdict=True only)

    @property
    def interjection_marker(self) -> str | None:
        """The text that ends the policy's first part; the environment then appends interjection(...)."""
        return VERDICT_MARK if self.config.verdict else None

    def interjection_window(self) -> int:
        """The most tokens of the first part, marker included (one character is at least one token)."""
        return _longest_answer(self.config.max_digits, self.config.ops) + 1

    def interjection(self, problem: Problem, first_part: str) -> str:
        """The verdict on a first part ending in the marker: "+" when its answer is right, else "-"."""
        return VERDICTS[first_part == problem.answer + VERDICT_MARK]

    def relabel(self, problem: Problem, text: str) -> str:
        """A demonstration whose answer was altered (noisy warm start) with the verdict the environment would
        write for it; unchanged without a verdict."""
        if not self.config.verdict:
            return text
        return relabel_verdict(text, VERDICT_MARK, lambda first: self.interjection(problem, first))

    def filler_length(self, completion: str) -> int | None:
        """Filler characters in a well-formed completion; None when it is malformed (no filler setting: 0, as the
        answer pattern's filler group then matches only the empty string)."""
        m = self._answer_re.fullmatch(completion) if isinstance(completion, str) else None
        return None if m is None else len(m.group("filler"))

    def max_response_len(self) -> int:
        verdict = 2 if self.config.verdict else 0  # "=" and the verdict
        return self.config.filler_max + _longest_answer(self.config.max_digits, self.config.ops) + verdict + 1  # + <eos>

    def max_prompt_len(self) -> int:
        return 2 * self.config.max_digits + 2  # a, op, b, "="

"""Countdown: given numbers and a target, write an expression that hits the target.

Prompt "3 5 7#22=" (the numbers in drawn order, space separated, "#", the target, "="); a correct completion is
any expression over + - * / and parentheses that uses each given number at most once (as a multiset: a number
given twice may be used twice), contains no other number, and evaluates exactly to the target, e.g. "3*5+7".
Difficulty is how many numbers are given.

Verification goes through `safe_eval` (AST whitelist, exact fractions, caps on length, depth and size): model text
is never executed. Unary minus is not allowed (numbers are used as given). Intermediate fractions are allowed
(exact arithmetic; only the final value must equal the target), as in the TinyZero countdown verifier.

Generation: draw `difficulty` numbers uniformly from 1..max_number, combine all of them with a random binary tree
of random ops from `ops` (division only where it is exact), and keep the draw if the value is an integer in
1..max_target; otherwise redraw. The generating expression, printed with minimal parentheses, is the reference
answer and SFT target, so every problem is solvable.

Held-out rule: crc32("countdown|holdout|" + sorted numbers + "|" + target) % holdout_modulus == 0; training
draws that land in the held-out pool are redrawn at the same difficulty. The eval set samples
`eval_per_difficulty` problems of the pool per difficulty (fewer when the pool of a tiny space is smaller),
ordered round-robin over difficulties so that any prefix is balanced too.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from .base import (
    DEFAULT_MAX_COMPLETION_CHARS,
    NumericProblem,
    Problem,
    RewardResult,
    Task,
    check_format_reward,
    check_int,
    interleave,
    invalid_result,
    normalize_ops,
    normalize_weights,
    stable_hash,
    stream_rng,
    well_formed_result,
)
from .safe_eval import SafeEvalLimits, safe_eval

OPS: tuple[str, ...] = ("+", "-", "*", "/")
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_MAX_REDRAWS = 100_000
_MAX_EVAL_DRAWS = 200_000


@dataclass(frozen=True)
class CountdownConfig:
    """Settings of the countdown task."""

    min_numbers: int = 2
    """Fewest numbers given (smallest difficulty)."""
    max_numbers: int = 4
    """Most numbers given (largest difficulty)."""
    max_number: int = 9
    """Numbers are drawn from 1..max_number."""
    max_target: int = 99
    """Targets lie in 1..max_target."""
    ops: tuple[str, ...] = ("+", "-", "*")
    """Operations the generator uses (the verifier accepts all of + - * / regardless)."""
    difficulty_weights: tuple[tuple[int, float], ...] = ((2, 0.25), (3, 0.5), (4, 0.25))
    """Training mixture over number counts: a mapping, (count, weight) pairs, or a flat list of weights of counts
    min_numbers, min_numbers+1, ..."""
    format_reward: float = 0.0
    """Reward of a legal, finished expression with the wrong value (0 <= format_reward < 1)."""
    holdout_modulus: int = 4
    """A problem is held out when its stable hash % holdout_modulus == 0."""
    eval_per_difficulty: int = 24
    """Eval-set problems per difficulty."""
    max_completion_chars: int = DEFAULT_MAX_COMPLETION_CHARS
    """Completions longer than this are malformed without being examined further."""

    def __post_init__(self) -> None:
        _set = object.__setattr__
        check_int("min_numbers", self.min_numbers, low=1, high=8)
        check_int("max_numbers", self.max_numbers, low=self.min_numbers, high=8)
        check_int("max_number", self.max_number, low=1, high=999)
        check_int("max_target", self.max_target, low=1, high=10**6)
        _set(self, "ops", normalize_ops(self.ops, OPS))
        weights = normalize_weights(self.difficulty_weights, first=self.min_numbers)
        for k, _ in weights:
            if not self.min_numbers <= k <= self.max_numbers:
                raise ValueError(
                    f"difficulty_weights: difficulty {k} outside {self.min_numbers}..{self.max_numbers}"
                )
        if sum(w for _, w in weights) <= 0:
            raise ValueError(f"difficulty_weights must have a positive sum, got {self.difficulty_weights!r}")
        _set(self, "difficulty_weights", weights)
        _set(self, "format_reward", check_format_reward(self.format_reward))
        check_int("holdout_modulus", self.holdout_modulus, low=2, high=1_000_000)
        check_int("eval_per_difficulty", self.eval_per_difficulty, low=1, high=100_000)
        check_int("max_completion_chars", self.max_completion_chars, low=1, high=100_000)
        if _longest_reference(self.max_numbers, self.max_number) > self.max_completion_chars:
            raise ValueError("max_completion_chars is shorter than the longest reference expression")


def _longest_reference(n: int, max_number: int) -> int:
    # n numbers, n - 1 operators, and at most one pair of parentheses per non-root inner node (n - 2 of them).
    return n * len(str(max_number)) + (n - 1) + 2 * max(n - 2, 0)


def _combine(rng: random.Random, items: list[tuple[str, Fraction, int]], ops: Sequence[str]):
    """Combine (text, value, precedence) items into one by random binary steps. None if a division was inexact."""
    items = list(items)
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (lt, lv, lp), (rt, rv, rp) = items[i], items[j]
        op = rng.choice(ops)
        if op == "/" and (rv == 0 or (lv / rv).denominator != 1):
            return None
        value = lv + rv if op == "+" else lv - rv if op == "-" else lv * rv if op == "*" else lv / rv
        prec = _PREC[op]
        left = f"({lt})" if lp < prec else lt
        # Right operand of - and / needs parentheses at equal precedence: a-(b+c) != a-b+c.
        right = f"({rt})" if rp < prec or (rp == prec and op in "-/") else rt
        items = [it for k, it in enumerate(items) if k not in (i, j)] + [(f"{left}{op}{right}", value, prec)]
    return items[0]


class CountdownTask(Task):
    name = "countdown"

    def __init__(self, config: CountdownConfig | None = None) -> None:
        self.config = config if config is not None else CountdownConfig()
        cfg = self.config
        self.difficulties = tuple(range(cfg.min_numbers, cfg.max_numbers + 1))
        self._train_difficulties = tuple(k for k, w in cfg.difficulty_weights if w > 0)
        self._train_weights = tuple(w for _, w in cfg.difficulty_weights if w > 0)
        self._limits = SafeEvalLimits(max_len=cfg.max_completion_chars, allow_unary_minus=False)
        self._eval_cache: tuple[Problem, ...] | None = None

    def __repr__(self) -> str:
        return f"CountdownTask({self.config!r})"

    # ----------------------------------------------------------------------------------------------- problems

    def _draw(self, rng: random.Random, difficulty: int) -> tuple[tuple[int, ...], int, str] | None:
        numbers = tuple(rng.randint(1, self.config.max_number) for _ in range(difficulty))
        out = _combine(rng, [(str(x), Fraction(x), 3) for x in numbers], self.config.ops)
        if out is None:
            return None
        text, value, _ = out
        if value.denominator != 1 or not 1 <= value <= self.config.max_target:
            return None
        return numbers, int(value), text

    def _held_out(self, numbers: Sequence[int], target: int) -> bool:
        key = ",".join(map(str, sorted(numbers))) + f"|{target}"
        return stable_hash("countdown|holdout|" + key) % self.config.holdout_modulus == 0

    def is_held_out(self, problem: Problem) -> bool:
        return self._held_out(problem.operands, problem.target)

    def _make(self, uid: str, numbers: tuple[int, ...], target: int, expr: str) -> Problem:
        return NumericProblem(
            uid=uid,
            prompt=" ".join(map(str, numbers)) + f"#{target}=",
            answer=expr,
            difficulty=len(numbers),
            op="countdown",
            operands=numbers,
            target=target,
        )

    def problem_at(self, seed: int, index: int) -> Problem:
        rng = stream_rng(self.name, seed, index)
        difficulty = rng.choices(self._train_difficulties, weights=self._train_weights)[0]
        for _ in range(_MAX_REDRAWS):
            drawn = self._draw(rng, difficulty)
            if drawn is not None and not self._held_out(drawn[0], drawn[1]):
                return self._make(f"{self.name}:train:{seed}:{index}", *drawn)
        raise RuntimeError(f"no training problem found for difficulty {difficulty}")  # pragma: no cover

    def eval_set(self) -> list[Problem]:
        if self._eval_cache is None:
            per_difficulty: list[list[tuple[tuple[int, ...], int, str]]] = []
            for d in self.difficulties:
                chosen: list[tuple[tuple[int, ...], int, str]] = []
                rng = random.Random(f"{self.name}|eval|{d}")
                seen: set[tuple[tuple[int, ...], int]] = set()
                found = 0
                for _ in range(_MAX_EVAL_DRAWS):  # a tiny space may hold fewer than eval_per_difficulty
                    if found == self.config.eval_per_difficulty:
                        break
                    drawn = self._draw(rng, d)
                    if drawn is None or not self._held_out(drawn[0], drawn[1]):
                        continue
                    key = (tuple(sorted(drawn[0])), drawn[1])
                    if key not in seen:
                        seen.add(key)
                        chosen.append(drawn)
                        found += 1
                per_difficulty.append(chosen)
            # Interleaved over difficulties so that a prefix of the eval set is still balanced.
            self._eval_cache = tuple(
                self._make(f"{self.name}:eval:{k:04d}", *drawn)
                for k, drawn in enumerate(interleave(per_difficulty))
            )
        return list(self._eval_cache)

    # ---------------------------------------------------------------------------------------------- verifier

    def reward(self, problem: Problem, completion: str, truncated: bool = False) -> RewardResult:
        """Legal expression (safe_eval ok, no unary minus, numbers from the prompt each used at most once) that
        equals the target exactly. Truncated completions earn nothing and are never correct."""
        try:
            if not isinstance(completion, str) or len(completion) > self.config.max_completion_chars:
                return invalid_result()
            result = safe_eval(completion, self._limits)
            if not result.ok:
                return invalid_result()
            available = Counter(problem.operands)
            used = Counter(result.literals)
            if any(used[x] > available[x] for x in used):
                return invalid_result()
            return well_formed_result(result.value == problem.target, truncated, self.config.format_reward)
        except Exception:  # a verifier must never take the training loop down
            return invalid_result()

    def sft_target(self, problem: Problem, rng: random.Random) -> str:
        return problem.answer

    def max_response_len(self) -> int:
        return _longest_reference(self.config.max_numbers, self.config.max_number) + 1  # + <eos>

    def max_prompt_len(self) -> int:
        cfg = self.config
        return cfg.max_numbers * (len(str(cfg.max_number)) + 1) + len(str(cfg.max_target)) + 1

"""The task interface every environment implements, and the helpers tasks share.

A task is a deterministic prompt stream plus a verifier. Everything the training loop needs from a task:

- `problem_at(seed, index)`: problem `index` of the stream for data seed `seed`; a pure function of
  (task settings, seed, index), so every objective arm sees the same prompts in the same order and a resumed run
  needs only the index. It never depends on PYTHONHASHSEED, the process or earlier calls.
- `eval_set()`: a fixed held-out list, the same for every seed and disjoint from every training problem of every
  seed (training draws skip held-out problems by a cheap rule, see each task).
- `reward(problem, completion, truncated)`: a pure, bounded-time verifier of completion *text* (special tokens
  already stripped). It never executes model output and never raises on any input.
- `sft_target(problem, rng)`: a reference completion (text only, no special tokens) that earns reward 1.0, when
  `has_sft_targets` (a data set with final answers only has none).
- `max_response_len()`: tokens (= characters) enough for the longest reference completion plus `<eos>`.
"""

from __future__ import annotations

import abc
import math
import random
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Completions longer than this many characters are never examined: the verifier answers "malformed" at once.
DEFAULT_MAX_COMPLETION_CHARS = 256


@dataclass(frozen=True)
class Problem:
    """One prompt with its ground truth; generic over tasks. Hashable (tuples only), so it can key caches.

    Tasks produce text, never token ids: the rollout layer turns `prompt` (or `messages`, through the
    tokenizer's chat template when it has one) into ids.
    """

    uid: str
    """Unique id: "<task>:train:<seed>:<index>" for stream problems, "<task>:eval:<k>" for the held-out set."""
    prompt: str
    """Prompt text without special tokens, e.g. "12+34=" (also the fallback when no chat template applies)."""
    answer: str
    """Ground truth as text: "64" (46 written reversed), a countdown reference expression, "42", "\\frac{1}{2}"."""
    difficulty: int = 0
    """Difficulty level, one of the task's `difficulties` (0 when a data set has no difficulty column)."""
    messages: tuple[tuple[str, str], ...] = ()
    """Chat form of the prompt as (role, content) pairs; empty = plain text only."""
    meta: tuple[tuple[str, object], ...] = ()
    """Task-specific extras as (key, value) pairs of plain values (e.g. a data set row's id or source)."""

    def chat(self) -> list[dict]:
        """`messages` as the list of {"role", "content"} dicts that chat templates take."""
        return [{"role": r, "content": c} for r, c in self.messages]


@dataclass(frozen=True, kw_only=True)
class NumericProblem(Problem):
    """A problem whose answer denotes an integer built from the numbers in its prompt (arithmetic, countdown)."""

    op: str
    """Operation ("+", "-", "*") or the task's kind ("countdown")."""
    operands: tuple[int, ...]
    """The numbers in the prompt, in prompt order."""
    target: int
    """The integer the answer must denote (a op b; the countdown target)."""


@dataclass(frozen=True)
class RewardResult:
    """Outcome of verifying one completion.

    correct:   the answer is exactly right and the completion finished (was not truncated).
    malformed: the text does not parse as an answer (garbage, over-long, wrong type, illegal characters).
    format_ok: well-formed and finished: `not malformed and not truncated`.
    reason:    why, in one word, for samples.jsonl ("" when a task does not say; the dataset task writes correct,
               wrong, truncated, unparseable, too_long or timeout).
    """

    reward: float
    correct: bool
    format_ok: bool
    malformed: bool
    reason: str = ""


class Task(abc.ABC):
    """Abstract task. Subclasses set `name`, `difficulties` and `config` (a frozen dataclass of settings)."""

    name: str
    difficulties: tuple[int, ...]
    # True: reward() is a pure function of (problem, completion, truncated), so the training loop verifies each
    # distinct completion of a group once and reuses the result for its copies (about half the calls on the
    # default run). A task whose reward is random or stateful sets it to False.
    deterministic_reward: bool = True
    config: object

    @abc.abstractmethod
    def problem_at(self, seed: int, index: int) -> Problem:
        """Problem `index` of the training stream of data seed `seed` (pure function of seed and index)."""

    def prompts(self, seed: int, start: int, n: int) -> list[Problem]:
        """Problems start .. start+n-1 of the training stream of `seed`."""
        _check_nonneg_int("start", start)
        _check_nonneg_int("n", n)
        return [self.problem_at(seed, start + i) for i in range(n)]

    @abc.abstractmethod
    def eval_set(self) -> list[Problem]:
        """Fixed held-out problems, balanced over difficulties, disjoint from every training problem."""

    @abc.abstractmethod
    def is_held_out(self, problem: Problem) -> bool:
        """True when `problem` belongs to the held-out pool that training never draws from."""

    @abc.abstractmethod
    def reward(self, problem: Problem, completion: str, truncated: bool = False) -> RewardResult:
        """Verify `completion` (text, special tokens stripped). Never raises, never executes the text."""

    @property
    def has_sft_targets(self) -> bool:
        """Whether `sft_target` can give reference completions (a data set of final answers only cannot)."""
        return True

    @abc.abstractmethod
    def sft_target(self, problem: Problem, rng: random.Random) -> str:
        """A reference completion for supervised warm-up; always earns reward 1.0. Raises ValueError when the task
        has no SFT targets (`has_sft_targets` is False)."""

    @abc.abstractmethod
    def max_response_len(self) -> int:
        """Tokens enough for the longest reference completion plus one `<eos>`."""

    @abc.abstractmethod
    def max_prompt_len(self) -> int:
        """Tokens of the longest prompt, without `<bos>`."""


# ---------------------------------------------------------------------------------------------------------------
# Helpers shared by tasks.


def stable_hash(text: str) -> int:
    """A hash that is the same in every process and Python version (unlike the salted built-in hash())."""
    return zlib.crc32(text.encode("utf-8"))


def stream_rng(task_name: str, seed: int, index: int) -> random.Random:
    """The generator for problem `index` of data seed `seed`.

    Seeding random.Random with a str hashes it with SHA-512 (seed version 2), so the stream is independent of
    PYTHONHASHSEED, and distinct (seed, index) pairs never collide the way `seed * K + index` can.
    """
    _check_nonneg_int("seed", seed)
    _check_nonneg_int("index", index)
    return random.Random(f"{task_name}|train|{seed}|{index}")


def _check_nonneg_int(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field} must be a non-negative int, got {value!r}")


def invalid_result() -> RewardResult:
    """The result for text that does not parse."""
    return RewardResult(reward=0.0, correct=False, format_ok=False, malformed=True)


def well_formed_result(correct: bool, truncated: bool, format_reward: float) -> RewardResult:
    """The result for text that parses as an answer.

    A truncated completion (no `<eos>` before the length limit) is never correct and earns nothing, not even the
    format reward: it did not finish, and rewarding it would reward running out of budget.
    """
    if truncated:
        return RewardResult(reward=0.0, correct=False, format_ok=False, malformed=False)
    return RewardResult(reward=1.0 if correct else format_reward, correct=correct, format_ok=True, malformed=False)


def pattern_result(pattern: re.Pattern, answer: str, completion: object, truncated: bool, max_chars: int,
                   format_reward: float) -> RewardResult:
    """The verifier of a task whose completions follow a regular grammar with a group named ``answer``: malformed
    unless ``completion`` is text of at most ``max_chars`` characters that ``pattern`` matches in full; correct
    when its answer group equals ``answer`` (see `well_formed_result`). Never raises."""
    try:
        if not isinstance(completion, str) or len(completion) > max_chars:
            return invalid_result()
        m = pattern.fullmatch(completion)
        if m is None:
            return invalid_result()
        return well_formed_result(m.group("answer") == answer, truncated, format_reward)
    except Exception:  # a verifier must never take the training loop down
        return invalid_result()


def relabel_verdict(text: str, marker: str, judge) -> str:
    """``text`` (a warm-start demonstration) with the character after its first ``marker`` replaced by
    ``judge(text up to and including the marker)``: the verdict an environment would write for an altered
    demonstration. Unchanged when the marker is missing or ends the text."""
    i = text.find(marker)
    if i < 0 or i + 1 >= len(text):
        return text
    return text[:i + 1] + judge(text[:i + 1]) + text[i + 2:]


# ---------------------------------------------------------------------------------------------------------------
# Validation and normalisation of task settings (shared by the config dataclasses).


def check_int(field_name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{field_name} must be an int in [{low}, {high}], got {value!r}")


def check_format_reward(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= value < 1.0):
        raise ValueError(f"format_reward must be a number in [0, 1), got {value!r}")
    return float(value)


def normalize_weights(value: object, first: int) -> tuple[tuple[int, float], ...]:
    """Difficulty weights -> sorted tuple of (difficulty, weight) pairs.

    Accepted forms: a mapping {difficulty: weight} (keys may be digit strings, as JSON writes them), a sequence of
    (difficulty, weight) pairs, or a flat sequence of numbers giving the weights of difficulties first, first+1, ...
    (the form a YAML list takes).
    """
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, Sequence) and not isinstance(value, str):
        if all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in value):
            items = [(first + i, w) for i, w in enumerate(value)]
        else:
            items = []
            for pair in value:
                if not (isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2):
                    raise ValueError(f"difficulty_weights: expected numbers or (difficulty, weight) pairs, got {pair!r}")
                items.append((pair[0], pair[1]))
    else:
        raise ValueError(f"difficulty_weights must be a mapping difficulty -> weight, got {value!r}")
    out: dict[int, float] = {}
    for k, w in items:
        if isinstance(k, str) and k.strip().isdigit():
            k = int(k)
        if isinstance(k, bool) or not isinstance(k, int):
            raise ValueError(f"difficulty_weights: difficulty keys must be ints, got {k!r}")
        if k in out:
            raise ValueError(f"difficulty_weights: difficulty {k} given twice")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"difficulty_weights: weight of difficulty {k} must be a finite number >= 0, got {w!r}")
        out[k] = float(w)
    return tuple(sorted(out.items()))


def normalize_ops(value: object, valid: tuple[str, ...]) -> tuple[str, ...]:
    """A sequence of ops, or a string of op characters ("+-*" as a config file writes it) -> tuple of ops."""
    ops = tuple(value) if isinstance(value, (str, Sequence)) else None
    if not ops:
        raise ValueError(f"ops must be a non-empty sequence of {valid}, got {value!r}")
    for op in ops:
        if op not in valid:
            raise ValueError(f"ops: unknown op {op!r}; valid ops are {valid}")
    if len(set(ops)) != len(ops):
        raise ValueError(f"ops: duplicate op in {value!r}")
    return ops


def interleave(groups: Sequence[Sequence]) -> list:
    """Round-robin merge: [[a1, a2], [b1], [c1, c2]] -> [a1, b1, c1, a2, c2]. Any prefix stays balanced."""
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out

"""Math problems from a data set file (or a Hugging Face hub data set), verified by `envs.mathcheck`.

    task = make_task("dataset", path="data/gsm8k_train.jsonl", eval_path="data/gsm8k_test.jsonl")
    task = make_task("dataset", path="data/math.parquet", format="math", eval_size=500)
    task = make_task("dataset", path="data/verl_train.parquet", format="verl", eval_fraction=0.05)

Formats (`format`) are presets of the column settings, which can each be overridden:
- "gsm8k": `question` is the prompt; `answer` is the full solution ending in "#### <final answer>" (the final
  answer is the ground truth; the full solution is the SFT target). Answers are checked in the "gsm8k" style.
- "math": `problem` is the prompt; `solution` is the full solution whose last `\\boxed{}` holds the final answer
  (ground truth; the full solution is the SFT target). Answers are checked in the "boxed" style.
  For both, the difficulty comes from a `level` column when the file has one ("Level 3" -> 3, or an int).
- "verl": verl's parquet layout: `prompt` is a list of chat messages ({"role", "content"}), the ground truth is
  `reward_model.ground_truth` (a column path into the nested `reward_model` column), `data_source` (optional)
  names the source and picks the answer style per row the way verl's default_compute_score does (a source
  containing "gsm8k" -> "gsm8k" style, others "boxed"), `extra_info` (optional) is kept in the problem's meta.
  No SFT targets.
- "columns": name the columns yourself: `answer_column` (a final answer) and one of `prompt_column` (text) or
  `messages_column` (chat messages). `answer_style` must be set (a ValueError lists the styles) unless the answers
  show it: all contain "####" (-> "gsm8k") or all contain "\\boxed{" (-> "boxed"); the detected style is stored
  in the config, so task_spec shows it. An answer that contains its style's marker ("####", "\\boxed{") is a
  solution: its final answer, extracted in that style, is the ground truth. No SFT targets.

Problems: gsm8k/math/columns-with-prompt rows give `prompt` = question (+ " " + instruction) and `messages` =
((system, system_prompt)?, (user, prompt)). Rows with chat messages keep them (the instruction is appended to the
last user message; a system_prompt is put first unless the row has its own) and their `prompt` is the user
contents joined by blank lines. The rollout layer applies the tokenizer's chat template to `messages` when it has
one, else it uses `prompt`.

Loading and validation happen once, in the constructor, through `datasets.load_dataset` ("json" for .jsonl and
.json, "parquet", "csv"; a name like "org/name" that is not a local file is loaded from the hub with `subset` and
`split`). Every problem with the data raises ValueError naming the file (or hub name) and the row (0-based):
missing file, empty file, no rows, bytes that are not UTF-8, a missing column (the columns present are listed),
wrong value types, malformed chat messages, an empty prompt, a gsm8k answer without "####", a math solution
without `\\boxed{}`, a difficulty without an integer in it, a duplicate prompt with a different answer, a
held-out set that leaves no training row. Decided: rows whose prompt (and messages) repeat an earlier row with the
same ground truth are dropped (counted in `n_duplicates`), before the held-out split, so no prompt can be in both.

Held-out set (exactly one of): `eval_path`, a second file (or hub split `eval_split`) in the same format; training
rows whose prompt appears in it are dropped (counted in `n_overlap_dropped`) so the sets are disjoint; with
`eval_size` > 0 a seeded sample of that many of its rows is used. Or `eval_size` rows / an `eval_fraction` of the
rows, chosen by a permutation seeded with `split_seed` (never by the data seed). With none of them set, a seeded
10% of the rows, at most 500 (`DEFAULT_EVAL_SHARE`, `DEFAULT_EVAL_MAX`), is held out, so the plain command
`objbench train model.path=DIR task.name=dataset task.path=FILE task.format=gsm8k` works; the run's meta.json and
the task's `n_eval` say how many. The eval set is ordered round-robin over difficulties (file order within a difficulty), so every
prefix of it is balanced. Paths are used as given (a relative one is relative to the working directory).

Training stream: epoch e = index // n_train visits every training row once, in the order of a permutation of the
rows seeded by (data seed, e) through random.Random with a string seed (SHA-512, independent of PYTHONHASHSEED);
problem `index` is row perm[index % n_train]. So `problem_at` is a pure function of (settings, seed, index).

Files: reading and validating rows is envs/dataset_files.py; generated files (test fixtures, smoke runs) are
envs/synthetic_data.py, whose writers are re-exported here.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from dataclasses import dataclass, replace

from . import mathcheck
from .base import (
    Problem,
    RewardResult,
    Task,
    _check_nonneg_int,
    check_format_reward,
    check_int,
    interleave,
    invalid_result,
    well_formed_result,
)
from .dataset_files import Row, dedupe, prompt_chars, read_rows, seeded_order
from .synthetic_data import (  # noqa: F401 - re-exported: tests, examples and benchmarks import them from here
    synthetic_gsm8k_rows,
    synthetic_math_rows,
    synthetic_verl_rows,
    write_rows,
    write_synthetic_gsm8k,
    write_synthetic_math,
    write_synthetic_verl,
)

FORMATS: tuple[str, ...] = ("gsm8k", "math", "verl", "columns")

# format -> (prompt_column, answer_column, messages_column, answer_style); None = not used / per row (verl).
_PRESETS: dict[str, tuple[str | None, str | None, str | None, str | None]] = {
    "gsm8k": ("question", "answer", None, "gsm8k"),
    "math": ("problem", "solution", None, "boxed"),
    "verl": (None, "reward_model.ground_truth", "prompt", None),
    "columns": (None, None, None, None),  # the style is set, or shown by the answers (dataset_files)
}
_PERMUTATION_CACHE = 4  # (seed, epoch) permutations kept per task


DEFAULT_EVAL_SHARE = 0.1
DEFAULT_EVAL_MAX = 500


@dataclass(frozen=True)
class DatasetConfig:
    """Settings of the dataset task. Column settings left at None take the format's preset (see module docstring);
    the resolved names are stored, so `task_spec` shows them."""

    path: str = ""
    """A local .jsonl/.json/.parquet/.csv file, or a Hugging Face hub data set name "org/name" (needs the hub)."""
    format: str = "gsm8k"
    """Layout preset: "gsm8k", "math", "verl" or "columns" (see module docstring)."""
    prompt_column: str | None = None
    """Column of the question text (gsm8k: question, math: problem; verl: not used)."""
    answer_column: str | None = None
    """Column of the answer: the full solution for gsm8k (solution) and math (solution), the final answer for verl
    (reward_model.ground_truth: a "." path enters a nested column) and columns."""
    messages_column: str | None = None
    """Column of chat messages, a list of {"role", "content"} (verl: prompt; columns: optional)."""
    difficulty_column: str | None = None
    """Column of the difficulty: ints, or text with an integer in it ("Level 3" -> 3). None = the preset (gsm8k and
    math: "level" when the file has it; verl, columns: none); "" = none (every problem has difficulty 0)."""
    split: str = "train"
    """Split to load when `path` is a hub data set."""
    subset: str | None = None
    """Configuration name of a hub data set (e.g. "main" for openai/gsm8k)."""
    eval_path: str | None = None
    """Held-out file (or hub data set) in the same format; excludes eval_fraction."""
    eval_split: str = "test"
    """Split to load when `eval_path` is a hub data set."""
    eval_fraction: float = 0.0
    """Share of the rows held out by a seeded split (0 < f < 1); excludes eval_size and eval_path."""
    eval_size: int = 0
    """Rows held out by a seeded split; with eval_path, a seeded sample of that many held-out rows (0 = all)."""
    split_seed: int = 0
    """Seed of the held-out split and of the eval_path sample; the data seed never changes the eval set."""
    system_prompt: str = ""
    """System message put first in every problem's messages ("" = none; rows with their own keep theirs)."""
    instruction: str = ""
    """Text appended (after a space) to every question, e.g. 'Put the final answer after "####".'"""
    answer_style: str | None = None
    """How the final answer is extracted: "gsm8k", "boxed" or "last_number". None = the format's (verl: per row
    from data_source; columns: required unless every answer shows its style, see the module docstring)."""
    format_reward: float = 0.0
    """Reward of a well-formed, finished but wrong answer (0 <= format_reward < 1). A correct answer earns 1.0."""
    max_response_tokens: int = 256
    """Response budget in tokens, returned by max_response_len() (the loop's default max_new_tokens)."""
    max_completion_chars: int = mathcheck.DEFAULT_MAX_CHARS
    """Completions longer than this many characters are malformed ("too_long") without being parsed."""
    timeout_s: float = mathcheck.DEFAULT_TIMEOUT_S
    """Seconds the symbolic check of one completion may take (see envs.mathcheck for the bound)."""

    def __post_init__(self) -> None:
        _set = object.__setattr__  # normalise in place on a frozen dataclass
        if not isinstance(self.path, str) or not self.path.strip():
            raise ValueError(f"path must name a data file or a hub data set, got {self.path!r}")
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {self.format!r}")
        for field in ("prompt_column", "answer_column", "messages_column"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{field} must be a column name or null, got {value!r}")
        if self.difficulty_column is not None and not isinstance(self.difficulty_column, str):
            raise ValueError(f"difficulty_column must be a column name, '' or null, got {self.difficulty_column!r}")
        prompt_col, answer_col, messages_col, style = _PRESETS[self.format]
        if self.prompt_column is None:
            _set(self, "prompt_column", prompt_col)
        if self.answer_column is None:
            _set(self, "answer_column", answer_col)
        if self.messages_column is None:
            _set(self, "messages_column", messages_col)
        if self.answer_style is None:
            _set(self, "answer_style", style)
        if self.format in ("gsm8k", "math"):
            if self.messages_column is not None:
                raise ValueError(f"messages_column applies to the verl and columns formats, not {self.format!r}")
        elif self.format == "verl":
            if self.prompt_column is not None:
                raise ValueError("prompt_column does not apply to format 'verl' (its prompt is messages_column)")
        if self.answer_column is None:
            raise ValueError(f"format {self.format!r} needs answer_column")
        if (self.prompt_column is None) == (self.messages_column is None):
            raise ValueError(
                f"format {self.format!r} needs exactly one of prompt_column and messages_column, got "
                f"{self.prompt_column!r} and {self.messages_column!r}"
            )
        if self.answer_style is not None and self.answer_style not in mathcheck.STYLES:
            raise ValueError(f"answer_style must be one of {mathcheck.STYLES} or null, got {self.answer_style!r}")
        for field in ("split", "eval_split"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise ValueError(f"{field} must be a non-empty split name, got {getattr(self, field)!r}")
        if self.subset is not None and (not isinstance(self.subset, str) or not self.subset):
            raise ValueError(f"subset must be a configuration name or null, got {self.subset!r}")
        if self.eval_path is not None and (not isinstance(self.eval_path, str) or not self.eval_path.strip()):
            raise ValueError(f"eval_path must name a held-out file or null, got {self.eval_path!r}")
        frac = self.eval_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 <= frac < 1.0:
            raise ValueError(f"eval_fraction must be a number in [0, 1), got {frac!r}")
        _set(self, "eval_fraction", float(frac))
        check_int("eval_size", self.eval_size, low=0, high=10**9)
        check_int("split_seed", self.split_seed, low=0, high=2**63 - 1)
        if self.eval_fraction > 0 and (self.eval_size > 0 or self.eval_path is not None):
            raise ValueError("eval_fraction excludes eval_size and eval_path: give one way to hold out problems")
        for field in ("system_prompt", "instruction"):
            if not isinstance(getattr(self, field), str):
                raise ValueError(f"{field} must be a string, got {getattr(self, field)!r}")
        _set(self, "format_reward", check_format_reward(self.format_reward))
        check_int("max_response_tokens", self.max_response_tokens, low=1, high=1_000_000)
        check_int("max_completion_chars", self.max_completion_chars, low=1, high=10_000_000)
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 600:
            raise ValueError(f"timeout_s must be a number in (0, 600], got {t!r}")
        _set(self, "timeout_s", float(t))


class DatasetTask(Task):
    name = "dataset"

    def __init__(self, config: DatasetConfig) -> None:
        if not isinstance(config, DatasetConfig):
            raise ValueError(f"the dataset task needs a DatasetConfig (path is required), got {config!r}")
        self.config = cfg = config
        rows, label, table = read_rows(cfg, cfg.path, cfg.split)
        self._tables = {"train": table, "eval": table}  # the raw rows, for reward functions (reward_columns)
        rows, self.n_duplicates = dedupe(rows, label)
        if cfg.eval_path is not None:
            eval_rows, eval_label, self._tables["eval"] = read_rows(cfg, cfg.eval_path, cfg.eval_split)
            eval_rows, n_eval_dup = dedupe(eval_rows, eval_label)
            self.n_duplicates += n_eval_dup
            if cfg.eval_size > 0:
                if cfg.eval_size > len(eval_rows):
                    raise ValueError(f"{eval_label}: eval_size={cfg.eval_size} but the file has {len(eval_rows)} rows")
                chosen = seeded_order(len(eval_rows), f"dataset|evalsample|{cfg.split_seed}")[: cfg.eval_size]
                eval_rows = [eval_rows[i] for i in sorted(chosen)]
            held = {r.key for r in eval_rows}
            train = [r for r in rows if r.key not in held]
            self.n_overlap_dropped = len(rows) - len(train)
            if not train:
                raise ValueError(f"{label}: every training row's prompt is in the held-out file {eval_label}")
        else:
            n = len(rows)
            if cfg.eval_size > 0:
                k = cfg.eval_size
            elif cfg.eval_fraction > 0:
                k = max(1, round(cfg.eval_fraction * n))
            else:  # nothing set: the documented default share
                k = min(DEFAULT_EVAL_MAX, max(1, round(DEFAULT_EVAL_SHARE * n)))
            if k >= n:
                raise ValueError(
                    f"{label}: holding out {k} of its {n} rows (eval_size={cfg.eval_size}, "
                    f"eval_fraction={cfg.eval_fraction}) leaves no training rows"
                )
            order = seeded_order(n, f"dataset|split|{cfg.split_seed}")
            held_idx = set(order[:k])
            eval_rows = [r for i, r in enumerate(rows) if i in held_idx]
            train = [r for i, r in enumerate(rows) if i not in held_idx]
            self.n_overlap_dropped = 0
        if cfg.format == "columns" and cfg.answer_style is None:  # detected from the answers: store it
            styles = sorted({r.style for r in (*train, *eval_rows)})
            if len(styles) > 1:
                raise ValueError(f"{label}: the answers of the training and held-out files show different styles "
                                 f"{styles}: set answer_style")
            self.config = cfg = replace(cfg, answer_style=styles[0])
        self._train: tuple[Row, ...] = tuple(train)
        by_difficulty: dict[int, list[Row]] = {}
        for r in eval_rows:
            by_difficulty.setdefault(r.difficulty, []).append(r)
        self._eval: tuple[Row, ...] = tuple(interleave([by_difficulty[d] for d in sorted(by_difficulty)]))
        self._eval_keys = frozenset(r.key for r in self._eval)
        self._solutions = {r.key: r.solution for r in (*self._train, *self._eval)}
        self.difficulties = tuple(sorted({r.difficulty for r in (*self._train, *self._eval)}))
        self._max_prompt = max(prompt_chars(r) for r in (*self._train, *self._eval))
        self._perms: OrderedDict[tuple[int, int], tuple[int, ...]] = OrderedDict()
        self._eval_cache: tuple[Problem, ...] | None = None
        self._fingerprint: str | None = None
        if any(mathcheck.numeric_value(r.answer) is None for r in (*self._train, *self._eval)):
            mathcheck.start_worker()  # symbolic answers ahead: let the checker import while training starts

    def __repr__(self) -> str:
        return f"DatasetTask({self.config!r})"

    @property
    def n_eval(self) -> int:
        """Held-out rows."""
        return len(self._eval)

    @property
    def n_train(self) -> int:
        """Training rows (after duplicates and held-out rows are removed)."""
        return len(self._train)

    @property
    def has_sft_targets(self) -> bool:
        return self.config.format in ("gsm8k", "math")

    @property
    def fingerprint(self) -> str:
        """sha256 of the validated rows (train and held out): what a run on this task depends on beyond its
        settings. A changed file under the same path gets a new fingerprint, so no cache reuses stale data."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            for part, rows in (("train", self._train), ("eval", self._eval)):
                h.update(part.encode())
                for r in rows:
                    h.update(json.dumps([r.prompt, r.messages, r.answer, r.solution, r.difficulty, r.style],
                                        ensure_ascii=False, default=str).encode() + b"\n")
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def reward_columns(self, problems: list) -> dict:
        """Every column of the data set's rows behind ``problems``, as given in the file (one list per column):
        the ``columns`` reward functions receive (envs/reward_fns.py)."""
        where = [dict(p.meta) for p in problems]
        rows = [self._tables[m["split"]][m["row"]] for m in where]
        return {name: [r.get(name) for r in rows] for name in dict.fromkeys(k for r in rows for k in r)}

    # ----------------------------------------------------------------------------------------------- problems

    def _problem(self, uid: str, row: Row, split: str) -> Problem:
        return Problem(
            uid=uid,
            prompt=row.prompt,
            answer=row.answer,
            difficulty=row.difficulty,
            messages=row.messages,
            meta=(("split", split), *row.meta),
        )

    def _permutation(self, seed: int, epoch: int) -> tuple[int, ...]:
        key = (seed, epoch)
        perm = self._perms.get(key)
        if perm is None:
            perm = tuple(seeded_order(len(self._train), f"{self.name}|train|{seed}|{epoch}"))
            self._perms[key] = perm
            if len(self._perms) > _PERMUTATION_CACHE:
                self._perms.popitem(last=False)
        else:
            self._perms.move_to_end(key)
        return perm

    def problem_at(self, seed: int, index: int) -> Problem:
        _check_nonneg_int("seed", seed)
        _check_nonneg_int("index", index)
        epoch, pos = divmod(index, len(self._train))
        row = self._train[self._permutation(seed, epoch)[pos]]
        return self._problem(f"{self.name}:train:{seed}:{index}", row, "train")

    def eval_set(self) -> list[Problem]:
        if self._eval_cache is None:
            self._eval_cache = tuple(
                self._problem(f"{self.name}:eval:{k:04d}", r, "eval") for k, r in enumerate(self._eval)
            )
        return list(self._eval_cache)

    def is_held_out(self, problem: Problem) -> bool:
        return (problem.prompt, problem.messages) in self._eval_keys

    # ---------------------------------------------------------------------------------------------- verifier

    def reward(self, problem: Problem, completion: str, truncated: bool = False) -> RewardResult:
        """`mathcheck.check_answer` of the completion against `problem.answer`, in the problem's answer style.

        reason: the verdict's reason (correct, wrong, unparseable, too_long, timeout), except that a well-formed
        truncated completion gets "truncated" (never correct, no format reward; see `well_formed_result`).
        Unparseable, too long and timed-out completions are malformed.
        """
        cfg = self.config
        try:
            style = dict(problem.meta).get("answer_style", cfg.answer_style) or "boxed"
            verdict = mathcheck.check_answer(
                completion, problem.answer, style=style, timeout_s=cfg.timeout_s, max_chars=cfg.max_completion_chars
            )
            if verdict.reason in ("correct", "wrong"):
                result = well_formed_result(verdict.correct, truncated, cfg.format_reward)
                reason = "truncated" if truncated else verdict.reason
            else:
                result, reason = invalid_result(), verdict.reason
            return replace(result, reason=reason)
        except Exception:  # a verifier must never take the training loop down
            return replace(invalid_result(), reason="unparseable")

    def sft_target(self, problem: Problem, rng: random.Random) -> str:
        """The data set's full solution of the problem (gsm8k, math formats)."""
        if not self.has_sft_targets:
            raise ValueError(
                f"the dataset task with format {self.config.format!r} has no SFT targets (only gsm8k and math "
                "files carry full solutions): skip supervised warm-up, or start from a model that already answers"
            )
        solution = self._solutions.get((problem.prompt, problem.messages))
        if solution is None:
            raise ValueError(f"problem {problem.uid!r} is not a row of {self.config.path}")
        return solution

    def max_response_len(self) -> int:
        return self.config.max_response_tokens

    def max_prompt_len(self) -> int:
        """Characters of the longest prompt (all message contents for chat rows): an upper bound on the tokens of
        most tokenizers, before any chat template."""
        return self._max_prompt


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
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
import random
import re
from collections import OrderedDict
from collections.abc import Sequence
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

FORMATS: tuple[str, ...] = ("gsm8k", "math", "verl", "columns")

# format -> (prompt_column, answer_column, messages_column, answer_style); None = not used / per row (verl).
_PRESETS: dict[str, tuple[str | None, str | None, str | None, str | None]] = {
    "gsm8k": ("question", "answer", None, "gsm8k"),
    "math": ("problem", "solution", None, "boxed"),
    "verl": (None, "reward_model.ground_truth", "prompt", None),
    "columns": (None, None, None, None),  # the style is set, or shown by the answers (see _columns_style)
}
_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_LEVEL_COLUMN = "level"
_VERL_SOURCE_COLUMN = "data_source"
_VERL_EXTRA_COLUMN = "extra_info"
_INT_IN_TEXT = re.compile(r"-?\d+")
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


@dataclass(frozen=True)
class _Row:
    """One validated row."""

    index: int
    """Row number in its file (0-based)."""
    prompt: str
    messages: tuple[tuple[str, str], ...]
    answer: str
    """Ground truth: the final answer."""
    solution: str | None
    """Full reference solution (gsm8k, math) or None."""
    difficulty: int
    style: str
    meta: tuple[tuple[str, object], ...]

    @property
    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (self.prompt, self.messages)


class DatasetTask(Task):
    name = "dataset"

    def __init__(self, config: DatasetConfig) -> None:
        if not isinstance(config, DatasetConfig):
            raise ValueError(f"the dataset task needs a DatasetConfig (path is required), got {config!r}")
        self.config = cfg = config
        rows, label, table = _read_rows(cfg, cfg.path, cfg.split)
        self._tables = {"train": table, "eval": table}  # the raw rows, for reward functions (reward_columns)
        rows, self.n_duplicates = _dedupe(rows, label)
        if cfg.eval_path is not None:
            eval_rows, eval_label, self._tables["eval"] = _read_rows(cfg, cfg.eval_path, cfg.eval_split)
            eval_rows, n_eval_dup = _dedupe(eval_rows, eval_label)
            self.n_duplicates += n_eval_dup
            if cfg.eval_size > 0:
                if cfg.eval_size > len(eval_rows):
                    raise ValueError(f"{eval_label}: eval_size={cfg.eval_size} but the file has {len(eval_rows)} rows")
                chosen = _seeded_order(len(eval_rows), f"dataset|evalsample|{cfg.split_seed}")[: cfg.eval_size]
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
            order = _seeded_order(n, f"dataset|split|{cfg.split_seed}")
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
        self._train: tuple[_Row, ...] = tuple(train)
        by_difficulty: dict[int, list[_Row]] = {}
        for r in eval_rows:
            by_difficulty.setdefault(r.difficulty, []).append(r)
        self._eval: tuple[_Row, ...] = tuple(interleave([by_difficulty[d] for d in sorted(by_difficulty)]))
        self._eval_keys = frozenset(r.key for r in self._eval)
        self._solutions = {r.key: r.solution for r in (*self._train, *self._eval)}
        self.difficulties = tuple(sorted({r.difficulty for r in (*self._train, *self._eval)}))
        self._max_prompt = max(_prompt_chars(r) for r in (*self._train, *self._eval))
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

    def _problem(self, uid: str, row: _Row, split: str) -> Problem:
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
            perm = tuple(_seeded_order(len(self._train), f"{self.name}|train|{seed}|{epoch}"))
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


# ---------------------------------------------------------------------------------------------------------------
# Loading and validation


def _seeded_order(n: int, seed: str) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def _prompt_chars(row: _Row) -> int:
    return max(len(row.prompt), sum(len(c) for _, c in row.messages))


def _is_local(path: str) -> bool:
    p = os.path.expanduser(path)
    if os.path.exists(p) or path.startswith(("/", ".", "~")) or "\\" in path:
        return True
    return os.path.splitext(path)[1].lower() in _LOCAL_BUILDERS


def _load(path: str, split: str, subset: str | None):
    """(datasets.Dataset, label naming the source in messages)."""
    import datasets

    if _is_local(path):
        label = path
        p = os.path.expanduser(path)
        if not os.path.exists(p):
            raise ValueError(f"{label}: file not found")
        if os.path.isdir(p):
            raise ValueError(f"{label}: is a directory; give a .jsonl, .json, .parquet or .csv file")
        suffix = os.path.splitext(p)[1].lower()
        builder = _LOCAL_BUILDERS.get(suffix)
        if builder is None:
            raise ValueError(f"{label}: unsupported file type {suffix!r}; use .jsonl, .json, .parquet or .csv")
        if os.path.getsize(p) == 0:
            raise ValueError(f"{label}: empty file")
        if builder != "parquet":
            _check_utf8(p, label)
        try:
            ds = datasets.load_dataset(builder, data_files=os.path.abspath(p), split="train")
        except Exception as e:
            if "corresponds to no data" in str(e):  # how datasets reports a file without rows ("[]", a CSV header)
                raise ValueError(f"{label}: no rows") from e
            hint = _json_error(p) if builder == "json" else ""
            raise ValueError(f"{label}: could not be read as {builder}: {_describe(e)}{hint}") from e
    else:
        label = f"hub data set {path!r} (subset {subset!r}, split {split!r})"
        try:
            ds = datasets.load_dataset(path, subset, split=split)
        except Exception as e:
            raise ValueError(
                f"{label}: could not be loaded: {_describe(e)}. It is not a local file either; offline, download "
                "it first or point path at a local .jsonl/.json/.parquet/.csv file"
            ) from e
    if len(ds) == 0:
        raise ValueError(f"{label}: no rows")
    return ds, label


def _describe(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    if e.__cause__ is not None:
        text += f" ({type(e.__cause__).__name__}: {e.__cause__})"
    return text[:1000]


def _check_utf8(path: str, label: str) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as e:
                bad = offset + max(0, e.start)
                with open(path, "rb") as g:
                    line = g.read(bad).count(b"\n") + 1
                raise ValueError(f"{label}: not valid UTF-8 (line {line}, byte offset {bad}): {e.reason}") from None
            offset += len(chunk)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            raise ValueError(f"{label}: not valid UTF-8 (truncated character at the end): {e.reason}") from None


def _json_error(path: str) -> str:
    """Where a JSON/JSONL file first fails to parse, for the error message ("" when it parses or is huge)."""
    if os.path.getsize(path) > 200 << 20:
        return ""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        json.loads(text)
        return ""
    except ValueError:
        pass
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                json.loads(line)
            except ValueError as e:
                return f" (line {number}: {e})"
    return ""


def _column(ds, name: str, label: str, field: str) -> list:
    """Values of column `name`; "a.b" enters the nested column a (unless a flat column is called "a.b")."""
    columns = list(ds.column_names)
    if name in columns:
        return list(ds[name])
    top, *path = name.split(".")
    if not path or top not in columns:
        raise ValueError(f"{label}: no column {name!r} ({field}); columns present: {', '.join(columns)}")
    values = []
    for i, v in enumerate(ds[top]):
        for key in path:
            if not isinstance(v, dict) or key not in v:
                raise ValueError(f"{label}: row {i}: column {top!r} has no {key!r} entry ({field} = {name!r})")
            v = v[key]
        values.append(v)
    return values


def _text(value: object, label: str, i: int, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{label}: row {i}: {what} must be a string, got {type(value).__name__} {_short(value)}")
    if not value.strip():
        raise ValueError(f"{label}: row {i}: {what} is empty")
    return value


def _final_answer(value: object, label: str, i: int, what: str) -> str:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{label}: row {i}: {what} is empty")
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    raise ValueError(
        f"{label}: row {i}: {what} must be a string or a number, got {type(value).__name__} {_short(value)}"
    )


def _messages(value: object, label: str, i: int, what: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(
            f"{label}: row {i}: {what} must be a non-empty list of {{role, content}} messages, got "
            f"{type(value).__name__} {_short(value)}"
        )
    out = []
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(
                f"{label}: row {i}: {what}: each message must be {{role: str, content: str}}, got {_short(m)}"
            )
        out.append((m["role"], m["content"]))
    if not any(role == "user" and content.strip() for role, content in out):
        raise ValueError(f"{label}: row {i}: {what} has no non-empty user message")
    return tuple(out)


def _difficulty(value: object, label: str, i: int, column: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = _INT_IN_TEXT.search(value)
        if m:
            return int(m.group(0))
    raise ValueError(
        f"{label}: row {i}: difficulty {_short(value)} in column {column!r} is not an integer and has none in it "
        "(set difficulty_column to '' to ignore the column)"
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _read_rows(cfg: DatasetConfig, path: str, split: str) -> tuple[list[_Row], str, object]:
    """Load one file and validate every row; (rows, label, the loaded ``datasets.Dataset``)."""
    ds, label = _load(path, split, cfg.subset)
    n = len(ds)
    answers = _column(ds, cfg.answer_column, label, "answer_column")
    prompts = _column(ds, cfg.prompt_column, label, "prompt_column") if cfg.prompt_column else None
    messages = _column(ds, cfg.messages_column, label, "messages_column") if cfg.messages_column else None
    difficulty_column = cfg.difficulty_column
    if difficulty_column is None:
        present = cfg.format in ("gsm8k", "math") and _LEVEL_COLUMN in ds.column_names
        difficulty_column = _LEVEL_COLUMN if present else ""
    levels = _column(ds, difficulty_column, label, "difficulty_column") if difficulty_column else None
    sources = list(ds[_VERL_SOURCE_COLUMN]) if cfg.format == "verl" and _VERL_SOURCE_COLUMN in ds.column_names else None
    extras = list(ds[_VERL_EXTRA_COLUMN]) if cfg.format == "verl" and _VERL_EXTRA_COLUMN in ds.column_names else None
    columns_style = _columns_style(cfg, answers, label) if cfg.format == "columns" else None

    rows = []
    for i in range(n):
        meta: list[tuple[str, object]] = [("row", i)]
        if prompts is not None:
            question = _text(prompts[i], label, i, f"prompt ({cfg.prompt_column!r})")
            prompt = question + (" " + cfg.instruction if cfg.instruction else "")
            chat = ((("system", cfg.system_prompt),) if cfg.system_prompt else ()) + (("user", prompt),)
        else:
            chat = _messages(messages[i], label, i, f"messages ({cfg.messages_column!r})")
            if cfg.instruction:
                last = max(k for k, (role, _) in enumerate(chat) if role == "user")
                chat = tuple((r, c + " " + cfg.instruction if k == last else c) for k, (r, c) in enumerate(chat))
            if cfg.system_prompt and not any(role == "system" for role, _ in chat):
                chat = (("system", cfg.system_prompt), *chat)
            prompt = "\n\n".join(c for r, c in chat if r == "user")

        solution = None
        if cfg.format == "gsm8k":
            solution = _text(answers[i], label, i, f"answer ({cfg.answer_column!r})")
            if mathcheck.GSM8K_MARKER not in solution:
                raise ValueError(
                    f"{label}: row {i}: gsm8k answer has no '####' final-answer marker: {_short(solution)}"
                )
            answer = mathcheck.extract_answer(solution, "gsm8k")
            if answer is None:
                raise ValueError(f"{label}: row {i}: gsm8k answer has nothing after '####': {_short(solution)}")
        elif cfg.format == "math":
            solution = _text(answers[i], label, i, f"solution ({cfg.answer_column!r})")
            answer = mathcheck.extract_answer(solution, "boxed")
            if answer is None:
                raise ValueError(
                    f"{label}: row {i}: math solution has no complete \\boxed{{}} answer: {_short(solution)}"
                )
        else:
            answer = _final_answer(answers[i], label, i, f"answer ({cfg.answer_column!r})")
            if columns_style is not None:
                answer = _marked_answer(answer, columns_style, label, i)

        style = columns_style or cfg.answer_style
        if sources is not None:
            source = sources[i]
            if source is not None and not isinstance(source, str):
                raise ValueError(f"{label}: row {i}: data_source must be a string, got {_short(source)}")
            if source:
                meta.append(("data_source", source))
                if style is None:
                    style = "gsm8k" if "gsm8k" in source.lower() else "boxed"
        if style is None:
            style = "boxed"
        meta.append(("answer_style", style))
        if extras is not None and extras[i] is not None:
            meta.append(("extra_info", json.dumps(extras[i], sort_keys=True, default=str)))
        difficulty = _difficulty(levels[i], label, i, difficulty_column) if levels is not None else 0
        rows.append(_Row(i, prompt, chat, answer, solution, difficulty, style, tuple(meta)))
    return rows, label, ds


def _columns_style(cfg: DatasetConfig, answers: list, label: str) -> str:
    """The answer style of a "columns" file: answer_style when set, else the style every answer shows ("####" ->
    gsm8k, "\\boxed{" -> boxed). Decided: no silent default, since a wrong style reads nothing, or the wrong number,
    out of every completion (the preset used to be "boxed": a completion without \\boxed{} was unparseable)."""
    if cfg.answer_style is not None:
        return cfg.answer_style
    if answers and all(isinstance(a, str) and mathcheck.GSM8K_MARKER in a for a in answers):
        return "gsm8k"
    if answers and all(isinstance(a, str) and "\\boxed{" in a for a in answers):
        return "boxed"
    raise ValueError(
        f"{label}: format 'columns' needs answer_style (task.answer_style=...), one of {', '.join(mathcheck.STYLES)}: "
        "its answers do not show their style (not all of them contain '####' or '\\boxed{'); e.g. "
        "task.answer_style=last_number for answers that are plain numbers"
    )


def _marked_answer(answer: str, style: str, label: str, i: int) -> str:
    """A "columns" answer that contains its style's marker is a solution: its final answer (else the answer)."""
    marked = (style == "gsm8k" and mathcheck.GSM8K_MARKER in answer) or (style == "boxed" and "\\boxed{" in answer)
    if not marked:
        return answer
    final = mathcheck.extract_answer(answer, style)
    if final is None:
        raise ValueError(f"{label}: row {i}: answer has a {style} marker but no final answer: {_short(answer)}")
    return final


def _dedupe(rows: Sequence[_Row], label: str) -> tuple[list[_Row], int]:
    """Drop rows repeating an earlier row's prompt with the same ground truth; a different one is an error."""
    first: dict[tuple, _Row] = {}
    out = []
    for r in rows:
        seen = first.get(r.key)
        if seen is None:
            first[r.key] = r
            out.append(r)
        elif seen.answer != r.answer:
            raise ValueError(
                f"{label}: rows {seen.index} and {r.index} have the same prompt but different answers "
                f"({_short(seen.answer)} vs {_short(r.answer)}): {_short(r.prompt)}"
            )
    return out, len(rows) - len(out)


# ---------------------------------------------------------------------------------------------------------------
# Synthetic files (test fixtures, smoke tests)

_NAMES = ("Tom", "Ana", "Li", "Sara", "Omar", "Maya", "Ben", "Zoe", "Ravi", "Ines")
_ITEMS = ("apple", "pencil", "marble", "stamp", "cookie", "book", "shell", "coin", "card", "sticker")
_SQUARE_FREE = (2, 3, 5, 6, 7, 10, 11)


def _gsm8k_item(rng: random.Random, level: int) -> tuple[str, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    if level == 1 and rng.random() < 0.5:
        q = f"{name} has {a} {item}s and buys {b} more. How many {item}s does {name} have?"
        return q, f"{name} has {a} + {b} = {a + b} {item}s.\n#### {a + b}"
    if level == 1:
        a, b = max(a, b) + 1, min(a, b)
        q = f"{name} has {a} {item}s and gives away {b}. How many {item}s does {name} have left?"
        return q, f"{name} has {a} - {b} = {a - b} {item}s left.\n#### {a - b}"
    if level == 2:
        q = f"{name} buys {a} bags with {b} {item}s in each bag. How many {item}s does {name} buy?"
        return q, f"{name} buys {a} * {b} = {a * b} {item}s.\n#### {a * b}"
    c = rng.randint(1, a * b - 1)
    q = f"{name} buys {a} bags with {b} {item}s in each bag and then gives away {c}. How many {item}s are left?"
    steps = f"{name} buys {a} * {b} = {a * b} {item}s.\n{name} has {a * b} - {c} = {a * b - c} {item}s left."
    return q, f"{steps}\n#### {a * b - c}"


def _unique(n: int, seed: int, kind: str, draw) -> list:
    """n draws with distinct first elements (questions), deterministic given seed."""
    check_int("n", n, low=1, high=1_000_000)
    _check_nonneg_int("seed", seed)
    rng = random.Random(f"synthetic|{kind}|{seed}")
    seen: set[str] = set()
    out = []
    for _ in range(100 * n + 1000):
        item = draw(rng, len(out))
        if item[0] not in seen:
            seen.add(item[0])
            out.append(item)
            if len(out) == n:
                return out
    raise ValueError(f"could not draw {n} distinct synthetic {kind} problems")


def synthetic_gsm8k_rows(n: int, seed: int, difficulty: bool = False) -> list[dict]:
    """n GSM8K-layout rows {"question", "answer"} (+ "level": 1-3 when `difficulty`) of small word problems."""

    def draw(rng, k):
        level = 1 + k % 3 if difficulty else 1
        q, a = _gsm8k_item(rng, level)
        return q, a, level

    return [
        {"question": q, "answer": a, **({"level": level} if difficulty else {})}
        for q, a, level in _unique(n, seed, "gsm8k", draw)
    ]


def synthetic_math_rows(n: int, seed: int) -> list[dict]:
    """n MATH-layout rows {"problem", "solution" (with \\boxed{}), "level": "Level k"}: fraction sums (levels 1,
    2) and square-root simplifications (level 3, symbolic answers)."""

    def draw(rng, k):
        level = 1 + k % 3
        if level < 3:
            a, b, c, d = (rng.randint(1, 9 * level) for _ in range(4))
            num, den = a * d + c * b, b * d
            g = math.gcd(num, den)
            p, q = num // g, den // g
            boxed = str(p) if q == 1 else f"\\frac{{{p}}}{{{q}}}"
            problem = (
                f"What is $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$? Express your answer as a common fraction."
            )
            solution = f"$\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}} = \\frac{{{num}}}{{{den}}} = \\boxed{{{boxed}}}$."
        else:
            k2, m = rng.randint(2, 12), rng.choice(_SQUARE_FREE)
            problem = f"Simplify $\\sqrt{{{k2 * k2 * m}}}$."
            root = f"\\sqrt{{{k2 * k2 * m}}}"
            solution = f"${root} = \\sqrt{{{k2 * k2}}}\\cdot\\sqrt{{{m}}} = \\boxed{{{k2}\\sqrt{{{m}}}}}$."
        return problem, solution, f"Level {level}"

    return [{"problem": p, "solution": s, "level": lv} for p, s, lv in _unique(n, seed, "math", draw)]


def synthetic_verl_rows(n: int, seed: int) -> list[dict]:
    """n rows in verl's layout (as verl's gsm8k preprocessing writes them): data_source, prompt (chat messages),
    ability, reward_model {style, ground_truth}, extra_info {split, index, answer, question}."""
    instruction = 'Let\'s think step by step and output the final answer after "####".'
    out = []
    for k, row in enumerate(synthetic_gsm8k_rows(n, seed)):
        truth = mathcheck.extract_answer(row["answer"], "gsm8k")
        out.append(
            {
                "data_source": "synthetic/gsm8k",
                "prompt": [{"role": "user", "content": row["question"] + " " + instruction}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {"split": "train", "index": k, "answer": row["answer"], "question": row["question"]},
            }
        )
    return out


def write_rows(path: str, rows: Sequence[dict]) -> None:
    """Write rows as .jsonl (one object a line), .json (an array), .csv (flat rows only) or .parquet."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".jsonl":
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    elif suffix == ".json":
        with open(path, "w", encoding="utf-8") as f:
            json.dump(list(rows), f, ensure_ascii=False)
    elif suffix == ".csv":
        import csv

        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(list(rows)), path)
    else:
        raise ValueError(f"{path}: unsupported file type {suffix!r}; use .jsonl, .json, .csv or .parquet")


def write_synthetic_gsm8k(path: str, n: int, seed: int, difficulty: bool = False) -> None:
    """Write n generated GSM8K-layout problems to `path` (.jsonl, .json, .csv or .parquet); deterministic in seed.

    "Tom has 3 apples and buys 4 more. How many apples does Tom have?" -> "Tom has 3 + 4 = 7 apples.\\n#### 7".
    With `difficulty`, a "level" column 1-3 (1: one addition or subtraction, 2: a product, 3: product then
    subtraction), assigned round-robin.
    """
    write_rows(path, synthetic_gsm8k_rows(n, seed, difficulty))


def write_synthetic_math(path: str, n: int, seed: int) -> None:
    """Write n generated MATH-layout problems (see `synthetic_math_rows`); deterministic in seed."""
    write_rows(path, synthetic_math_rows(n, seed))


def write_synthetic_verl(path: str, n: int, seed: int) -> None:
    """Write n generated problems in verl's layout (nested columns: use .parquet or .jsonl); deterministic."""
    write_rows(path, synthetic_verl_rows(n, seed))

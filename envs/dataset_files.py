"""Reading a data set file (or a Hugging Face hub data set) into validated rows, for the dataset task
(envs/dataset.py, whose module docstring states the formats and every check made here).

`read_rows(cfg, path, split)` loads one file through `datasets.load_dataset` and validates every row, raising
ValueError naming the file (or hub name) and the row; `dedupe` drops repeated prompts; `Row` is one validated row.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import mathcheck

if TYPE_CHECKING:
    from .dataset import DatasetConfig

_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_LEVEL_COLUMN = "level"
_VERL_SOURCE_COLUMN = "data_source"
_VERL_EXTRA_COLUMN = "extra_info"
_INT_IN_TEXT = re.compile(r"-?\d+")

@dataclass(frozen=True)
class Row:
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



def seeded_order(n: int, seed: str) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def prompt_chars(row: Row) -> int:
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


def read_rows(cfg: DatasetConfig, path: str, split: str) -> tuple[list[Row], str, object]:
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
        rows.append(Row(i, prompt, chat, answer, solution, difficulty, style, tuple(meta)))
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


def dedupe(rows: Sequence[Row], label: str) -> tuple[list[Row], int]:
    """Drop rows repeating an earlier row's prompt with the same ground truth; a different one is an error."""
    first: dict[tuple, Row] = {}
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


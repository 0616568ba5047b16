"""Generated data set files (test fixtures, smoke runs, examples): small GSM8K-, MATH- and verl-layout problems,
deterministic in their seed, and `write_rows`, which writes rows as .jsonl, .json, .csv or .parquet.

    write_synthetic_gsm8k("train.jsonl", 200, seed=0, difficulty=True)
    task = make_task("dataset", path="train.jsonl", format="gsm8k")
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Sequence

from . import mathcheck
from .base import _check_nonneg_int, check_int

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

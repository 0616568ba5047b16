"""Compare two folders of runs (benchmarks/bit_identity.sh) value by value, and their warm starts' weights.

    python benchmarks/compare_runs.py OLD NEW     # each holding runs/<name>/ and cache/sft/<key>/

Every value of metrics.jsonl, eval.jsonl and samples.jsonl is compared exactly (NaN equals NaN), except wall
times and memory (``time``, ``time/*``, ``mem/*``). Warm starts are matched by the sha256 of their weights (their
cache keys may differ: the key covers the code). Exit status 1 on any difference.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

LOG_FILES = ("metrics.jsonl", "eval.jsonl", "samples.jsonl")


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _timing(key: str) -> bool:
    return key == "time" or key.startswith(("time/", "mem/"))


ADDED: set = set()  # keys that only the new tree logs (new metrics): listed, not differences


def compare_log(a: Path, b: Path) -> tuple[int, list[str]]:
    """(values compared, differences) of two JSON-lines logs: every value the old tree logged must be there and
    equal; keys only the new tree logs are collected in ADDED."""
    rows_a = [json.loads(line) for line in a.read_text().splitlines()]
    rows_b = [json.loads(line) for line in b.read_text().splitlines()]
    if len(rows_a) != len(rows_b):
        return 0, [f"{a}: {len(rows_a)} rows against {len(rows_b)}"]
    n, diffs = 0, []
    for x, y in zip(rows_a, rows_b):
        if set(x) - set(y):  # a value the old code logged is gone; keys only NEW logs are metrics added since
            diffs.append(f"{a} step {x.get('step')}: keys missing {sorted(set(x) - set(y))}")
        ADDED.update(set(y) - set(x))
        for k in (k for k in x if not _timing(k)):
            n += 1
            if not _same(x[k], y.get(k)):
                diffs.append(f"{a} step {x.get('step')}: {k} {x[k]!r} != {y.get(k)!r}")
    return n, diffs


def warm_start_hashes(root: Path) -> list[str]:
    out = []
    for folder in sorted(p.parent for p in (root / "cache").rglob("sft.json")):
        h = hashlib.sha256()
        for f in sorted(folder.glob("*.safetensors")):
            h.update(f.read_bytes())
        out.append(h.hexdigest()[:16])
    return sorted(out)


def main(argv: list[str]) -> int:
    old, new = map(Path, argv)
    total, diffs = 0, []
    runs = sorted(p.name for p in (old / "runs").iterdir() if p.is_dir())
    for run in runs:
        for name in LOG_FILES:
            n, d = compare_log(old / "runs" / run / name, new / "runs" / run / name)
            total, diffs = total + n, diffs + d
    ws_old, ws_new = warm_start_hashes(old), warm_start_hashes(new)
    if ws_old != ws_new:
        diffs.append(f"warm-start weights differ: {ws_old} against {ws_new}")
    for d in diffs[:20]:
        print(d)
    if ADDED:
        print(f"keys only the new tree logs (added metrics, not compared): {', '.join(sorted(ADDED))}")
    print(f"{len(runs)} runs, {total} values compared, {len(ws_old)} warm starts ({', '.join(ws_old)}); "
          f"{len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

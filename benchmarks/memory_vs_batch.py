"""Peak memory against completions per step at a fixed micro-batch size (train.micro_batch_size), on any model.

    python -m benchmarks.memory_vs_batch --model DIR                      # 16 and 64 completions, micro-batch 4
    python -m benchmarks.memory_vs_batch --model DIR --completions 16 32 64 --repeats 2 -- rollout.max_new_tokens=48

Each run is a fresh child process (`objbench train`, so its peak RSS is its own: weights, optimizer state,
activations, KV cache) training ``--steps`` RL steps on a reasoning-gym task; settings rotate each repeat so
machine noise hits all alike. Reported per setting: the median peak RSS (meta.json's peak_rss_mb, the process's
ru_maxrss), the median seconds per step (metrics.jsonl's time/step after the first step), and the ratio of each
peak to the smallest setting's. A benchmark, not a test: these machines are shared and noisy.

Extra ``key=value`` settings after ``--`` go to every run (e.g. ``train.micro_batch_size=0`` to see the memory
without micro-batches).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the SmolLM2 study's task (experiments/sweeps/smollm2_arithmetic.yaml): one-digit sums, 32 new tokens
TASK = ["task.name=reasoning_gym", "task.dataset=basic_arithmetic",
        "task.dataset_args={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, operators: ['+'], "
        "allow_parentheses: false, allow_negation: false}", "task.answer_format=last_number",
        "task.eval_size=48", "rollout.max_new_tokens=32"]


def run_once(model: str, completions: int, micro: int, steps: int, out: Path, extra: list[str]) -> dict:
    """One training run in a child process; returns its peak RSS (MiB) and median s/step."""
    name = f"c{completions}_{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "objbench", "train", "--quiet", f"model.path={model}", *TASK,
           f"rollout.completions_per_step={completions}", "objective.group_size=8", f"train.micro_batch_size={micro}",
           f"train.steps={steps}", f"train.eval_every={steps}", "train.eval_size=8", "train.eval_samples=2",
           "train.checkpoint_every=0", "train.threads=2", f"out_dir={out}", f"name={name}", *extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    meta = json.loads((out / name / "meta.json").read_text())
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    per_step = [r["time/step"] for r in rows[1:]] or [rows[0]["time/step"]]
    return {"completions": completions, "peak_rss_mb": meta["peak_rss_mb"], "s_per_step": statistics.median(per_step),
            "wall_s": wall}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model folder (objbench models fetch ...)")
    ap.add_argument("--completions", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--micro", type=int, default=4, help="train.micro_batch_size")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default="", help="also write the runs here")
    ap.add_argument("extra", nargs="*", help="key=value settings for every run (after --)")
    a = ap.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            order = a.completions[r % len(a.completions):] + a.completions[:r % len(a.completions)]
            for c in order:
                runs.append(run_once(a.model, c, a.micro, a.steps, Path(tmp), a.extra))
                print(json.dumps(runs[-1]), flush=True)
    base = None
    print(f"\nmicro-batch {a.micro}; {' '.join(a.extra)}")
    print(f"{'completions':>11} {'peak RSS MiB':>13} {'ratio':>6} {'s/step':>7}")
    for c in sorted(a.completions):
        mine = [x for x in runs if x["completions"] == c]
        peak = statistics.median(x["peak_rss_mb"] for x in mine)
        base = base or peak
        print(f"{c:>11} {peak:>13.0f} {peak / base:>6.2f} {statistics.median(x['s_per_step'] for x in mine):>7.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write a fake sweep folder in the on-disk format, for tests and for trying the report without training.

The numbers are smooth made-up curves plus seeded noise; nothing here is a result. Usage::

    python -c "from analysis.synthetic import write_synthetic_sweep as w; w('/tmp/fake')"
    python -m analysis.report /tmp/fake
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["write_synthetic_sweep"]


def write_synthetic_sweep(
    path: str | Path,
    arms: Sequence[str] = ("ppo", "grpo", "dr_grpo"),
    seeds: Sequence[int] = (0, 1, 2),
    steps: int = 30,
    eval_every: int = 5,
    incomplete: Sequence[str] = (),
    name: str = "synthetic",
    seed: int = 0,
    sampled_buckets: bool = False,
) -> Path:
    """Create ``path/`` with sweep.json, sweep.yaml and one run folder per (arm, seed).

    Args:
        path: folder to create (may exist).
        arms, seeds: the grid; arm i learns fastest for larger i (its final accuracy is higher).
        steps: training steps per run; eval at step 0 and every ``eval_every`` steps (and the last step).
        incomplete: run folder names (``<arm>__s<seed>``) written half-way: no ``done`` file and a truncated last
            line in metrics.jsonl, as when a job is killed mid-write.
        name: sweep name.
        seed: seed of the noise.
        sampled_buckets: also log per-difficulty sampled accuracy ``eval/pass@1_d{1,2,3}`` in eval.jsonl.

    Returns:
        ``Path(path)``.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    spec = f"name: {name}\nbase: experiments/configs/tiny.yaml\narms: {list(arms)}\nseeds: {list(seeds)}\n"
    (root / "sweep.yaml").write_text(spec)
    sweep = {
        "name": name,
        "spec_hash": hashlib.sha256(spec.encode()).hexdigest()[:12],
        "command": f"objbench sweep experiments/sweeps/{name}.yaml",
        "arms": list(arms),
        "seeds": [int(s) for s in seeds],
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "base_config": "experiments/configs/tiny.yaml",
    }
    (root / "sweep.json").write_text(json.dumps(sweep, indent=2))
    for ai, arm in enumerate(arms):
        for s in seeds:
            run = f"{arm}__s{s}"
            rng = np.random.default_rng([seed, ai, int(s)])
            _write_run(root / run, run, arm, int(s), ai, len(arms), steps, eval_every, rng, sweep,
                       half=run in set(incomplete), sampled_buckets=sampled_buckets)
    return root


def _write_run(d: Path, run: str, arm: str, s: int, ai: int, n_arms: int, steps: int, eval_every: int,
               rng: np.random.Generator, sweep: dict, half: bool, sampled_buckets: bool = False) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(
        f"name: {arm}\nseed: {s}\nalgo:\n  preset: {arm}\n  clip:\n    low: 0.2\n    high: 0.28\n"
        f"optim:\n  lr: 1.0e-4\n"
    )
    meta = {"run": run, "arm": arm, "seed": s, "sweep": sweep["name"], "commit": sweep["commit"],
            "versions": {"python": "3.11", "torch": "2.13.0"}, "host": "synthetic",
            "start": "2026-01-01T00:00:00", "end": None if half else "2026-01-01T00:10:00"}
    (d / "meta.json").write_text(json.dumps(meta, indent=2))
    is_ppo = arm.startswith("ppo")
    ceiling = 0.45 + 0.35 * (ai + 1) / n_arms          # final accuracy grows with the arm index
    rate = 6.0 + 2.0 * ai
    tokens = 0
    t = 0.0
    lines = []
    n_steps = steps // 2 if half else steps
    for step in range(1, n_steps + 1):
        prog = 1.0 - np.exp(-step / rate)
        acc = float(np.clip(0.1 + (ceiling - 0.1) * prog + rng.normal(0, 0.03), 0, 1))
        len_c = 20 + 10 * prog * (1 - ai / n_arms) + rng.normal(0, 1)
        len_i = 24 + 20 * prog * (1 - ai / n_arms) + rng.normal(0, 1.5)
        gen = int(64 * (acc * len_c + (1 - acc) * len_i))
        tokens += gen
        t += 2.0 + rng.normal(0, 0.1)
        rec = {
            "step": step, "tokens": tokens, "time": round(t, 3),
            "reward/mean": acc, "reward/acc": acc,
            "reward/acc_d1": float(np.clip(acc + 0.2, 0, 1)), "reward/acc_d2": acc,
            "reward/acc_d3": float(np.clip(acc - 0.2, 0, 1)),
            "length/mean": acc * len_c + (1 - acc) * len_i, "length/correct": len_c, "length/incorrect": len_i,
            "rollout/trunc_frac": float(max(0.0, 0.05 - 0.002 * step + rng.normal(0, 0.005))),
            "policy/entropy": 1.5 * np.exp(-step / 40) + rng.normal(0, 0.02),
            "kl/exact": 0.002 * step * (1 + 0.3 * ai) + abs(rng.normal(0, 0.002)),
            "kl/k3": 0.002 * step * (1 + 0.3 * ai) + abs(rng.normal(0, 0.003)),
            "policy/clipfrac_low": 0.01 + abs(rng.normal(0, 0.003)),
            "policy/clipfrac_high": 0.02 + 0.01 * ai + abs(rng.normal(0, 0.003)),
            "adv/zero_var_frac": None if is_ppo else float(np.clip(0.2 + 0.4 * prog * ceiling + rng.normal(0, 0.03), 0, 1)),
            "optim/grad_norm": 1.0 + abs(rng.normal(0, 0.2)),
            "loss/total": float(rng.normal(0, 0.1)),
        }
        if is_ppo:
            rec["value/loss"] = 0.5 * np.exp(-step / 10) + abs(rng.normal(0, 0.01))
            rec["value/explained_var"] = float(np.clip(prog, 0, 1))
        lines.append(json.dumps(rec))
    text = "\n".join(lines) + "\n"
    if half:
        text += lines[-1][: len(lines[-1]) // 2]  # killed mid-write: truncated last line, no newline
    (d / "metrics.jsonl").write_text(text)

    evals = []
    tok_at = {json.loads(ln)["step"]: json.loads(ln)["tokens"] for ln in lines}
    eval_steps = [0] + [k for k in range(eval_every, n_steps + 1, eval_every)]
    if not half and eval_steps[-1] != steps:
        eval_steps.append(steps)
    for step in eval_steps:
        prog = 1.0 - np.exp(-step / rate)
        acc = float(np.clip(0.1 + (ceiling - 0.1) * prog + rng.normal(0, 0.04), 0, 1))
        rec = {
            "step": step, "tokens": tok_at.get(step, 0),
            "eval/acc": acc,
            "eval/acc_d1": float(np.clip(acc + 0.2, 0, 1)), "eval/acc_d2": acc,
            "eval/acc_d3": float(np.clip(acc - 0.2, 0, 1)),
            "eval/pass@1": acc, "eval/pass@4": float(1 - (1 - acc) ** 4),
            "eval/length": 22 + 10 * prog,
        }
        if sampled_buckets:
            rec.update({f"eval/pass@1_d{k}": float(np.clip(acc + 0.15 * (2 - k), 0, 1)) for k in (1, 2, 3)})
        evals.append(json.dumps(rec))
    (d / "eval.jsonl").write_text("\n".join(evals) + "\n")
    if not half:
        (d / "done").write_text("")

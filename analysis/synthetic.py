"""Write a fake sweep folder in the on-disk format, for tests and for trying the report without training.

The numbers are smooth made-up curves plus seeded noise; nothing here is a result. Usage::

    python -c "from objbench.analysis.synthetic import write_synthetic_sweep as w; w('/tmp/fake')"
    python -m objbench.analysis.report /tmp/fake
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


# ---------------------------------------------------------------------------------------------- study layouts

STUDY_ARMS = {
    "length_bias": ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"),
    "difficulty_bias": ("group_std", "batch_std", "no_std"),
    "kl_estimators": ("no_kl", "k1_reward", "k2_reward", "k3_reward", "k1_loss", "k2_loss", "k3_loss"),
    "off_policy": tuple(f"{o}-n_minibatches={k}" for o in ("grpo", "gspo") for k in (1, 2, 4)),
}
"""Arm names of each study sweep, as experiments/sweeps/<study>.yaml expands them."""


def write_study_sweep(path: str | Path, study: str, seeds: Sequence[int] = (0, 1, 2), steps: int = 60,
                      eval_every: int = 20, report: dict | None = None, seed: int = 0) -> Path:
    """A fake sweep in the layout of one of the committed studies (the keys its report section reads).

    On top of :func:`write_synthetic_sweep`: the study's arm names; its metrics (length_bias: samples.jsonl;
    difficulty_bias: ``adv/group_weight_k{k}``, ``adv/groups_k{k}`` and ``objective.group_size/adv.scale/adv.eps`` in
    config.yaml; kl_estimators: ``kl/exact_fwd``, ``kl/k1``, ``kl/k2``; off_policy: ``policy/log_ratio_std``,
    ``policy/seq_log_ratio_std``, identical mean rewards of grpo and gspo at one minibatch for the first steps);
    meta.json ``spec_hash`` and ``sft.weights_sha256`` (one warm start per seed); and the ``report:`` section
    ``report`` (default ``{"primary": "eval/pass@1", "study": study}``, the section the committed runs were made
    with) in both sweep.yaml and sweep.json, spec_hash recomputed.
    """
    import yaml

    if study not in STUDY_ARMS:
        raise ValueError(f"unknown study {study!r}; valid: {', '.join(STUDY_ARMS)}")
    arms = STUDY_ARMS[study]
    root = write_synthetic_sweep(path, arms=arms, seeds=seeds, steps=steps, eval_every=eval_every, name=study,
                                 seed=seed, sampled_buckets=True)
    report = report if report is not None else {"primary": "eval/pass@1", "study": study}
    spec = (root / "sweep.yaml").read_text() + yaml.safe_dump({"report": report}, sort_keys=False)
    (root / "sweep.yaml").write_text(spec)
    info = json.loads((root / "sweep.json").read_text())
    info.update(spec_hash=hashlib.sha256(spec.encode()).hexdigest()[:12], report=report)
    (root / "sweep.json").write_text(json.dumps(info, indent=2))
    G = 8
    for ai, arm in enumerate(arms):
        for s in seeds:
            d = root / f"{arm}__s{s}"
            rng = np.random.default_rng([seed, 99, ai, int(s)])
            meta = json.loads((d / "meta.json").read_text())
            meta.update(spec_hash=info["spec_hash"], sft={"weights_sha256": f"warm{int(s):012d}"})
            (d / "meta.json").write_text(json.dumps(meta, indent=2))
            scale = ("group", "batch", "none")[ai % 3]
            (d / "config.yaml").write_text((d / "config.yaml").read_text() + yaml.safe_dump(
                {"objective": {"group_size": G, "n_minibatches": 1, "adv": {"scale": scale, "eps": 1e-6}}}))
            recs = [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines()]
            samples = []
            for r in recs:
                step = r["step"]
                r["kl/exact_fwd"] = 2 * r["kl/exact"] + abs(rng.normal(0, 0.002))
                r["kl/k1"] = r["kl/exact"] + rng.normal(0, 0.003)
                r["kl/k2"] = 0.5 * r["kl/exact"] + abs(rng.normal(0, 0.001))
                r["policy/log_ratio_std"] = 0.01 * (1 + ai % 3) + abs(rng.normal(0, 0.002))
                r["policy/seq_log_ratio_std"] = r["policy/log_ratio_std"] / 2
                if study == "off_policy" and arm.endswith("=1") and step <= 10:
                    r["reward/mean"] = float(np.round(0.3 + 0.01 * step + 0.001 * int(s), 6))
                counts = rng.multinomial(G, [0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
                for k, n in enumerate(counts):
                    if n:
                        r[f"adv/groups_k{k}"] = int(n)
                        w = 2 * k * (G - k) / G
                        if scale == "group" and 0 < k < G:
                            w /= np.sqrt(k * (G - k) / (G * (G - 1))) + 1e-6
                        r[f"adv/group_weight_k{k}"] = float(w)
                for _ in range(4):
                    ok = bool(rng.random() < r["reward/acc"])
                    samples.append({"step": step, "prompt": "1+2=", "response": "." * int(rng.integers(0, 5)) + "3",
                                    "reward": float(ok), "correct": ok})
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
            (d / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in samples))
    return root

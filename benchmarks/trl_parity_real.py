"""objbench vs TRL's GRPOTrainer on a real pretrained model (issue 29 item 5), side by side in one invocation.

    objbench models fetch smollm2-135m-instruct models/smollm2-135m-instruct
    pip install -e ".[dev,real,trl]"
    python -m benchmarks.trl_parity_real --model-dir models/smollm2-135m-instruct --out results/trl_parity_real

The workload is the committed SmolLM2 study's (experiments/sweeps/smollm2_arithmetic.yaml): reasoning-gym's
one-digit sums with the model's chat template, 4 prompts x G = 8 = 32 completions of at most 32 new tokens per
optimizer step, temperature 1, lr 3e-6, GRPO as TRL writes it (benchmarks/trl_parity.objbench_overrides: group-std
advantages, token-level ratio clipped at 0.2, per-sequence token mean, one update per rollout, beta 0). Both
frameworks start from the same folder and read the same prompt texts in the same order: objbench's task draws them
(``task.prompts(data seed, ...)``) and renders them with the chat template (``Codec.prompt_texts``); TRL gets those
strings as plain (already templated) prompts, and both tokenizers add no special tokens to them (SmolLM2's
tokenizer adds none). TRL's reward function is objbench's task reward (reasoning-gym's own ``score_answer`` on the
last number of the reply, in objbench's scorer worker), so the rewards are one function.

Numerics: one TRL-generated batch, TRL's loss and gradient against objbench's (``trl_parity.objbench_on_trl_batch``)
at beta 0 and at beta 0.04 (TRL's bias-corrected k3 against objbench's ``k3_ratio``, the policy moved away from the
reference by 1e-3 x N(0, 1) per weight so the KL term is not zero). Timing: each run is a fresh child process
(its peak RSS its own) alternating TRL and objbench, both at their fastest (TRL without activation checkpointing;
objbench with its defaults: the lean forward and sampler of rollout/fastlm.py, whole-batch updates); step time is
the wall time between the ends of consecutive optimizer steps, everything included; the first ``--skip`` steps
of each run are dropped; a run's figure is its median step, a setting's the median over repeats.
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

from benchmarks import trl_parity as TP
from objbench.experiments.run.provenance import peak_rss_mb

PROMPTS_PER_STEP, GROUP_SIZE, MAX_NEW_TOKENS, LR = 4, 8, 32, 3e-6
TASK = {"name": "reasoning_gym", "dataset": "basic_arithmetic", "answer_format": "last_number", "eval_size": 48,
        "dataset_args": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
                         "allow_parentheses": False, "allow_negation": False}}
KINDS = ("trl", "objbench")


def real_config(model_dir: str, beta: float, kl_estimator: str = "k3_ratio", threads: int = 0):
    """The workload as an objbench TrainConfig: TRL's GRPO (trl_parity.objbench_overrides) at this model's sizes."""
    from objbench.experiments.config import load_config

    sizes = [f"rollout.completions_per_step={PROMPTS_PER_STEP * GROUP_SIZE}",
             f"rollout.max_new_tokens={MAX_NEW_TOKENS}", f"optim.lr={LR}", "sft.steps=0",
             f"train.threads={threads}"]
    return load_config(None, [*TP.objbench_overrides(beta, kl_estimator), *sizes],
                       extra={"model": {"path": model_dir}, "task": TASK})


def prompt_rows(model_dir: str, n: int) -> tuple[list[str], list]:
    """The first n training prompts of the workload's data seed, as objbench renders them, and their problems."""
    from transformers import AutoTokenizer

    from objbench.experiments.config import build_task
    from objbench.rollout.bundle import hf_codec

    cfg = real_config(model_dir, 0.0)
    task = build_task(cfg)
    problems = task.prompts(cfg.effective_data_seed, 0, n)
    return hf_codec(AutoTokenizer.from_pretrained(model_dir)).prompt_texts(problems), problems


def run_objbench(model_dir: str, beta: float, steps: int, threads: int) -> dict:
    from objbench.experiments.run.setup import build_setup

    s = build_setup(real_config(model_dir, beta, threads=threads))
    s.policy.train()
    res = TP.objbench_timed(s, steps)
    del res["rows"]
    return {**res, "forward": s.forward}


class TaskReward:
    """TRL reward function: objbench's task reward of each completion (truncated = no EOS among its ids)."""

    __name__ = "objbench_task_reward"

    def __init__(self, task, problems: list, eos_id: int):
        self.task, self.problems, self.eos_id = task, problems, eos_id

    def __call__(self, prompts, completions, completion_ids, idx, **kwargs) -> list[float]:
        return [self.score(i, text, ids) for i, text, ids in zip(idx, completions, completion_ids)]

    def score(self, i: int, text: str, ids: list[int]) -> float:
        return float(self.task.reward(self.problems[i], text, self.eos_id not in ids).reward)


def make_trl_trainer(model_dir: str, beta: float, steps: int, out_dir: str, bias_correction: bool = True):
    """TRL's GRPOTrainer at its fastest on the workload, and its reward function."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from objbench.experiments.config import build_task

    n = PROMPTS_PER_STEP * GROUP_SIZE
    texts, problems = prompt_rows(model_dir, steps * PROMPTS_PER_STEP)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    reward = TaskReward(build_task(real_config(model_dir, beta)), problems, tokenizer.eos_token_id)
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=n, gradient_accumulation_steps=1, num_generations=GROUP_SIZE,
        max_completion_length=MAX_NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9, adam_beta2=0.999,
        adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch",
        beta=beta, epsilon=0.2, loss_type="grpo", scale_rewards="group", num_iterations=1,
        use_bias_correction_kl=bias_correction, mask_truncated_completions=False, shuffle_dataset=False,
        max_steps=steps, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        use_cpu=True, bf16=False, fp16=False, seed=0, dataloader_num_workers=0, gradient_checkpointing=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    data = Dataset.from_dict({"prompt": texts, "idx": list(range(len(texts)))})
    return GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                       processing_class=tokenizer), reward


def run_trl(model_dir: str, beta: float, steps: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tr, _ = make_trl_trainer(model_dir, beta, steps, tmp)
        times = TP.trl_timed(tr)
    logs = [h for h in tr.state.log_history if "reward" in h]
    n = PROMPTS_PER_STEP * GROUP_SIZE
    return {"times": times, "rewards": [h["reward"] for h in logs],
            "tokens": [h["completions/mean_length"] * n for h in logs], "peak_rss_mb": peak_rss_mb()}


def numerics(model_dir: str, beta: float) -> dict:
    """TRL's and objbench's loss and gradient on one TRL batch (same weights, completions, rewards)."""
    with tempfile.TemporaryDirectory() as tmp:
        tr, reward = make_trl_trainer(model_dir, beta, 1, tmp)
    model, inputs, batch, loss_trl, g_trl = TP.trl_step(tr, PROMPTS_PER_STEP, GROUP_SIZE, move=1e-3 if beta else 0.0)
    obj = real_config(model_dir, beta).objective
    texts = tr.processing_class.batch_decode(batch["completion_ids"], skip_special_tokens=True)
    c_ids, c_mask = batch["completion_ids"], batch["completion_mask"].bool()
    rewards = [reward.score(x["idx"], t, ids[m].tolist()) for x, t, ids, m in zip(inputs, texts, c_ids, c_mask)]
    return {"beta": beta, "objbench_kl_estimator": "k3_ratio" if beta else None,
            "prompts_identical": same_prompt_ids(tr.processing_class, batch,
                                                 [reward.problems[x["idx"]] for x in inputs]),
            **TP.objbench_on_trl_batch(obj, model, batch, rewards, model_dir if beta else None, loss_trl, g_trl)}


def trl_split(model_dir: str, steps: int, skip: int) -> dict:
    """Where a TRL step's time goes: model.generate, the rest of _generate_and_score_completions (rewards, the
    old/reference log-prob passes), compute_loss (the loss forward) and everything else (backward, optimizer,
    Trainer bookkeeping); seconds per step, medians over the steps after ``skip``."""
    spent: dict[str, list[float]] = {"generate": [], "generate_and_score": [], "loss_forward": []}

    def timed(obj, name: str, key: str) -> None:
        inner = getattr(obj, name)

        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            out = inner(*a, **kw)
            spent[key].append(time.perf_counter() - t0)
            return out

        setattr(obj, name, wrapper)

    with tempfile.TemporaryDirectory() as tmp:
        tr, _ = make_trl_trainer(model_dir, 0.0, steps, tmp)
        timed(tr.model, "generate", "generate")
        timed(tr, "_generate_and_score_completions", "generate_and_score")
        timed(tr, "compute_loss", "loss_forward")
        totals = TP.trl_timed(tr)
    med = {k: statistics.median(v[skip:]) for k, v in spent.items()}
    total = statistics.median(totals[skip:])
    return {"total": total, "generate": med["generate"], "score": med["generate_and_score"] - med["generate"],
            "loss_forward": med["loss_forward"],
            "backward_optimizer_other": total - med["generate_and_score"] - med["loss_forward"]}


def objbench_split(model_dir: str, steps: int, skip: int, threads: int) -> dict:
    """objbench bench (experiments/bench.py) on the same workload: seconds per step by phase."""
    from objbench.experiments.cli.bench import bench
    from objbench.experiments.config import to_yaml

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "workload.yaml"
        path.write_text(to_yaml(real_config(model_dir, 0.0, threads=threads)))
        res = bench(str(path), steps=steps - skip, warmup=skip, quiet=True)
    return {"total": res["s_per_step"], **res["phases"]}


def same_prompt_ids(tokenizer, batch, problems) -> bool:
    """Whether TRL's prompt ids (padding dropped) are objbench's encoding of the same problems."""
    from objbench.rollout.bundle import hf_codec

    ids, mask = hf_codec(tokenizer).encode_prompts(problems)
    trl_ids, trl_mask = batch["prompt_ids"], batch["prompt_mask"].bool()
    return all(a[m].tolist() == b[n].tolist() for a, m, b, n in zip(ids, mask, trl_ids, trl_mask))


def _child(args) -> int:
    torch.set_num_threads(args.threads)
    run = run_objbench if args.worker == "objbench" else run_trl
    res = run(args.model_dir, args.beta, args.steps, args.threads)
    res["threads"] = torch.get_num_threads()
    Path(args.result).write_text(json.dumps(res))
    return 0


def _spawn(kind: str, args) -> dict:
    res = TP.spawn_worker("benchmarks.trl_parity_real", kind, args.model_dir, 0.0, args.steps, args.threads)
    res["median_s"] = statistics.median(res["times"][args.skip:])
    return res


def timed_runs(args) -> dict[str, list[dict]]:
    """args.repeats rounds of one TRL and one objbench run, the order swapped every round."""
    runs: dict[str, list[dict]] = {k: [] for k in KINDS}
    for r in range(args.repeats):
        for kind in (KINDS if r % 2 == 0 else KINDS[::-1]):
            res = _spawn(kind, args)
            runs[kind].append(res)
            print(f"  repeat {r} {kind:8s} {res['median_s']:7.2f} s/step  peak RSS {res['peak_rss_mb']:.0f} MB  "
                  f"mean reward {statistics.mean(res['rewards']):.3f}", flush=True)
    return runs


def _seconds(runs: list[dict]) -> str:
    return ", ".join(f"{x['median_s']:.2f}" for x in runs)


def render(rows: dict, checks: list[dict], args, versions: dict) -> str:
    t, o = rows["trl"], rows["objbench"]
    mt, mo = (statistics.median(x["median_s"] for x in rs) for rs in (t, o))
    ratios = [a["median_s"] / b["median_s"] for a, b in zip(t, o)]

    def tok_s(rs):
        return statistics.median(statistics.mean(x["tokens"][args.skip:]) / x["median_s"] for x in rs)

    lines = [f"TRL parity on a real model ({Path(args.model_dir).name}): {args.repeats} alternating repeats x "
             f"{args.steps} steps (median step of each run after {args.skip} warm-up steps; median over repeats); "
             f"torch {versions['torch']}, transformers {versions['transformers']}, trl {versions['trl']}, "
             f"{args.threads} threads, commit {versions['commit']}", "",
             "Workload: reasoning-gym one-digit sums, chat template, 4 prompts x 8 = 32 completions of at most 32 "
             "tokens per step, GRPO (beta 0) as TRL writes it; TRL without activation checkpointing, objbench with "
             "its defaults. Speed-up = TRL s/step / objbench s/step.", "",
             "| TRL s/step | objbench s/step | speed-up | per repeat | TRL tok/s | objbench tok/s "
             "| TRL peak RSS MB | objbench peak RSS MB |", "|---|---|---|---|---|---|---|---|",
             f"| {mt:.2f} | {mo:.2f} | **{mt / mo:.2f}x** | {', '.join(f'{r:.2f}' for r in ratios)} | "
             f"{tok_s(t):.0f} | {tok_s(o):.0f} | {max(x['peak_rss_mb'] for x in t):.0f} | "
             f"{max(x['peak_rss_mb'] for x in o):.0f} |", "",
             f"Per-run medians (s/step): TRL {_seconds(t)}; objbench {_seconds(o)}. "
             f"objbench's forward: {o[0].get('forward')}.",
             "", "Numerics on one TRL batch (same weights, completions and rewards):", "",
             "| beta | objbench KL estimator | loss TRL | loss objbench | |loss diff| | max |grad diff| | grad norm "
             "| max |adv diff| | tokens | mean reward |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {c['beta']} | {c['objbench_kl_estimator'] or '-'} | {c['loss_trl']:.7f} | "
                     f"{c['loss_objbench']:.7f} | {c['loss_abs_diff']:.1e} | {c['grad_max_abs_diff']:.1e} | "
                     f"{c['grad_norm']:.4f} | {c['adv_max_abs_diff']:.1e} | {c['n_tokens']} | "
                     f"{c['reward_mean']:.3f} |")
    return "\n".join(lines) + "\n"


def phase_split(args) -> dict:
    return {"trl": trl_split(args.model_dir, args.steps, args.skip),
            "objbench": objbench_split(args.model_dir, args.steps, args.skip, args.threads)}


def write_split(args) -> int:
    """--split-only: the per-phase split alone (into OUT/trl_parity_split.md and .json)."""
    split = phase_split(args)
    text = render_split(split)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "trl_parity_split.md").write_text(text)
        (out / "trl_parity_split.json").write_text(json.dumps({"split": split, "argv": sys.argv,
                                                               "versions": TP.versions()}, indent=1))
    return 0


def render_split(split: dict) -> str:
    lines = ["", "Where a step's time goes (seconds per step, medians after the warm-up steps; one run each, after the "
             "timed runs):", ""]
    for kind, parts in split.items():
        total = parts["total"]
        cells = ", ".join(f"{k} {v:.2f} s ({v / total:.0%})" for k, v in parts.items() if k != "total")
        lines.append(f"- {kind}: {total:.2f} s/step: {cells}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="the SmolLM2 folder (objbench models fetch ...)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps dropped from each run's median")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in each run")
    ap.add_argument("--numerics-only", action="store_true")
    ap.add_argument("--split-only", action="store_true",
                    help="only where each side's step time goes (the full run ends with it too)")
    ap.add_argument("--out", default="", help="also write the table and raw numbers to this folder")
    TP.add_worker_arguments(ap, KINDS)
    args = ap.parse_args(argv)
    if args.worker:
        return _child(args)
    if TP.trl_missing():
        return 2
    if not (Path(args.model_dir) / "config.json").is_file():
        print(f"{args.model_dir}: no model folder (objbench models fetch smollm2-135m-instruct DIR)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    if args.split_only:
        return write_split(args)
    checks = [numerics(args.model_dir, beta) for beta in (0.0, 0.04)]
    for c in checks:
        print(f"numerics beta={c['beta']}: |loss diff| {c['loss_abs_diff']:.1e}, max |grad diff| "
              f"{c['grad_max_abs_diff']:.1e} (grad norm {c['grad_norm']:.3f}), max |adv diff| "
              f"{c['adv_max_abs_diff']:.1e}, mean reward {c['reward_mean']:.3f}, same prompt ids: "
              f"{c['prompts_identical']}", flush=True)
    if args.numerics_only:
        return 0
    runs = timed_runs(args)
    split = phase_split(args)
    versions = TP.versions()
    text = render(runs, checks, args, versions) + render_split(split)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "trl_parity_real.md").write_text(text)
        (out / "trl_parity_real.json").write_text(json.dumps({"runs": runs, "numerics": checks, "split": split,
                                                              "argv": sys.argv, "versions": versions}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

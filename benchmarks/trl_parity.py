"""objbench vs TRL's GRPOTrainer on one identical CPU workload (issue 6), side by side in one invocation.

    pip install -e ".[dev,trl]"
    python -m benchmarks.trl_parity                  # 5 alternating repeats x {beta=0, beta=0.04}, 30 steps each
    python -m benchmarks.trl_parity --numerics-only  # just the loss/gradient equality check

The workload is benchmarks/workload.py (tiny Llama, 15-token character tokenizer, 2-digit addition, 32 prompts
x G=8 = 256 completions per optimizer step, at most 8 new tokens). Both frameworks start from the same
warm-started weights (trained once here, saved with save_pretrained / safetensors) and read the same prompts in
the same order. Each run is a fresh child process (so its peak RSS is its own); runs rotate through TRL,
TRL-default and objbench (the order shifts every repeat) so machine noise hits all alike.

TRL is timed twice: at its fastest on this workload (``gradient_checkpointing=False``; GRPOConfig defaults to
True, which recomputes activations in the backward pass and only pays off when memory is short) and with
GRPOConfig's defaults as a second row. The headline speed-up is against the fastest TRL.

Step time = wall time between the ends of consecutive optimizer steps, everything included (generation,
reward, reference pass, loss, backward, optimizer, metrics, logging); the first ``--skip`` steps of each run
are dropped as warm-up; a run's figure is the median over its steps, a setting's figure the median over
repeats.

KL term (beta = 0.04): TRL 1.16 multiplies k3 by the differentiable importance ratio by default
(``use_bias_correction_kl=True``). objbench's matching estimator is ``k3_ratio`` (algos/kl.py), so the timed
runs compare TRL's default against objbench with ``objective.kl.estimator=k3_ratio``; the numerics check
covers both pairs (TRL default vs k3_ratio, and TRL with the correction off vs plain k3).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import workload as W
from objbench.experiments.run.loop_state import LoopState
from objbench.experiments.run.provenance import peak_rss_mb  # VmHWM: each child's own peak, not its parent's


def objbench_overrides(beta: float, kl_estimator: str = "k3_ratio") -> list[str]:
    """The workload's GRPO as objbench config overrides (everything else is objbench's grpo preset)."""
    kl = (["objective.kl.placement=loss", f"objective.kl.beta={beta}", f"objective.kl.estimator={kl_estimator}"]
          if beta else ["objective.kl.placement=none", "objective.kl.beta=0", "log.ref_kl=false"])
    return ["objective=grpo", f"objective.group_size={W.GROUP_SIZE}", "objective.adv.scale=group",
            "objective.adv.eps=1e-4", "objective.ratio.level=token", "objective.ratio.eps_low=0.2",
            "objective.ratio.eps_high=0.2", "objective.loss.agg=seq_mean_token_mean",
            "objective.loss.entropy_coef=0.0", "objective.n_epochs=1", "objective.n_minibatches=1",
            f"rollout.completions_per_step={W.PROMPTS_PER_STEP * W.GROUP_SIZE}",
            f"rollout.max_new_tokens={W.MAX_NEW_TOKENS}", "rollout.temperature=1.0", "rollout.top_p=1.0",
            "optim.lr=1e-4", "optim.beta1=0.9", "optim.beta2=0.999", "optim.weight_decay=0.0",
            "optim.grad_clip=1.0", "seed=0", *kl]


KINDS = ("trl", "trl_default", "objbench")

# ---------------------------------------------------------------------------------------------------------
# objbench


def run_objbench(model_dir: str, beta: float, steps: int) -> dict:
    from objbench.experiments.config import load_config
    from objbench.experiments.run.setup import make_setup
    from objbench.rollout.sft import load_policy

    cfg = load_config(None, objbench_overrides(beta))
    task = W.UniformAddition(n=steps * W.PROMPTS_PER_STEP)
    s = make_setup(cfg, task, W.build_tokenizer(), load_policy(Path(model_dir), "sdpa"))
    s.policy.train()
    res = objbench_timed(s, steps)
    res["last_row"] = {k: v for k, v in res.pop("rows")[-1].items() if isinstance(v, (int, float))}
    return res


def objbench_timed(s, steps: int) -> dict:
    """``steps`` training steps of setup ``s``: step times (end to end), rewards, tokens, the rows, peak RSS."""
    from objbench.experiments.run.setup import make_optimizers
    from objbench.experiments.run.train import train_step

    opt, critic_opt = make_optimizers(s)
    state = LoopState()
    times, rows = [], []
    t_prev = time.perf_counter()
    for _ in range(steps):
        row, _ = train_step(s, state, opt, critic_opt)
        now = time.perf_counter()
        times.append(now - t_prev)
        t_prev = now
        rows.append(row)
    return {"times": times, "rewards": [r["reward/mean"] for r in rows], "tokens": [r["rollout/tokens"] for r in rows],
            "peak_rss_mb": peak_rss_mb(), "rows": rows}


# ---------------------------------------------------------------------------------------------------------
# TRL


def trl_dataset(steps: int):
    from datasets import Dataset

    ps = W.pairs(1234, steps * W.PROMPTS_PER_STEP)
    return Dataset.from_dict({"prompt": [f"<bos>{a}+{b}=" for a, b in ps],
                              "a": [a for a, _ in ps], "b": [b for _, b in ps]})


def trl_reward(prompts, completions, completion_ids, a, b, **kwargs):
    return [W.reward_ids(ai, bi, ids) for ai, bi, ids in zip(a, b, completion_ids)]


def make_trl_trainer(model_dir: str, beta: float, steps: int, out_dir: str, bias_correction: bool = True,
                     fastest: bool = True, scale_rewards: str = "group", trainer_cls=None, **trainer_kw):
    """TRL's GRPOTrainer (or ``trainer_cls``, e.g. objbench.integrations.trl.ObjbenchGRPOTrainer, given
    ``trainer_kw``) on the workload; ``fastest`` turns off GRPOConfig's default activation checkpointing."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    n = W.PROMPTS_PER_STEP * W.GROUP_SIZE
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=n, gradient_accumulation_steps=1, num_generations=W.GROUP_SIZE,
        max_completion_length=W.MAX_NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9, adam_beta2=0.999,
        adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch",
        beta=beta, epsilon=0.2, loss_type="grpo", scale_rewards=scale_rewards, num_iterations=1,
        use_bias_correction_kl=bias_correction, mask_truncated_completions=False, shuffle_dataset=False,
        max_steps=steps, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        use_cpu=True, bf16=False, fp16=False, seed=0, dataloader_num_workers=0,
        **({"gradient_checkpointing": False} if fastest else {}))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    return (trainer_cls or GRPOTrainer)(model=model, reward_funcs=trl_reward, args=args,
                                        train_dataset=trl_dataset(steps), processing_class=W.build_tokenizer(),
                                        **trainer_kw)


def run_trl(model_dir: str, beta: float, steps: int, fastest: bool = True) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tr = make_trl_trainer(model_dir, beta, steps, tmp, fastest=fastest)
        times = trl_timed(tr)
    logs = [h for h in tr.state.log_history if "reward" in h]
    n = W.PROMPTS_PER_STEP * W.GROUP_SIZE
    return {"times": times, "rewards": [h["reward"] for h in logs],
            "tokens": [h["completions/mean_length"] * n for h in logs], "peak_rss_mb": peak_rss_mb(),
            "gradient_checkpointing": bool(tr.args.gradient_checkpointing)}


def trl_timed(tr) -> list[float]:
    """Train ``tr`` (a TRL trainer); the wall time of each optimizer step, end to end."""
    from transformers import TrainerCallback

    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    tr.add_callback(Clock())
    tr.train()
    return [b - a for a, b in zip(marks, marks[1:])]


# ---------------------------------------------------------------------------------------------------------
# numerics: one identical batch through both losses


def trl_step(tr, n_prompts: int = W.PROMPTS_PER_STEP, group_size: int = W.GROUP_SIZE, move: float = 0.02):
    """One TRL batch and TRL's loss and gradient on it: (model, inputs, batch, loss, {name: grad}). The policy is
    first moved away from the reference (the saved weights) by ``move`` x N(0, 1) per weight, so that a KL term and
    its gradient are not zero."""
    model = tr.model
    model.train()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(move * torch.randn_like(p))
    inputs = [tr.train_dataset[i] for i in range(n_prompts) for _ in range(group_size)]
    tr.current_gradient_accumulation_steps = 1
    batch = tr._generate_and_score_completions(inputs)
    model.zero_grad(set_to_none=True)
    loss = tr.compute_loss(model, batch)
    loss.backward()
    return model, inputs, batch, loss, {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                        if p.grad is not None}


def numerics(model_dir: str, beta: float, bias_correction: bool = True) -> dict:
    """Loss and gradient of TRL and objbench on one TRL-generated batch, same weights, same completions."""
    from objbench.experiments.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        tr = make_trl_trainer(model_dir, beta, 1, tmp, bias_correction=bias_correction)
    model, inputs, batch, loss_trl, g_trl = trl_step(tr)
    est = "k3_ratio" if bias_correction else "k3"
    obj = load_config(None, objbench_overrides(beta, est)).objective
    c_ids, c_mask = batch["completion_ids"], batch["completion_mask"].bool()
    rewards = [W.reward_ids(x["a"], x["b"], ids[m].tolist()) for x, ids, m in zip(inputs, c_ids, c_mask)]
    return {"beta": beta, "trl_kl_bias_correction": bias_correction, "objbench_kl_estimator": est if beta else None,
            **objbench_on_trl_batch(obj, model, batch, rewards, model_dir if beta else None, loss_trl, g_trl)}


def objbench_on_trl_batch(obj, model, batch, rewards: list[float], ref_dir: str | None, loss_trl, g_trl) -> dict:
    """objbench's advantages, loss and gradient (objective ``obj``) on TRL's batch, with the rewards objbench's
    task gives its completions and the reference loaded from ``ref_dir`` (None: no KL term), against TRL's."""
    from objbench import algos
    from objbench.rollout.models import frozen_copy
    from objbench.rollout.scoring import score
    from objbench.rollout.sft import load_policy

    p_ids, p_mask = batch["prompt_ids"], batch["prompt_mask"].bool()
    c_ids, c_mask = batch["completion_ids"], batch["completion_mask"].bool()
    trl_mask = batch["completion_mask"]  # TRL's own dtype (int64), given to algos as a peer would
    assert trl_mask.dtype != torch.bool
    rewards = torch.tensor(rewards, dtype=torch.float32)
    with torch.no_grad():
        ref_logp = None
        if ref_dir is not None:
            ref = frozen_copy(load_policy(Path(ref_dir), "sdpa"))
            ref_logp = score(ref, p_ids, p_mask, c_ids, c_mask, with_entropy=False).logp
        adv, _, _ = algos.compute_advantages(obj, rewards=rewards, mask=trl_mask)
    model.zero_grad(set_to_none=True)
    sc = score(model, p_ids, p_mask, c_ids, c_mask)
    loss_ob, _ = algos.compute_loss(obj, logp=sc.logp, old_logp=sc.logp.detach(), advantages=adv, mask=trl_mask,
                                    ref_logp=ref_logp, entropy=sc.entropy)
    loss_ob.backward()
    g_ob = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    assert g_ob.keys() == g_trl.keys()
    max_grad_diff = max(float((g_ob[n] - g_trl[n]).abs().max()) for n in g_ob)
    gnorm = float(torch.sqrt(sum((g ** 2).sum() for g in g_trl.values())))
    adv_trl = batch["advantages"].flatten()
    return {"loss_trl": float(loss_trl.detach()), "loss_objbench": float(loss_ob.detach()),
            "loss_abs_diff": abs(float(loss_trl.detach()) - float(loss_ob.detach())),
            "grad_max_abs_diff": max_grad_diff, "grad_norm": gnorm,
            "adv_max_abs_diff": float((adv[:, 0] if adv.dim() == 2 else adv).sub(adv_trl).abs().max()),
            "n_tokens": int(c_mask.sum()), "reward_mean": float(rewards.mean()), "mask_dtype": str(trl_mask.dtype)}


# ---------------------------------------------------------------------------------------------------------
# driver


def _child(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker == "objbench":
        res = run_objbench(args.model_dir, args.beta, args.steps)
    else:
        res = run_trl(args.model_dir, args.beta, args.steps, fastest=args.worker == "trl")
    res["threads"] = torch.get_num_threads()
    Path(args.result).write_text(json.dumps(res))
    return 0


def add_worker_arguments(ap: argparse.ArgumentParser, kinds) -> None:
    """The hidden arguments spawn_worker passes to a benchmark's own module (besides --model-dir, --steps,
    --threads, which the benchmark also takes from users)."""
    ap.add_argument("--worker", choices=list(kinds), help=argparse.SUPPRESS)
    ap.add_argument("--beta", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)


def trl_missing() -> bool:
    """True (and says how to install it) when TRL is not importable."""
    if importlib.util.find_spec("trl") is None:
        print("TRL is not installed: pip install -e '.[trl]'", file=sys.stderr)
        return True
    return False


def spawn_worker(module: str, kind: str, model_dir: str, beta: float, steps: int, threads: int) -> dict:
    """Run ``python -m module --worker kind ...`` in a fresh process (its peak RSS its own) and return the result
    it wrote; RuntimeError with the end of its stderr when it fails."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [sys.executable, "-m", module, "--worker", kind, "--model-dir", model_dir,
           "--beta", str(beta), "--steps", str(steps), "--result", str(out), "--threads", str(threads)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} run failed (beta={beta}):\n{proc.stderr[-3000:]}")
    res = json.loads(out.read_text())
    out.unlink()
    return res


def save_warm_model(path: Path) -> list[float]:
    model = W.build_model()
    losses = W.warm_start(model)
    model.save_pretrained(path)
    return losses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps dropped from each run's median")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in each run (0: torch's default)")
    ap.add_argument("--settings", default="0,0.04", help="comma-separated betas")
    ap.add_argument("--numerics-only", action="store_true")
    ap.add_argument("--out", default="", help="also write the table and raw numbers to this folder")
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    add_worker_arguments(ap, KINDS)
    args = ap.parse_args(argv)
    if args.worker:
        return _child(args)
    if trl_missing():
        return 2
    betas = [float(b) for b in args.settings.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "warm"
        t0 = time.perf_counter()
        sft_losses = save_warm_model(model_dir)
        print(f"warm start: {W.SFT_STEPS} steps in {time.perf_counter() - t0:.1f}s, final loss {sft_losses[-1]:.4f}")
        checks = []
        for beta in betas:
            for bc in ([True, False] if beta else [True]):
                c = numerics(str(model_dir), beta, bc)
                checks.append(c)
                ok = c["loss_abs_diff"] <= 1e-5 and c["grad_max_abs_diff"] <= 1e-5
                print(f"numerics beta={beta} TRL bias_correction={bc} vs objbench {c['objbench_kl_estimator']}: "
                      f"loss {c['loss_trl']:.7f} vs {c['loss_objbench']:.7f} (|diff| {c['loss_abs_diff']:.1e}), "
                      f"max |grad diff| {c['grad_max_abs_diff']:.1e} (grad norm {c['grad_norm']:.3f}), "
                      f"max |adv diff| {c['adv_max_abs_diff']:.1e}: {'OK' if ok else 'MISMATCH'}")
        if args.numerics_only:
            return 0
        runs = {(k, b): [] for k in KINDS for b in betas}
        for r in range(args.repeats):
            for beta in betas:
                order = KINDS[r % 3:] + KINDS[:r % 3]  # rotate, so no kind always runs first or last
                for kind in order:
                    res = spawn_worker("benchmarks.trl_parity", kind, str(model_dir), beta, args.steps, args.threads)
                    med = statistics.median(res["times"][args.skip:])
                    res["median_s"] = med
                    runs[(kind, beta)].append(res)
                    print(f"  repeat {r} beta={beta} {kind:11s} {med * 1000:7.1f} ms/step  "
                          f"final reward {statistics.mean(res['rewards'][-5:]):.3f}", flush=True)
    rows = []
    for beta in betas:
        t, td, o = runs[("trl", beta)], runs[("trl_default", beta)], runs[("objbench", beta)]
        mt = statistics.median(x["median_s"] for x in t)
        mtd = statistics.median(x["median_s"] for x in td)
        mo = statistics.median(x["median_s"] for x in o)
        # per-repeat ratios: each pair of runs was made in the same rotation, close in time
        ratios = [a["median_s"] / b["median_s"] for a, b in zip(t, o)]

        def tok_s(rs):
            return statistics.median(statistics.mean(x["tokens"][args.skip:]) / x["median_s"] for x in rs)

        rows.append({"beta": beta, "trl_s_per_step": mt, "trl_default_s_per_step": mtd, "objbench_s_per_step": mo,
                     "speedup": mt / mo, "speedup_vs_default": mtd / mo,
                     "speedup_per_repeat": ratios, "speedup_per_repeat_min": min(ratios),
                     "trl_default_runs_s": [x["median_s"] for x in td],
                     "trl_default_peak_rss_mb": max(x["peak_rss_mb"] for x in td),
                     "trl_tokens_per_s": tok_s(t), "objbench_tokens_per_s": tok_s(o),
                     "trl_peak_rss_mb": max(x["peak_rss_mb"] for x in t),
                     "objbench_peak_rss_mb": max(x["peak_rss_mb"] for x in o),
                     "trl_reward": [statistics.mean(v) for v in zip(*(x["rewards"] for x in t))],
                     "objbench_reward": [statistics.mean(v) for v in zip(*(x["rewards"] for x in o))],
                     "trl_runs_s": [x["median_s"] for x in t], "objbench_runs_s": [x["median_s"] for x in o]})
    text = render(rows, checks, args)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "trl_parity.md").write_text(text)
        (out / "trl_parity.json").write_text(json.dumps({"rows": rows, "numerics": checks, "argv": sys.argv,
                                                         "versions": versions()}, indent=1))
    return 0


def versions() -> dict:
    import trl

    from objbench.experiments.run.provenance import git_commit
    from objbench.experiments.run.provenance import versions as base

    return {**base(), "trl": trl.__version__, "threads": torch.get_num_threads(), "commit": git_commit()}


def render(rows, checks, args) -> str:
    v = versions()
    lines = [f"TRL parity benchmark: {args.repeats} alternating repeats x {args.steps} steps "
             f"(median of each run after {args.skip} warm-up steps; median over repeats); "
             f"torch {v['torch']}, transformers {v['transformers']}, trl {v['trl']}, {v['threads']} threads", "",
             "TRL = GRPOTrainer at its fastest here (gradient_checkpointing=False); TRL default = GRPOConfig's "
             "defaults (gradient_checkpointing=True). Speed-up = TRL s/step / objbench s/step.", "",
             "| beta | TRL s/step | TRL default s/step | objbench s/step | speed-up vs TRL | (min over repeats) "
             "| vs TRL default | TRL tok/s | objbench tok/s | TRL peak RSS MB | TRL default peak RSS MB "
             "| objbench peak RSS MB |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['beta']} | {r['trl_s_per_step']:.4f} | {r['trl_default_s_per_step']:.4f} | "
                     f"{r['objbench_s_per_step']:.4f} | **{r['speedup']:.2f}x** | {r['speedup_per_repeat_min']:.2f}x | "
                     f"{r['speedup_vs_default']:.2f}x | {r['trl_tokens_per_s']:.0f} | {r['objbench_tokens_per_s']:.0f} | "
                     f"{r['trl_peak_rss_mb']:.0f} | {r['trl_default_peak_rss_mb']:.0f} | {r['objbench_peak_rss_mb']:.0f} |")
    lines += ["", "Per-run medians (s/step):"]
    for r in rows:
        lines.append(f"- beta {r['beta']}: TRL {', '.join(f'{x:.4f}' for x in r['trl_runs_s'])}; "
                     f"TRL default {', '.join(f'{x:.4f}' for x in r['trl_default_runs_s'])}; "
                     f"objbench {', '.join(f'{x:.4f}' for x in r['objbench_runs_s'])}")
    lines += ["", "Reward trajectory (mean reward of the step's 256 completions, mean over repeats; every 5th step):"]
    for r in rows:
        for k in ("trl", "objbench"):
            tr = r[f"{k}_reward"]
            lines.append(f"- beta {r['beta']} {k}: " + " ".join(f"{x:.2f}" for x in tr[::5]) + f" | last {tr[-1]:.2f}")
    lines += ["", "Numerics on one identical batch (same weights, same completions):", "",
              "| beta | TRL use_bias_correction_kl | objbench KL estimator | loss TRL | loss objbench | |loss diff| "
              "| max |grad diff| | grad norm |", "|---|---|---|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {c['beta']} | {c['trl_kl_bias_correction'] if c['beta'] else '-'} | "
                     f"{c['objbench_kl_estimator'] or '-'} | {c['loss_trl']:.7f} | {c['loss_objbench']:.7f} | "
                     f"{c['loss_abs_diff']:.1e} | {c['grad_max_abs_diff']:.1e} | {c['grad_norm']:.4f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

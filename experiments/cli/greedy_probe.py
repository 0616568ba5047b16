"""Why does greedy held-out accuracy fall while sampled accuracy rises? Compare each run's start and final policy
problem by problem.

    python -m objbench.experiments.cli.greedy_probe results/runs/quickstart --arm grpo --out results/greedy_drop

For every finished run of the arm (its warm start from the cache, its final policy from checkpoints/last) and
every held-out problem of the built-in arithmetic task:

- greedy answer at the start and at the end: the problem is kept (right both times), lost (right -> wrong),
  gained (wrong -> right) or missed (wrong both times);
- the teacher-forced probability of the reference answer (the whole sequence, <eos> included) under both
  policies, and the smallest per-token margin p(reference token) - max p(other token) along it: a margin near 0
  means the greedy answer is decided by a near-tie;
- sampled accuracy (``--samples`` answers at temperature 1) under both policies.

If RL raises the probability of the reference answer on problems whose greedy answer it breaks, the drop is a
property of greedy (token-wise argmax) decoding of a sharper-but-shifted distribution, not a loss of the answer;
if it lowers it, the policy has unlearned those answers. The table says which, per difficulty, with counts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch


def _problem_stats(s, policy, problems, samples: int, seed: int) -> list[dict]:
    """Per problem: greedy correct, sampled accuracy, reference-sequence log-prob, smallest token margin."""
    from objbench.experiments.run.rng import step_generator
    from objbench.experiments.run.sample import rollout
    from objbench.rollout.scoring import score

    s.policy = policy
    s.engine.sync_weights(policy)
    g = rollout(s, problems, 1, s.greedy_sampling, None)
    smp = rollout(s, problems, samples, s.eval_sampling, step_generator(seed, 10_000, 7, s.device))
    sampled = smp.correct.view(len(problems), samples).float().mean(-1)
    p_ids, p_mask = s.codec.encode_prompts(problems)
    t_ids, t_mask = s.codec.encode_targets([p.answer for p in problems])
    with torch.no_grad():
        sc = score(policy, p_ids, p_mask, t_ids, t_mask, with_entropy=False, with_logits=True)
    probs = sc.logits.float().softmax(-1)  # (B, T, V)
    p_ref = probs.gather(-1, t_ids.unsqueeze(-1)).squeeze(-1)
    other = probs.scatter(-1, t_ids.unsqueeze(-1), 0.0).amax(-1)
    margin = torch.where(t_mask, p_ref - other, torch.full_like(p_ref, 2.0)).amin(-1)
    seq_logp = (sc.logp * t_mask).sum(-1)
    return [{"difficulty": int(p.difficulty), "greedy": bool(c), "sampled": float(a), "ref_logp": float(lp),
             "margin": float(m)} for p, c, a, lp, m in zip(problems, g.correct.tolist(), sampled, seq_logp, margin)]


def probe_run(run_dir: Path, samples: int = 16, cache_dir=None) -> list[dict]:
    from objbench.experiments.config import build_task, load_config
    from objbench.experiments.run.checkpoint import latest_checkpoint
    from objbench.experiments.run.setup import make_setup
    from objbench.experiments.run.warmstart import warm_start
    from objbench.rollout.bundle import char_codec
    from objbench.rollout.sft import load_policy

    cfg = load_config(run_dir / "config.yaml")
    if cfg.task.get("name") != "arithmetic" or cfg.model.path:
        raise ValueError(f"{run_dir}: the probe reads the built-in arithmetic task and models only")
    task = build_task(cfg)
    start, _, info = warm_start(cfg, task, cache_dir=cache_dir)
    meta = json.loads((run_dir / "meta.json").read_text())
    want = (meta.get("sft") or {}).get("weights_sha256")
    if want and info.get("weights_sha256") != want:
        raise ValueError(f"{run_dir}: the cached warm start ({info.get('weights_sha256')}) is not the run's ({want})")
    final = load_policy(latest_checkpoint(run_dir) / "policy")
    s = make_setup(cfg, task, char_codec(), start)
    problems = task.eval_set()
    a = _problem_stats(s, start, problems, samples, cfg.seed)
    b = _problem_stats(s, final, problems, samples, cfg.seed)
    rows = []
    for x, y in zip(a, b):
        kind = {(True, True): "kept", (True, False): "lost", (False, True): "gained", (False, False): "missed"}[
            (x["greedy"], y["greedy"])]
        rows.append({"run": run_dir.name, "seed": cfg.seed, "difficulty": x["difficulty"], "kind": kind,
                     **{f"start_{k}": v for k, v in x.items() if k != "difficulty"},
                     **{f"end_{k}": v for k, v in y.items() if k != "difficulty"}})
    return rows


def summarise(rows: list[dict]) -> str:
    def med(v):
        return f"{statistics.median(v):+.3f}" if v else "-"

    def mean(v):
        return f"{statistics.fmean(v):.3f}" if v else "-"

    runs = sorted({r["run"] for r in rows})
    lines = [f"Greedy probe over {len(runs)} run(s): {', '.join(runs)}", "",
             "| difficulty | kind | problems | start margin (median) | end margin (median) | start p(ref) (mean) | "
             "end p(ref) (mean) | p(ref) rose | start sampled acc | end sampled acc |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    import math

    for d in sorted({r["difficulty"] for r in rows}):
        for kind in ("kept", "lost", "gained", "missed"):
            sel = [r for r in rows if r["difficulty"] == d and r["kind"] == kind]
            if not sel:
                continue
            rose = sum(r["end_ref_logp"] > r["start_ref_logp"] for r in sel)
            lines.append(f"| {d} | {kind} | {len(sel)} | {med([r['start_margin'] for r in sel])} | "
                         f"{med([r['end_margin'] for r in sel])} | "
                         f"{mean([math.exp(r['start_ref_logp']) for r in sel])} | "
                         f"{mean([math.exp(r['end_ref_logp']) for r in sel])} | {rose}/{len(sel)} | "
                         f"{mean([r['start_sampled'] for r in sel])} | {mean([r['end_sampled'] for r in sel])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", help="a sweep folder (or one run folder)")
    ap.add_argument("--arm", default="grpo")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--cache", help="warm-start cache (default: the usual one)")
    ap.add_argument("--out", help="write flips.md and flips.csv.gz here")
    ap.add_argument("--force", action="store_true", help="write into results/ from a dirty tree (the file says so)")
    args = ap.parse_args(argv)
    import time

    from objbench.analysis.provenance import check_clean, library_versions

    state = check_clean(args.out, force=args.force) if args.out else {}
    t0 = time.time()
    torch.set_num_threads(1)
    root = Path(args.runs)
    dirs = [root] if (root / "config.yaml").is_file() else sorted(
        d for d in root.iterdir() if d.name.startswith(f"{args.arm}__s") and (d / "done").is_file())
    if not dirs:
        print(f"error: no finished {args.arm} runs in {root}", file=sys.stderr)
        return 2
    rows = [r for d in dirs for r in probe_run(d, args.samples, args.cache)]
    text = summarise(rows)
    if args.out:
        v = library_versions()
        text += (f"\nMade by `python -m objbench.experiments.cli.greedy_probe {' '.join(argv if argv is not None else sys.argv[1:])}` "
                 f"at commit `{state.get('commit')}` ({'DIRTY tree' if state.get('dirty') else 'clean tree'}) in "
                 f"{time.time() - t0:.0f} s; " + ", ".join(f"{k} {x}" for k, x in v.items()) + ". Per problem and "
                 "seed: flips.csv.gz. Margin = p(reference token) - max p(other token), minimum over the answer's "
                 "tokens; p(ref) = probability of the whole reference answer (with <eos>); sampled acc from "
                 f"{args.samples} samples at temperature 1.\n")
    print(text)
    if args.out:
        import pandas as pd

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "flips.md").write_text(text)
        pd.DataFrame(rows).to_csv(out / "flips.csv.gz", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

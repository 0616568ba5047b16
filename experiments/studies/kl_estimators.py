"""KL-estimator study (diagnostic, no training): estimator quality and gradient behaviour of k1, k2, k3.

    python -m objbench.experiments.studies.kl_estimators --out results/kl_estimators [--seed 0] [--quick]

One question per part (bsuite style); every number in results/kl_estimators/README.md comes from here.

0. Method check -- Schulman's Gaussian table (``gaussian_table``): q = N(0, 1) samples, p = N(mu, 1) reference,
   true KL(q || p) = mu^2 / 2, statistics from ``estimator_stats``, the same function part (a) uses.

a. Estimator quality on the tiny policy (``token_study``). The reference is the cached SFT warm start; policy
   number i is the reference with every parameter tensor p replaced by p + sigma_i * std(p) * N(0, 1)
   (``perturb``), for sigma_i in ``Args.sigmas``. Each policy samples completions (HF engine, temperature 1);
   both models score them teacher-forced with full logits. Per valid response token:
     - k1, k2, k3 = algos.kl.estimate(lp, ref) of the sampled token (values; not clamped);
     - the exact per-token reverse KL(pi || ref) given the prefix, algos.kl.exact_kl over the 24-token vocabulary;
     - the exact conditional mean and variance of each estimator given the prefix, by enumerating the vocabulary
       (E[k | prefix] = sum_v pi(v) k(v)); for k1 and k3 the conditional mean *is* the per-token KL.
   Tokens are pooled over policies and binned by their exact per-token KL (``bin_tokens``). Per bin and
   estimator: bias = mean(k - KL_t), its standard error, the enumerated bias mean(E[k | prefix] - KL_t),
   std = std(k - KL_t) (sampling noise around the truth; for k1/k3 this is the estimator's conditional std),
   std / mean KL of the bin, and the fraction of negative values. Units: nats per token.

b. Gradient behaviour on an enumerable categorical (``categorical_gradients``, float64): logits theta (V = 10)
   for pi, a fixed reference, pi = ref + s * N(0, 1) at distances s. For each form the per-sample gradient
   J[v] = d surrogate(v) / d theta (autograd, sample v held fixed, old_logp = sg(lp): on-policy), then
     expected gradient  E_pi[J[v]] = sum_v pi(v) J[v]   (exact, by enumeration)
     Monte-Carlo        mean of J[v_i] over N tokens v_i ~ pi, repeated R times (``mc_gradients``)
   compared with grad KL(pi || ref) (reverse) and grad KL(ref || pi) (forward) by cosine and relative error
   |g - g*| / |g*|. Forms: each estimator as a loss (k1, k2, k3, k3_k2grad, k3_ratio), "k1 in the reward"
   (REINFORCE surrogate sg(k1) log pi) and REFERENCE.md's literal k2 row "x grad log pi" (sg(x) log pi).
   Off-policy (samples from pi_old != pi, the KL loss applied without importance weight except k3_ratio's own):
   ``categorical_gradients(..., off_policy=...)``.
   Sequence case (``sequence_gradients``): a tabular autoregressive toy (V = 4 tokens, T = 3 steps, one logit
   vector per prefix: 21 x 4 parameters), where all 64 sequences are enumerable. The tiny transformer's
   sequence space (24^11) is not, so this toy stands in for it. The per-token losses are summed over the
   sequence, as the training loop does; k1 in the reward is the sequence sum (verl) or reward-to-go (OpenRLHF).

Outputs (``--out``): gaussian_table.{csv,md}, policies.{csv,md}, token_bins.{csv,md}, grad_categorical.{csv,md},
grad_offpolicy.{csv,md}, grad_mc.{csv,md}, grad_sequence.{csv,md}, kl_token_bins.png, verdicts.md, run.json,
README.md. CSVs are tidy and full precision; Markdown tables are rounded for reading.

Code: this module (the arguments and ``run``, which writes every output) and, by job, kl_tokens.py (parts 0 and a)
and kl_gradients.py (part b) beside it: the compute, which samples and scores models (objbench.rollout, the
warm start of objbench.experiments). The analysis is in objbench.analysis.studies: kl_config.py (``Args``, the
estimators and gradient forms, the named verdict thresholds), kl_verdicts.py (the verdicts) and kl_report.py
(tables, findings, the figure, README.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from objbench.analysis.studies.kl_config import MIN_BIN_TOKENS, Args
from objbench.analysis.studies.kl_report import git_commit, md, save_token_bins_figure, write_readme, write_tables
from objbench.analysis.studies.kl_verdicts import verdicts
from objbench.experiments.studies.kl_gradients import (
    categorical_gradients,
    mc_gradients,
    sequence_gradients,
    summarise_sequence,
)
from objbench.experiments.studies.kl_tokens import bin_tokens, gaussian_table, load_reference, token_study


def parse_args(argv) -> Args:
    """The study's ``Args`` from the command line (--quick: ``Args.quick_sizes``)."""
    p = argparse.ArgumentParser(prog="python -m objbench.experiments.studies.kl_estimators",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", default=Args.out, help="output folder")
    p.add_argument("--seed", type=int, default=Args.seed)
    p.add_argument("--quick", action="store_true", help="smoke-test sizes (seconds)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="warm-start config override, e.g. --set sft.steps=30 (repeatable)")
    p.add_argument("--cache-dir", default=None, help="warm-start cache (default $OBJBENCH_CACHE)")
    a = p.parse_args(argv)
    kw = dict(out=a.out, seed=a.seed, quick=a.quick, overrides=tuple(a.overrides), cache_dir=a.cache_dir)
    if a.quick:
        kw.update(Args.quick_sizes())
    return Args(**kw)


def run(args: Args, command: str = "") -> dict:
    """The whole study; writes everything under ``args.out`` and returns the tables and verdicts."""
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timing = {}
    ref, task, tok = load_reference(args)
    timing["warm_start_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    gauss = gaussian_table(args.gauss_samples, args.seed)
    timing["gaussian_s"] = time.perf_counter() - t

    t = time.perf_counter()
    tokens, policies = token_study(ref, task, tok, args)
    bins = bin_tokens(tokens, min_tokens=MIN_BIN_TOKENS if not args.quick else 5)
    timing["part_a_s"] = time.perf_counter() - t

    t = time.perf_counter()
    grad = pd.concat([categorical_gradients(args.distances, args.vocab, args.seed),
                      categorical_gradients(args.distances, args.vocab, args.seed, off_policy=0.5)],
                     ignore_index=True)
    mc = mc_gradients(args.distances, args.vocab, args.seed, args.mc_tokens, args.mc_reps)
    seq = sequence_gradients(args.distances, args.seq_instances, args.seed)
    timing["part_b_s"] = time.perf_counter() - t

    tables = {"gaussian": gauss, "policies": policies, "bins": bins, "grad": grad, "mc": mc, "seq": seq,
              "seq_summary": summarise_sequence(seq)}
    write_tables(out, tables)
    save_token_bins_figure(bins, out, args.quick)
    vrows = verdicts(gauss, bins, grad, seq)
    (out / "verdicts.md").write_text(md(pd.DataFrame(vrows)))
    seconds = time.perf_counter() - t0
    timing["total_s"] = seconds
    import transformers

    (out / "run.json").write_text(json.dumps({
        "command": command, "args": asdict(args), "commit": git_commit(), "timing_s": timing,
        "threads": torch.get_num_threads(),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "platform": platform.platform()},
    }, indent=1, default=str))
    write_readme(out, args, command, tables, vrows, seconds)
    return {**tables, "verdicts": vrows, "timing": timing}


def main(argv=None) -> int:
    """Run the study from the command line; prints the verdicts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    command = "python -m objbench.experiments.studies.kl_estimators " + " ".join(shlex.quote(a) for a in argv)
    res = run(args, command)
    for r in res["verdicts"]:
        print(f"[{r['verdict']}] {r['claim']}: {r['evidence']}")
    print(f"wrote {args.out} in {res['timing']['total_s']:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

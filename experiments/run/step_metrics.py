"""The rollout metrics of a step (reward, accuracy, lengths, truncation, per difficulty), computed in Python
from one tolist() per column with the float32 values torch would give."""

from __future__ import annotations

import struct
from collections import Counter

import torch

from objbench.algos.advantages import zero_variance_groups
from objbench.experiments.run.batch import Batch

_F32 = struct.Struct("f")


def f32_mean_of_ints(total: int, n: int) -> float:
    """The float32 mean of ``n`` integer values summing to ``total`` (|total| < 2**24, so the float32 sum is
    exact), as ``float(torch.tensor(values, dtype=torch.float32).mean())`` gives it: the correctly rounded
    float32 quotient. Lets counts and lengths be averaged in Python from one ``tolist()`` instead of a few
    small tensor operations per metric, with the logged numbers unchanged (tests/test_experiments_train.py
    checks the equality against torch). The quotient is taken in float64 and rounded once to float32, which is
    the correctly rounded float32 quotient (53 >= 2 * 24 + 2 bits: double rounding is innocuous for division);
    struct, not numpy: a numpy scalar operation right after a step's tensor kernels costs ~20 us."""
    return _F32.unpack(_F32.pack(total / n))[0]


def zero_var_frac(rewards: torch.Tensor, G: int) -> float:
    """``float(zero_variance_groups(rewards, G).float().mean())``, the share of groups of G whose rewards are all
    identical (exactly; a NaN is equal to nothing), from one ``tolist()`` instead of five tensor operations."""
    rw = rewards.tolist()
    if not rw or G < 2 or len(rw) % G:
        return float(zero_variance_groups(rewards, G).float().mean())  # its error, its NaN for no group, G = 1
    # a group of >= 2 is all-equal iff its set has one element: tolist() gives each NaN its own float object,
    # unequal to every other (so a group holding a NaN never is), and 0.0 == -0.0 as in torch
    n = sum(len(set(rw[i:i + G])) == 1 for i in range(0, len(rw), G))
    return f32_mean_of_ints(n, len(rw) // G)


def pass_ks(n: int) -> list[int]:
    """The k of pass@k logged for n samples per problem: 1, 2, 4, ... below n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def group_pass_at_k(correct: list, sizes: list) -> dict:
    """reward/pass@k for k = 2, 4, ... up to the smallest group: the unbiased estimator over each prompt's group of
    completions (Chen et al. 2021), averaged over groups. Beside reward/acc (pass@1) it tells sharpening (pass@1
    rising to meet pass@k) from learning (pass@k rising)."""
    from objbench.envs.passk import pass_at_k

    if not sizes or min(sizes) < 2:
        return {}
    counts, i = [], 0
    for g in sizes:
        counts.append((g, sum(correct[i:i + g])))
        i += g
    return {f"reward/pass@{k}": sum(pass_at_k(g, c, k) for g, c in counts) / len(counts)
            for k in pass_ks(min(sizes))[1:]}


def rollout_metrics(b: Batch, task, group_size: int = 1) -> dict:
    lengths = b.response_mask.sum(-1).tolist()
    c = b.correct.tolist()
    n = len(c)
    n_c = sum(c)
    len_c = sum(x for x, ok in zip(lengths, c) if ok)
    total = sum(lengths)
    m = {"reward/mean": float(b.rewards.mean()), "reward/acc": f32_mean_of_ints(n_c, n),
         "length/mean": f32_mean_of_ints(total, n),
         "length/correct": f32_mean_of_ints(len_c, n_c) if n_c else float("nan"),
         "length/incorrect": f32_mean_of_ints(total - len_c, n - n_c) if n_c < n else float("nan"),
         "rollout/trunc_frac": f32_mean_of_ints(sum(b.truncated.tolist()), n),
         "rollout/completions": b.size, "rollout/tokens": total}
    if getattr(getattr(task, "config", None), "filler_max", 0):  # the length-bias study's filler, by correctness
        fill = [task.filler_length(t) for t in b.texts]
        for name, want in (("correct", True), ("incorrect", False)):
            xs = [f for f, ok in zip(fill, c) if ok == want and f is not None]
            m[f"length/filler_{name}"] = f32_mean_of_ints(sum(xs), len(xs)) if xs else float("nan")
        m["length/filler_gap"] = m["length/filler_incorrect"] - m["length/filler_correct"]  # NaN if either is
    if b.malformed is not None:  # the share of completions in which the verifier found an answer at all
        m["rollout/parse_rate"] = f32_mean_of_ints(n - sum(b.malformed.tolist()), n)
    m.update(group_pass_at_k(c, b.group_sizes or ([group_size] * (n // group_size) if group_size > 1 and
                                                   n % group_size == 0 else [])))
    diff = b.difficulty.tolist()
    n_d, n_dc = Counter(diff), Counter(d for d, ok in zip(diff, c) if ok)  # responses, correct ones per difficulty
    for d in task.difficulties:
        if n_d[d]:
            m[f"reward/acc_d{d}"] = f32_mean_of_ints(n_dc[d], n_d[d])
    return m


UNPARSEABLE_WARN_BELOW = 0.1  # parse rate under which a step's answers are mostly not answers at all


def parse_warning(row: dict, task) -> str | None:
    """A one-time warning when most completions of a step have no answer the verifier can read (parse rate < 0.1),
    naming the setting that decides the answer format: such a run silently learns nothing (every reward 0)."""
    rate = row.get("rollout/parse_rate")
    if rate is None or rate >= UNPARSEABLE_WARN_BELOW:
        return None
    cfg = getattr(task, "config", None)
    setting = next((f"task.{name}={getattr(cfg, name)!r}" for name in ("answer_style", "answer_format")
                    if getattr(cfg, name, None) is not None), "the task's answer format")
    return (f"WARNING step {row.get('step')}: {1 - rate:.0%} of the completions have no answer the verifier can "
            f"read (rollout/parse_rate {rate:.3f}), so nearly every reward is 0 and the run learns little. The "
            f"format is decided by {setting}; check that it matches how the model answers (samples.jsonl shows "
            f"the completions).")

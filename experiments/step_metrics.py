"""The rollout metrics of a step (reward, accuracy, lengths, truncation, per difficulty), computed in Python
from one tolist() per column with the float32 values torch would give."""

from __future__ import annotations

import struct
from collections import Counter

import torch

from objbench.algos.advantages import zero_variance_groups
from objbench.experiments.batch import Batch

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


def rollout_metrics(b: Batch, task) -> dict:
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
    diff = b.difficulty.tolist()
    n_d, n_dc = Counter(diff), Counter(d for d, ok in zip(diff, c) if ok)  # responses, correct ones per difficulty
    for d in task.difficulties:
        if n_d[d]:
            m[f"reward/acc_d{d}"] = f32_mean_of_ints(n_dc[d], n_d[d])
    return m

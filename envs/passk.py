"""pass@k of sampled answers: the unbiased estimator (Chen et al., 2021) of the chance that at least one of k
answers sampled for a problem is verified correct, from n samples of which c were.

The training loop logs it (reward/pass@k over each prompt's group, experiments.step_metrics; eval/pass@k on the
held-out set, experiments.evaluate) and analysis re-exports it (analysis.stats). It lives here, beside the tasks
whose verifiers decide correctness, because it reads nothing but those counts and the loop may import envs but not
analysis. NumPy only; no torch.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["pass_at_k"]


def pass_at_k(n, c, k):
    """Unbiased pass@k estimator (Chen et al., 2021): ``1 - C(n - c, k) / C(n, k)``.

    Computed in the numerically stable product form ``1 - prod_{i = n-c+1}^{n} (1 - k / i)``, which never
    forms the (huge) binomial coefficients.

    Args:
        n: samples drawn per problem (int >= 1).
        c: correct samples among them (0 <= c <= n).
        k: the k in pass@k (1 <= k <= n).
        Any of them may be an array; they broadcast, and the result has the broadcast shape.

    Returns:
        float (or float array): the probability that at least one of k samples drawn without replacement from
        the n is correct. 0 when c = 0; 1 when n - c < k.
    """
    if type(n) is int and type(c) is int and type(k) is int:  # the loop's case: plain Python, the same float
        return pass_at_k_int(n, c, k)
    n_arr, c_arr, k_arr = np.broadcast_arrays(np.asarray(n), np.asarray(c), np.asarray(k))
    for name, v in (("n", n_arr), ("c", c_arr), ("k", k_arr)):
        if not np.all(np.equal(np.mod(v, 1), 0)):
            raise ValueError(f"{name} must be integers, got {v}")
    if np.any(n_arr < 1) or np.any(c_arr < 0) or np.any(c_arr > n_arr) or np.any(k_arr < 1) or np.any(k_arr > n_arr):
        raise ValueError(f"need 1 <= k <= n and 0 <= c <= n; got n={n}, c={c}, k={k}")
    out = np.empty(n_arr.shape, dtype=float)
    for idx in np.ndindex(n_arr.shape):
        ni, ci, ki = int(n_arr[idx]), int(c_arr[idx]), int(k_arr[idx])
        if ni - ci < ki:
            out[idx] = 1.0
        else:
            out[idx] = 1.0 - float(np.prod(1.0 - ki / np.arange(ni - ci + 1, ni + 1)))
    return float(out) if out.ndim == 0 else out


def pass_at_k_int(n: int, c: int, k: int) -> float:
    """``pass_at_k`` of three Python integers in plain Python: the same float64 product in the same order as the
    array path (tests/test_harness_fastpaths.py compares every n <= 64), without NumPy's per-call overhead. The
    training loop calls it for every group and k each step: NumPy's scalar operations cost ~2 ms a step there (the
    toy step's regression after a0f9202, found by bisecting)."""
    if not (1 <= k <= n and 0 <= c <= n):
        raise ValueError(f"need 1 <= k <= n and 0 <= c <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))

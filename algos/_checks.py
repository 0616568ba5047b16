"""Cheap input checks and masked reductions shared by the algos modules (private).

Every check looks only at shapes, dtypes and Python scalars -- none reads tensor data, so none forces a
device sync -- with one exception: a mask that is not ``torch.bool`` has its values checked (see
``as_mask``). Every error is a ``ValueError`` whose message starts with the name of the offending argument.

Convention used everywhere in ``algos``: inside the package masks are ``torch.bool`` tensors, ``True`` = a
valid (response) token. The public functions also accept the masks other libraries pass around --
Hugging Face attention masks are int64, verl and TRL pass float masks -- as long as every value is 0 or 1:
``as_mask`` converts them once, where they enter, and everything after that sees a bool mask, so the
results are identical to the bool mask's to the last bit. Positions where the mask is ``False`` may hold
anything (padding, ``inf``, ``nan``): each public function replaces them with 0 *before* any arithmetic
(``masked_fill``), so neither outputs nor gradients can see them.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Optional

import torch


_MAX_SHOWN = 8  # offending mask values listed in an error message


def as_mask(mask: torch.Tensor, name: str = "mask", ndim: int = 2, shape: Optional[tuple] = None) -> torch.Tensor:
    """``mask`` as a ``torch.bool`` tensor (True / 1 = valid token), after checking it.

    - ``torch.bool``: returned as it is (no copy, no data read, no device sync);
    - integer or floating dtypes (HF int64 attention masks, verl/TRL float masks): every value must be 0 or 1;
      returned as ``mask != 0``. Checking the values reads the data: one device sync per call, so callers
      that care pass bool masks (every algos function converts at its entry, so a nested call sees bool);
    - anything else -- another dtype, a value such as 0.5, 2, -1 or NaN, the wrong number of dimensions or
      (when ``shape`` is given) the wrong shape -- raises ``ValueError`` naming ``name`` and, for values,
      listing the offending ones.
    """
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(mask.shape)}")
    if shape is not None and tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.dtype.is_complex:
        raise ValueError(f"{name} must be a bool, integer or floating tensor of 0s and 1s, got {mask.dtype}")
    valid = (mask == 0) | (mask == 1)  # NaN compares False to both: rejected
    if not bool(valid.all()):  # the one data-dependent check in algos (a sync), only for non-bool masks
        bad = mask[~valid]
        values = torch.unique(bad)
        cast = float if mask.dtype.is_floating_point else int
        shown = ", ".join(repr(cast(v)) for v in values[:_MAX_SHOWN])
        more = f", ... ({values.numel()} distinct)" if values.numel() > _MAX_SHOWN else ""
        raise ValueError(
            f"{name} must hold only 0 and 1 (True/1 = valid token) when it is not torch.bool; got {mask.dtype} "
            f"with {bad.numel()} of {mask.numel()} entries not 0 or 1, values: {shown}{more}"
        )
    return mask != 0


def check_float(x: torch.Tensor, name: str, shape: Optional[tuple] = None, ndim: Optional[int] = None) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if shape is not None and x.shape != shape and tuple(x.shape) != tuple(shape):  # torch.Size == tuple: fast
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")


def check_choice(value: str, name: str, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")


def check_group_size(group_size: int, batch: int, minimum: int = 2) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"group_size must be an int, got {type(group_size).__name__}")
    if group_size < minimum:
        why = (" for a group estimator (a singleton group has no baseline; use the GAE estimator for one "
               "sample per prompt)") if minimum >= 2 else ""
        raise ValueError(f"group_size must be >= {minimum}{why}, got {group_size}")
    if batch % group_size != 0:
        raise ValueError(f"group_size={group_size} does not divide the batch size {batch}")


# ---------------------------------------------------------------------------------------------------------
# Quantities of a bool mask that one loss computation needs many times (its complement, token counts): computed
# once per mask tensor and reused while that same tensor object, unmodified, comes back (one objective step
# passes one mask through policy_loss, aggregate and the metrics: ~40 fewer small ops each). The same operations
# on the same data, so the same numbers. A one-entry memo per thread, keyed by the tensor's identity (a weak
# reference), its version counter (any in-place change invalidates it) and the inference-mode flag; an inference
# tensor (no version counter) is never memoised.


class _MaskMemo(threading.local):
    def __init__(self):
        self.ref = None
        self.key = None
        self.values: dict = {}


_memo = _MaskMemo()


def mask_memo(mask: torch.Tensor, name, fn: Callable[[torch.Tensor], object]):
    """``fn(mask)``, computed once per (unmodified) mask tensor under ``name``."""
    if mask.is_inference():
        return fn(mask)
    key = (mask._version, torch.is_inference_mode_enabled())
    m = _memo
    if m.ref is None or m.ref() is not mask or m.key != key:
        m.ref, m.key, m.values = weakref.ref(mask), key, {}
    value = m.values.get(name)
    if value is None:
        value = m.values[name] = fn(mask)
    return value


def complement(mask: torch.Tensor) -> torch.Tensor:
    """``~mask`` (the padding positions)."""
    return mask_memo(mask, "complement", torch.Tensor.bitwise_not)


def valid_count(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0-dim ``mask.sum().to(dtype).clamp(min=1.0)``: the token count as a divisor (1 when nothing is valid)."""
    return mask_memo(mask, ("count", dtype), lambda m: m.sum().to(dtype).clamp(min=1.0))


def row_counts(mask: torch.Tensor, dtype: torch.dtype) -> tuple:
    """((B,) ``mask.sum(-1).to(dtype).clamp(min=1.0)``, 0-dim number of non-empty rows clamped to >= 1), as
    divisors."""
    def rows(m):
        row_len = m.sum(-1).to(dtype)
        return row_len.clamp(min=1.0), (row_len > 0).sum().to(dtype).clamp(min=1.0)

    return mask_memo(mask, ("rows", dtype), rows)


def any_valid(mask: torch.Tensor) -> torch.Tensor:
    """0-dim ``mask.any()``."""
    return mask_memo(mask, "any", torch.Tensor.any)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Sum of x over valid positions; garbage under the mask never enters (where, not multiply)."""
    x = x.masked_fill(complement(mask), 0.0)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over valid positions of the whole tensor; 0 (not NaN) when nothing is valid."""
    return masked_sum(x, mask) / valid_count(mask, x.dtype)


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max over valid positions; 0 when nothing is valid (metrics only, never differentiated)."""
    big = torch.finfo(x.dtype).max
    out = x.masked_fill(complement(mask), -big).amax()
    return torch.where(any_valid(mask), out, 0.0)


def masked_min(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Min over valid positions; 0 when nothing is valid (metrics only, never differentiated)."""
    big = torch.finfo(x.dtype).max
    out = x.masked_fill(complement(mask), big).amin()
    return torch.where(any_valid(mask), out, 0.0)

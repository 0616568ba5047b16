"""Cheap input checks and masked reductions shared by the algos modules (private).

Every check looks only at shapes, dtypes and Python scalars: none reads tensor data, so none forces a
device sync. Every error is a ``ValueError`` whose message starts with the name of the offending argument.

Convention used everywhere in ``algos``: masks are ``torch.bool`` tensors, ``True`` = a valid (response)
token. Positions where the mask is ``False`` may hold anything (padding, ``inf``, ``nan``): each public
function replaces them with 0 *before* any arithmetic (``masked_fill``), so neither outputs nor gradients
can see them.
"""

from __future__ import annotations

from typing import Optional

import torch


def check_mask(mask: torch.Tensor, name: str = "mask", ndim: int = 2) -> None:
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise ValueError(f"{name} must have dtype torch.bool (True = valid token), got {mask.dtype}")
    if mask.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(mask.shape)}")


def check_float(x: torch.Tensor, name: str, shape: Optional[tuple] = None, ndim: Optional[int] = None) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if shape is not None and tuple(x.shape) != tuple(shape):
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


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Sum of x over valid positions; garbage under the mask never enters (where, not multiply)."""
    x = x.masked_fill(~mask, 0.0)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over valid positions of the whole tensor; 0 (not NaN) when nothing is valid."""
    n = mask.sum().to(x.dtype)
    return masked_sum(x, mask) / n.clamp(min=1.0)


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max over valid positions; 0 when nothing is valid (metrics only, never differentiated)."""
    big = torch.finfo(x.dtype).max
    out = x.masked_fill(~mask, -big).amax()
    return torch.where(mask.any(), out, torch.zeros_like(out))


def masked_min(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Min over valid positions; 0 when nothing is valid (metrics only, never differentiated)."""
    big = torch.finfo(x.dtype).max
    out = x.masked_fill(~mask, big).amin()
    return torch.where(mask.any(), out, torch.zeros_like(out))

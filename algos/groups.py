"""Group layouts with a size per group, and adaptive group sizes (seed 003, "future directions" 1: give hard
prompts more samples than easy ones, e.g. easy K = 4 / hard K = 12).

Layout (every group function of algos takes it as ``group_size``):

- an int G: contiguous groups of G rows, B divisible by G. This is the fast path, the reshape(-1, G) code
  that every preset runs, unchanged to the last bit;
- a sequence of Python ints (G_1, ..., G_n): contiguous groups of those sizes, summing to B (rows
  [G_1 + ... + G_{g-1}, G_1 + ... + G_g) answer prompt g). A sequence whose sizes are all equal takes the
  fast path. Sizes are layout metadata like the int -- Python ints, never tensors (reading a tensor's values
  would be a device sync, which algos never does).

Unequal groups are handled by padding to (n_groups, max G) with an explicit validity mask (``Segments``): every
reduction is a row reduction of the padded matrix, so results are deterministic on every device (no atomic
``index_add``). Group statistics use each group's own size: mean over G_g, unbiased std with G_g - 1, RLOO's
leave-one-out mean over G_g - 1. Singleton groups are rejected by the group estimators and by dynamic
sampling, exactly as ``group_size=1`` is (a group of one has no baseline); ``group_stats`` accepts them.

Adaptive group sizes (``ObjectiveConfig.groups``; registry ``GROUP_SIZE_RULES``):

  fixed       G = objective.group_size for every prompt (every preset; the loop's original path)
  difficulty  x = the prompt's difficulty level
  pass_rate   x = the running pass rate of the prompt's difficulty level: an exponential moving average over
              steps of the share of that level's sampled completions the verifier judged correct, starting
              at ``groups.prior``, newest step weighted ``groups.ema`` (``update_pass_rates``). Prompts rarely
              repeat in a stream, so the rate is kept per level, not per prompt.
  G = sizes[i] with i the number of thresholds <= x (``bisect_right``): sizes[0] below thresholds[0], ...,
  sizes[-1] from thresholds[-1] on. E.g. difficulty thresholds [2, 3], sizes [4, 8, 12]: level 1 -> 4,
  level 2 -> 8, level >= 3 -> 12; pass_rate thresholds [0.2, 0.8], sizes [12, 8, 4]: rarely solved -> 12.

Fixed budget (decision): the number of completions per step stays ``rollout.completions_per_step``, so every
arm of a study samples the same amount. ``fill_budget`` takes prompts in stream order, each with the size
its rule wants, until the budget is spent; the last group is trimmed to what is left, and when a group would
leave fewer completions than the estimator's smallest group (a singleton for the group estimators) it takes
them as well. The number of prompts per step therefore varies.

Aggregation with unequal groups: every loss aggregation mode is defined over the flat batch (no mode involves
G), so a prompt weighs in the loss in proportion to its G_g; see ``algos.aggregate``.
"""

from __future__ import annotations

import bisect
import math
import numbers
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from objbench.algos._checks import check_group_size
from objbench.algos.registry import GROUP_SIZE_RULES, settings_kwargs

__all__ = [
    "layout",
    "Segments",
    "GroupSizeRule",
    "GROUP_SIZE_RULES",
    "adaptive",
    "wanted_sizes",
    "fill_budget",
    "update_pass_rates",
]


# ------------------------------------------------------------------------------------------------ layout
def layout(group_size, batch: int, minimum: int = 2) -> Tuple[Optional[int], Optional[Tuple[int, ...]]]:
    """Check a group layout (module docstring) against a batch of ``batch`` rows.

    Returns ``(G, None)`` for equal groups (an int, or a sequence of equal sizes) and ``(None, sizes)``
    for unequal ones. ``minimum``: the smallest group allowed (2 for the group estimators: a singleton group
    has no baseline). Errors are ValueErrors starting with ``group_size``.
    """
    if isinstance(group_size, torch.Tensor):
        raise ValueError("group_size must be an int or a sequence of Python ints (one size per group), got a "
                         "tensor (layout metadata is never read from a tensor: that would be a device sync)")
    if isinstance(group_size, (list, tuple)):
        sizes = tuple(group_size)
        if not sizes:
            raise ValueError("group_size: the sequence of group sizes is empty")
        for g in sizes:
            if isinstance(g, bool) or not isinstance(g, numbers.Integral):
                raise ValueError(f"group_size: group sizes must be ints, got {g!r}")
        if sum(sizes) != batch:
            raise ValueError(f"group_size: the group sizes sum to {sum(sizes)}, but the batch has {batch} rows")
        smallest = min(sizes)
        if smallest < minimum:
            why = (" (a singleton group has no baseline; use the GAE estimator for one sample per prompt)"
                   if minimum >= 2 else "")
            raise ValueError(f"group_size: every group needs >= {minimum} members{why}, got a group of {smallest}")
        if all(g == sizes[0] for g in sizes):
            return int(sizes[0]), None
        return None, tuple(int(g) for g in sizes)
    check_group_size(group_size, batch, minimum=minimum)
    return group_size, None


class Segments:
    """Contiguous groups of unequal sizes as a padded (n_groups, max G) view of a (B,) vector.

    ``ids`` (B,) long: the group of each row; ``pos`` (B,) long: its place in the group; ``valid``
    (n, Gmax) bool; ``count`` (n,) float sizes in the data's dtype.
    """

    def __init__(self, sizes: Sequence[int], like: torch.Tensor):
        dev = like.device
        self.n = len(sizes)
        self.width = max(sizes)
        sizes_t = torch.tensor(list(sizes), dtype=torch.long, device=dev)  # (n,)
        self.ids = torch.repeat_interleave(torch.arange(self.n, device=dev), sizes_t)  # (B,)
        starts = torch.cumsum(sizes_t, 0) - sizes_t  # (n,) first row of each group
        self.pos = torch.arange(self.ids.shape[0], device=dev) - starts[self.ids]  # (B,)
        self.valid = torch.arange(self.width, device=dev)[None, :] < sizes_t[:, None]  # (n, Gmax)
        self.count = sizes_t.to(like.dtype)  # (n,)

    def pad(self, x: torch.Tensor, fill) -> torch.Tensor:
        """(B,) -> (n, Gmax), ``fill`` at the padding."""
        out = torch.full((self.n, self.width), fill, dtype=x.dtype, device=x.device)
        out[self.ids, self.pos] = x  # each slot written once: deterministic
        return out

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(n, Gmax) -> (B,)."""
        return x[self.ids, self.pos]

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return self.pad(x, 0).sum(dim=1)  # (n,)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        return self.sum(x) / self.count

    def zero_var(self, x: torch.Tensor) -> torch.Tensor:
        """(n,) bool: every value of the group is identical (exact comparison, as the equal-size path)."""
        hi = self.pad(x, -math.inf).amax(dim=1)
        lo = self.pad(x, math.inf).amin(dim=1)
        return hi == lo


# -------------------------------------------------------------------------------------- adaptive sizes
@dataclass(frozen=True)
class GroupSizeRule:
    """Member type of ``GROUP_SIZE_RULES``.

    wanted: fn(*, difficulties: list[int], pass_rates: dict[int, float], cfg: ObjectiveConfig) -> list[int],
        the group size each prompt asks for (before the budget trims the last group).
    reads: the ``GroupConfig`` fields (``groups.<name>``) the rule reads.
    adaptive: True when the size can differ between prompts: ``group_size`` is then not read, and the training
        loop samples with a size per prompt (``adaptive(cfg)``); False for ``fixed``, the loop's equal-groups path.
    """

    wanted: Callable[..., List[int]]
    reads: Tuple[str, ...]
    adaptive: bool
    settings: Optional[type] = None  # a plug-in's settings dataclass: wanted() then also gets settings=<instance>


def _by_threshold(xs, cfg) -> List[int]:
    th, sizes = cfg.groups.thresholds, cfg.groups.sizes
    return [int(sizes[bisect.bisect_right(th, x)]) for x in xs]


def _fixed(*, difficulties, pass_rates, cfg):
    return [cfg.group_size] * len(difficulties)


def _difficulty(*, difficulties, pass_rates, cfg):
    return _by_threshold(difficulties, cfg)


def _pass_rate(*, difficulties, pass_rates, cfg):
    return _by_threshold([pass_rates.get(d, cfg.groups.prior) for d in difficulties], cfg)


GROUP_SIZE_RULES.register("fixed", GroupSizeRule(_fixed, reads=(), adaptive=False))
GROUP_SIZE_RULES.register("difficulty", GroupSizeRule(_difficulty, reads=("thresholds", "sizes"), adaptive=True))
GROUP_SIZE_RULES.register("pass_rate", GroupSizeRule(_pass_rate, reads=("thresholds", "sizes", "ema", "prior"),
                                                     adaptive=True))


def adaptive(cfg) -> bool:
    """Whether ``cfg.groups.rule`` (cfg: an ObjectiveConfig) gives each prompt its own group size."""
    return GROUP_SIZE_RULES.get(cfg.groups.rule).adaptive


def wanted_sizes(cfg, difficulties: Sequence[int], pass_rates: Mapping[int, float]) -> List[int]:
    """The group size each prompt asks for under ``cfg.groups.rule`` (cfg: an ObjectiveConfig)."""
    rule = GROUP_SIZE_RULES.get(cfg.groups.rule)
    return rule.wanted(difficulties=list(difficulties), pass_rates=dict(pass_rates), cfg=cfg,
                       **settings_kwargs(rule, cfg.groups.rule, cfg.options))


def fill_budget(wanted: Sequence[int], budget: int, min_size: int = 2) -> List[int]:
    """Sizes of the groups that spend exactly ``budget`` completions, prompts taken in order.

    Each prompt gets min(wanted, what is left); a group that would leave 0 < left < ``min_size``
    completions takes them as well (no group smaller than ``min_size`` is ever made, except when the whole
    budget is smaller). Raises ValueError when ``wanted`` runs out before the budget is spent.

    Example (budget 17, min_size 2): wanted [4, 12, 4] -> [4, 13] (12 would leave 1).
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be an int >= 1, got {budget!r}")
    if budget < min_size:
        raise ValueError(f"budget: {budget} completions cannot make a group of >= {min_size}")
    out: List[int] = []
    left = budget
    for w in wanted:
        if left == 0:
            break
        if isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < 1:
            raise ValueError(f"wanted: group sizes must be ints >= 1, got {w!r}")
        g = min(int(w), left)
        if 0 < left - g < min_size:
            g = left  # never leave a remainder too small to be a group
        out.append(g)
        left -= g
    if left:
        raise ValueError(f"wanted: {len(out)} prompts were not enough to spend the budget of {budget} completions")
    return out


def update_pass_rates(rates: Mapping[int, float], difficulties: Sequence[int], correct: Sequence[bool],
                      ema: float, prior: float) -> Dict[int, float]:
    """One step of the running pass rate per difficulty level (rule pass_rate).

    Every level starts at ``prior``; for every level d observed this step
    rate_d <- (1 - ema) rate_d + ema * (share of level d's completions judged correct).
    Levels not observed keep their rate. Python lists in, a new dict out.
    """
    if not 0.0 < ema <= 1.0:
        raise ValueError(f"ema must be in (0, 1], got {ema}")
    if not 0.0 <= prior <= 1.0:
        raise ValueError(f"prior must be in [0, 1], got {prior}")
    if len(difficulties) != len(correct):
        raise ValueError(f"difficulties and correct must have the same length, got {len(difficulties)} and "
                         f"{len(correct)}")
    hits: Dict[int, List[int]] = {}
    for d, c in zip(difficulties, correct):
        h = hits.setdefault(int(d), [0, 0])
        h[0] += bool(c)
        h[1] += 1
    out = {int(k): float(v) for k, v in rates.items()}
    for d, (k, n) in sorted(hits.items()):
        out[d] = (1.0 - ema) * out.get(d, prior) + ema * (k / n)
    return out

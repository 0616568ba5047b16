"""Conformance checks for registry members, run on a plug-in's member before it is used (and by ``objbench plugins
check FILE``): a member that breaks the contract of its registry (``algos.registry``) is refused with the reason,
before any compute.

``check_member(family, name, options=None)`` returns a list of failures (empty = conforms); ``FAMILIES`` lists the
families it knows. Every check runs on a small fixed float64 batch (seeded; rows of lengths 5, 3, 1, 4, 0 and 2 in
T = 5 columns, so there is a fully masked row) and asks three things:

- **garbage under the mask changes nothing**: values at masked positions set to large numbers (inf/nan where the
  contract allows it), and three extra fully masked columns appended, leave the result at the valid tokens equal;
- **every aggregation mode is honoured**: a surrogate's per-token loss of response i depends on response i only
  (its gradient reaches no other response, and its values do not change when the batch holds only some of the
  responses), so the aggregation mode alone decides how responses and tokens are weighed (a surrogate that
  normalises across the batch itself would silently double-normalise); an aggregation mode's loss is split
  exactly by ``micro_batch_weights`` when it declares ``divisor_count``;
- **gradients are finite** on the random batch, and zero at masked positions.

Family-specific: a KL estimator is 0 where logp equals ref_logp; an advantage estimator gives 0 under the mask and,
when it declares ``all_equal_zero``, 0 for a group of equal rewards; a ratio level gives log-ratio 0 where logp
equals old_logp. Settings dataclasses must give every setting a default.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional

import torch

from objbench.algos.aggregate import aggregate, micro_batch_weights
from objbench.algos.registry import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    GROUP_SIZE_RULES,
    KL_ESTIMATORS,
    RATIO_LEVELS,
    SCHEDULE_KINDS,
    SURROGATES,
    settings_kwargs,
)

__all__ = ["FAMILIES", "check_member"]

LENGTHS = (5, 3, 1, 4, 0, 2)
T = 5
PAD = 3  # extra fully masked columns in the garbage variant
GARBAGE = 1e4


def _batch(extra_cols: int = 0, garbage: bool = False) -> Dict[str, torch.Tensor]:
    """The fixed test batch: mask, logp, old_logp, ref_logp (B, T + extra_cols), per-row rewards and token
    advantages; with ``garbage``, every masked position holds +-1e4."""
    g = torch.Generator().manual_seed(1234)
    B, W = len(LENGTHS), T + extra_cols
    mask = torch.arange(W)[None, :] < torch.tensor(LENGTHS)[:, None]
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2.0 - 0.05
    old = logp + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    out = {"logp": logp, "old": old, "ref": ref, "adv": adv}
    for k, v in out.items():
        v = torch.cat([v, torch.zeros(B, extra_cols, dtype=v.dtype)], 1)
        if garbage:
            sign = torch.where(torch.rand(B, W, generator=g) < 0.5, -1.0, 1.0).to(v.dtype)
            v = torch.where(mask, v, sign * GARBAGE)
        out[k] = v
    out["mask"], out["rewards"] = mask, rewards
    return out


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=False))


def _finite_grad(out: torch.Tensor, x: torch.Tensor, mask: torch.Tensor, what: str) -> List[str]:
    if not out.requires_grad:
        return [f"{what} is not differentiable in logp (no gradient flows)"]
    (grad,) = torch.autograd.grad(out, x, retain_graph=True, allow_unused=True)
    if grad is None:
        return [f"{what} does not depend on logp (no gradient)"]
    fails = [] if torch.isfinite(grad).all() else [f"{what}: gradient is not finite on a random batch"]
    if (grad[~mask] != 0).any():
        fails.append(f"{what}: gradient is not zero at masked positions")
    return fails


def _surrogate_loss_mat(member, level: str, b: dict, settings_kw: dict) -> tuple:
    from objbench.algos.surrogates import OPTION_DEFAULTS

    lp = b["logp"].masked_fill(~b["mask"], 0.0).requires_grad_(True)
    old = b["old"].masked_fill(~b["mask"], 0.0)
    r = torch.exp(RATIO_LEVELS.get(level).log_ratio(lp, old, b["mask"]))
    adv = b["adv"].masked_fill(~b["mask"], 0.0)
    loss_mat, events = member.loss(ratio=r, logp=lp, adv=adv, mask=b["mask"],
                                   opts={k: OPTION_DEFAULTS[k] for k in member.reads}, **settings_kw)
    return lp, loss_mat, events


def _check_surrogate(name: str, settings_kw: dict) -> List[str]:
    member = SURROGATES.get(name)
    fails: List[str] = []
    for level in member.levels:
        b = _batch()
        lp, loss_mat, events = _surrogate_loss_mat(member, level, b, settings_kw)
        where = f"ratio level {level!r}"
        if not isinstance(loss_mat, torch.Tensor) or loss_mat.shape != b["mask"].shape:
            return [f"{where}: loss must be a (B, T) per-token tensor, got "
                    f"{getattr(loss_mat, 'shape', type(loss_mat).__name__)}"]
        bad_events = [k for k, v in dict(events).items()
                      if not (isinstance(v, torch.Tensor) and v.dtype == torch.bool and v.shape == loss_mat.shape)]
        if bad_events:
            fails.append(f"{where}: events {bad_events} must be (B, T) bool tensors")
        fails += _row_local(lp, loss_mat, b["mask"], where)
        part = {k: v[:3] for k, v in b.items()}  # the first three responses alone
        _, part_mat, _ = _surrogate_loss_mat(member, level, part, settings_kw)
        if not _close(loss_mat.detach()[:3][part["mask"]], part_mat.detach()[part["mask"]]):
            fails.append(f"{where}: a response's per-token loss changes with the other responses in the batch (a "
                         f"batch-wide normaliser?); the aggregation mode (loss.agg) alone normalises")
        _, g_mat, _ = _surrogate_loss_mat(member, level, _batch(PAD, garbage=True), settings_kw)
        for agg in AGGREGATION_MODES.names():
            loss = aggregate(loss_mat, b["mask"], agg, max_len=T)
            if not torch.isfinite(loss):
                fails.append(f"{where}, loss.agg {agg!r}: loss is not finite")
                continue
            fails += _finite_grad(loss, lp, b["mask"], f"{where}, loss.agg {agg!r}")
            g_loss = aggregate(g_mat, _batch(PAD)["mask"], agg, max_len=T)
            if not _close(loss.detach(), g_loss.detach()):
                fails.append(f"{where}, loss.agg {agg!r}: garbage or padding under the mask changed the loss "
                             f"({loss.item():.6g} -> {g_loss.item():.6g})")
    return fails


def _row_local(lp: torch.Tensor, loss_mat: torch.Tensor, mask: torch.Tensor, where: str) -> List[str]:
    """The loss of response i must depend on response i's log-probs only."""
    for i in range(mask.shape[0]):
        if not mask[i].any() or not loss_mat.requires_grad:
            continue
        (grad,) = torch.autograd.grad(loss_mat[i].masked_fill(~mask[i], 0.0).sum(), lp, retain_graph=True,
                                      allow_unused=True)
        if grad is None:
            continue
        others = torch.ones(mask.shape[0], dtype=torch.bool)
        others[i] = False
        if (grad[others] != 0).any():
            return [f"{where}: the loss of response {i} depends on other responses' tokens; a surrogate is per "
                    f"token and the aggregation mode (loss.agg) alone normalises across the batch"]
    return []


def _check_aggregation(name: str, settings_kw: dict) -> List[str]:
    fn = AGGREGATION_MODES.get(name)
    b = _batch()
    x = b["adv"].clone().requires_grad_(True)
    loss = aggregate(x, b["mask"], name, max_len=T)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        return ["must return a 0-dim tensor"]
    if not torch.isfinite(loss):
        return ["loss is not finite on a random batch"]
    fails = _finite_grad(loss, x, b["mask"], "loss")
    g = _batch(PAD, garbage=True)
    g_adv = torch.where(g["mask"], g["adv"], torch.full_like(g["adv"], math.nan))
    g_loss = aggregate(g_adv, g["mask"], name, max_len=T)
    if not _close(loss.detach(), g_loss.detach()):
        fails.append(f"nan or padding under the mask changed the loss ({loss.item():.6g} -> {g_loss.item():.6g})")
    if getattr(fn, "divisor_count", None) is not None:
        blocks = [slice(0, 2), slice(2, 5), slice(5, 6)]
        w = micro_batch_weights(b["mask"], name, blocks)
        split = sum(wk * aggregate(b["adv"][bk], b["mask"][bk], name, max_len=T) for wk, bk in zip(w, blocks))
        if not _close(loss.detach(), torch.as_tensor(split, dtype=loss.dtype)):
            fails.append(f"micro-batches weighted by divisor_count give {float(split):.6g}, the whole batch "
                         f"{loss.item():.6g}: divisor_count does not match what the mode divides by")
    return fails


def _check_kl(name: str, settings_kw: dict) -> List[str]:
    fn = KL_ESTIMATORS.get(name)
    b = _batch()
    lp = b["logp"].clone().requires_grad_(True)
    out = fn(lp, b["ref"], b["old"])
    if not isinstance(out, torch.Tensor) or out.shape != b["mask"].shape:
        return [f"must return a (B, T) tensor, got {getattr(out, 'shape', type(out).__name__)}"]
    m = b["mask"]
    fails = [] if torch.isfinite(out[m]).all() else ["not finite at valid tokens of a random batch"]
    fails += _finite_grad(out.masked_fill(~m, 0.0).sum(), lp, m, "sum over valid tokens")
    same = fn(b["logp"], b["logp"].clone(), b["logp"].clone())
    if (same[m].abs() > 1e-12).any():
        fails.append("is not 0 where logp equals ref_logp (the KL of a policy to itself)")
    g = _batch(PAD, garbage=True)
    g_out = fn(g["logp"], g["ref"], g["old"])
    if not _close(out.detach()[m], g_out.detach()[:, :T][m]):
        fails.append("large values or padding under the mask changed the estimate at valid tokens (it must be "
                     "per token)")
    return fails


def _check_ratio_level(name: str, settings_kw: dict) -> List[str]:
    level = RATIO_LEVELS.get(name)
    b = _batch()
    lp = b["logp"].masked_fill(~b["mask"], 0.0).requires_grad_(True)
    old = b["old"].masked_fill(~b["mask"], 0.0)
    out = level.log_ratio(lp, old, b["mask"])
    if not isinstance(out, torch.Tensor) or out.shape != b["mask"].shape:
        return [f"log_ratio must return a (B, T) tensor, got {getattr(out, 'shape', type(out).__name__)}"]
    fails = [] if torch.isfinite(out).all() else ["log_ratio is not finite on a random batch"]
    if (out[~b["mask"]] != 0).any():
        fails.append("log_ratio is not 0 at masked positions")
    fails += _finite_grad(out.sum(), lp, b["mask"], "log_ratio")
    same = level.log_ratio(lp.detach(), lp.detach().clone(), b["mask"])
    if (same.abs() > 1e-12).any():
        fails.append("log_ratio is not 0 where logp equals old_logp (on-policy)")
    g = _batch(PAD)  # zeros under the mask, as the loop passes them, and three extra padded columns
    g_out = level.log_ratio(g["logp"].masked_fill(~g["mask"], 0.0), g["old"].masked_fill(~g["mask"], 0.0), g["mask"])
    if not _close(out.detach(), g_out.detach()[:, :T]):
        fails.append("padding columns changed the log-ratio at valid tokens")
    return fails


def _check_advantages(name: str, settings_kw: dict) -> List[str]:
    est = ADVANTAGE_ESTIMATORS.get(name)
    G = max(2, est.min_group_size)
    B = len(LENGTHS) - len(LENGTHS) % G or G
    fails: List[str] = []
    outs = []
    for extra, garbage in ((0, False), (PAD, True)):
        b = _batch(extra, garbage)
        m = b["mask"][:B]
        tok = torch.zeros(m.shape, dtype=torch.float64).masked_fill(~m, GARBAGE if garbage else 0.0)
        values = b["ref"][:B].masked_fill(~m, GARBAGE) if garbage else b["ref"][:B].masked_fill(~m, 0.0)
        adv, _ = est.compute(seq_rewards=b["rewards"][:B], token_rewards=tok, mask=m,
                             values=values if est.needs_values else None, group_size=G, cfg=_adv_cfg(),
                             **settings_kw)
        if not isinstance(adv, torch.Tensor) or adv.shape != m.shape:
            return [f"advantages must be a (B, T) tensor, got {getattr(adv, 'shape', type(adv).__name__)}"]
        if not torch.isfinite(adv[m]).all() or (adv[~m] != 0).any():
            fails.append("advantages must be finite at valid tokens and 0 at masked positions")
        outs.append(adv[:, :T])
    if not fails and not _close(outs[0], outs[1]):
        fails.append("large rewards or values under the mask (or padding columns) changed the advantages")
    if est.all_equal_zero and not fails:
        b = _batch()
        adv, _ = est.compute(seq_rewards=torch.ones(B, dtype=torch.float64), token_rewards=None, mask=b["mask"][:B],
                             values=b["ref"][:B] if est.needs_values else None, group_size=G, cfg=_adv_cfg(),
                             **settings_kw)
        if (adv != 0).any():
            fails.append("declares all_equal_zero but a group of equal rewards gets non-zero advantages")
    return fails


def _adv_cfg():
    from objbench.algos.config import AdvantageConfig

    return AdvantageConfig()


def _check_group_rule(name: str, settings_kw: dict) -> List[str]:
    from objbench.algos.config import GroupConfig, ObjectiveConfig

    rule = GROUP_SIZE_RULES.get(name)
    kw = {"thresholds": [1.5], "sizes": [2, 4]} if "sizes" in rule.reads else {}
    cfg = ObjectiveConfig(groups=GroupConfig(rule=name, **kw))
    got = rule.wanted(difficulties=[1, 2, 3], pass_rates={1: 0.9, 2: 0.5}, cfg=cfg, **settings_kw)
    if not isinstance(got, list) or len(got) != 3 or not all(isinstance(x, int) and x >= 1 for x in got):
        return [f"wanted must return one int >= 1 per prompt (3 prompts), got {got!r}"]
    return []


def _check_schedule_kind(name: str, settings_kw: dict) -> List[str]:
    from objbench.algos.schedules import Schedule

    kind = SCHEDULE_KINDS.get(name)
    kw = {"end": 0.1, "at": [0.5], "values": [0.1]}
    sched = Schedule(kind=name, **{k: v for k, v in kw.items() if k in kind.reads})
    vals = [kind.value(sched, 0.2, p) for p in (0.0, 0.5, 1.0)]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals):
        return [f"value must be a finite float at progress 0, 0.5 and 1, got {vals!r}"]
    return []


FAMILIES: Dict[str, tuple] = {
    "surrogate": (SURROGATES, _check_surrogate),
    "aggregation mode": (AGGREGATION_MODES, _check_aggregation),
    "kl estimator": (KL_ESTIMATORS, _check_kl),
    "ratio level": (RATIO_LEVELS, _check_ratio_level),
    "advantage estimator": (ADVANTAGE_ESTIMATORS, _check_advantages),
    "group-size rule": (GROUP_SIZE_RULES, _check_group_rule),
    "schedule kind": (SCHEDULE_KINDS, _check_schedule_kind),
}


def _settings_defaults(member) -> List[str]:
    cls = getattr(member, "settings", None)
    if cls is None:
        return []
    if not dataclasses.is_dataclass(cls):
        return [f"settings must be a dataclass, got {cls!r}"]
    missing = [f.name for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    return [f"settings {cls.__name__} must give every setting a default; missing: {missing}"] if missing else []


def check_member(family: str, name: str, options: Optional[dict] = None) -> List[str]:
    """The ways member ``name`` of ``family`` (a ``FAMILIES`` key) breaks its registry's contract; [] = conforms.
    ``options``: ``ObjectiveConfig.options``, where a member with settings finds its values (default: none, so the
    settings dataclass's defaults)."""
    registry, check = FAMILIES[family]
    member = registry.get(name)
    fails = _settings_defaults(member)
    if fails:
        return fails
    try:
        return check(name, settings_kwargs(member, name, options or {}))
    except Exception as e:  # noqa: BLE001 - a plug-in may raise anything; that is a failure to report
        return [f"raised {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}".rstrip(": ")]

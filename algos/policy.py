"""Importance ratios and the policy-gradient loss (PPO / GRPO / DAPO / GSPO, and CISPO / SAPO surrogates).

``policy_loss`` = ratio level (this module, registry ``RATIO_LEVELS``) x surrogate (``algos.surrogates``,
registry ``SURROGATES``: ppo_clip, cispo, sapo) x aggregation (``algos.aggregate``).

Ratio levels (registry ``RATIO_LEVELS``); every log-ratio is clamped to [-20, 20] as in verl/OpenRLHF,
so exp() cannot overflow (the clamp also zeroes the gradient beyond +-20, as theirs does):

  token           r_it = exp(lp_it - old_it)                                           PPO, GRPO, DAPO
  sequence        s_i  = exp( (1/|y_i|) sum_t m_it (lp_it - old_it) )                  GSPO (Zheng et al. 2025,
                  (the geometric mean of the token ratios)                             arXiv 2507.18071)
  sequence_token  log s_it = lp_it - sg(lp_it) + sg(log s_i)                           GSPO-token (same paper)
                  (value s_i, gradient of token t's own log-prob)

The default surrogate, ppo_clip (every preset): the clipped surrogate (Schulman et al. 2017, arXiv
1707.06347, eq. 7), with decoupled bounds (DAPO's clip-higher, Yu et al. 2025, arXiv 2503.14476, sec. 3.1)
and optional dual clip (Ye et al. 2020, arXiv 1912.09729) for A < 0:

  l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))          (= -min(r A, clip(r) A))
  l = min(-A c, l)   where A < 0, when dual_clip c is set (c > 1)

Sequence-level loss and aggregation (decision): for ``ratio="sequence"`` the ratio s_i is broadcast to
every valid token of y_i, so with a per-sequence advantage each token carries the sequence's loss
l_i = -min(s_i A_i, clip(s_i) A_i). The (B, T) matrix is then aggregated with the requested mode:
  seq_mean_token_mean      -> (1/B') sum_i l_i, the mean over sequences: GSPO's objective;
  token_mean               -> sum_i |y_i| l_i / sum_i |y_i|, sequences weighted by their length;
  seq_mean_token_sum       -> (1/B') sum_i |y_i| l_i;
  seq_mean_token_sum_norm  -> (1/(B' L)) sum_i |y_i| l_i.
Per-token advantages (B, T) are allowed with any level; with ``sequence`` each token then uses
-min(s_i A_it, clip(s_i) A_it). The other surrogates treat the broadcast s_i the same way (see
``algos.surrogates`` for which levels each accepts).
A consequence of broadcasting: on-policy (all ratios 1) the sequence, sequence_token and token levels give
the same loss and gradient under *every* aggregation mode, as long as the arms share the mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

from objbench.algos._checks import any_valid, as_mask, check_float, complement, row_counts, valid_count
from objbench.algos.aggregate import aggregate, aggregate_many
from objbench.algos.registry import AGGREGATION_MODES, RATIO_LEVELS, SURROGATES, settings_kwargs
from objbench.algos.surrogates import OPTION_DEFAULTS

__all__ = [
    "policy_loss",
    "token_log_ratio",
    "sequence_log_ratio",
    "sequence_token_log_ratio",
    "RatioLevel",
    "RATIO_LEVELS",
    "LOG_RATIO_CLAMP",
    "check_surrogate_options",
]

LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class RatioLevel:
    """Member type of ``RATIO_LEVELS``.

    log_ratio: fn(logp (B,T), old_logp (B,T), mask (B,T) bool) -> (B,T) log-ratio, 0 at masked positions.
    per_sequence: True when the ratio (and hence clipping) is one number per sequence, so ratio and
        clip metrics are averaged over sequences rather than tokens.
    """

    log_ratio: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    per_sequence: bool


def token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) log r_it = clamp(lp - old, -20, 20); 0 at masked positions."""
    mask = as_mask(mask)
    diff = (logp - old_logp).masked_fill(complement(mask), 0.0)
    return diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) log s_i = (1/|y_i|) sum_t m (lp - old), clamped to [-20, 20]; 0 for an empty row (GSPO)."""
    mask = as_mask(mask)
    diff = (logp - old_logp).masked_fill(complement(mask), 0.0)
    n = row_counts(mask, diff.dtype)[0]  # |y_i|, >= 1
    return (diff.sum(-1) / n).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def sequence_token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) GSPO-token: log s_it = lp - sg(lp) + sg(log s_i) (value log s_i, gradient d lp_it)."""
    mask = as_mask(mask)
    log_s = sequence_log_ratio(logp, old_logp, mask).detach()[:, None]  # (B, 1)
    out = logp - logp.detach() + log_s
    return out.masked_fill(complement(mask), 0.0)


def _sequence_broadcast(logp, old_logp, mask):
    return sequence_log_ratio(logp, old_logp, mask)[:, None].expand(mask.shape).masked_fill(complement(mask), 0.0)


RATIO_LEVELS.register("token", RatioLevel(token_log_ratio, per_sequence=False))
RATIO_LEVELS.register("sequence", RatioLevel(_sequence_broadcast, per_sequence=True))
RATIO_LEVELS.register("sequence_token", RatioLevel(sequence_token_log_ratio, per_sequence=False))


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ratio: str = "token",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: Optional[float] = None,
    agg: str = "token_mean",
    max_len: Optional[int] = None,
    surrogate: str = "ppo_clip",
    eps_low_is: Optional[float] = None,
    eps_high_is: float = 0.28,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> Tuple[torch.Tensor, dict]:
    """Policy-gradient loss: ratio level x surrogate, aggregated; see the module docstring and
    ``algos.surrogates`` for the formulas.

    Args:
        logp: (B, T) log pi_theta(y_t | ...) of the sampled tokens, with grad.
        old_logp: (B, T) behaviour-policy log-probs (treated as constants: detached here).
        advantages: (B,) per-sequence or (B, T) per-token advantages (constants: detached here).
        mask: (B, T) torch.bool (or 0/1 integer/float, converted); inputs under ~mask may be anything, even inf/nan.
        ratio: "token" | "sequence" | "sequence_token" (``RATIO_LEVELS``).
        surrogate: "ppo_clip" (default; every preset) | "cispo" | "sapo" (``SURROGATES``).
        eps_low, eps_high, dual_clip: ppo_clip's options. eps_low in [0, 1): lower clip bound 1 - eps_low;
            eps_high >= 0: upper bound 1 + eps_high; dual_clip None (off) or c > 1: for A < 0 the loss is
            capped at -A c.
        eps_low_is, eps_high_is: cispo's options. None (no lower bound, MiniMax-M1's setting) or in [0, 1]:
            the IS weight's lower bound 1 - eps_low_is; >= 0: its upper bound 1 + eps_high_is.
        tau_pos, tau_neg: sapo's gate temperatures (> 0) for positive / non-positive advantages.
        agg: aggregation mode (``algos.aggregate``); max_len: its L for seq_mean_token_sum_norm.
        An option the chosen surrogate does not read must keep its default (ValueError otherwise), so a
        sweep over it cannot produce identical arms under different labels.

    Returns:
        (loss 0-dim, metrics) with detached 0-dim metrics
          clipfrac_low / clipfrac_high: fraction of valid tokens (of sequences for ratio="sequence") where
              the surrogate's clip is active -- ppo_clip: A < 0 and r < 1 - eps_low / A > 0 and
              r > 1 + eps_high; cispo: the IS weight is clipped, r < 1 - eps_low_is / r > 1 + eps_high_is;
              sapo: 0 (no hard clip);
          ratio_mean, ratio_max, ratio_min: of r (of s_i for "sequence") over valid tokens;
          dual_clip_frac: fraction of valid tokens where the dual clip is active (0 when off or not ppo_clip);
          approx_kl: mean over valid tokens of k3 with x = old - lp, i.e. e^x - 1 - x, an estimate of
              KL(pi_old || pi_theta) from the behaviour samples.
        All metrics are 0 for an all-masked batch.
    """
    mask = as_mask(mask)
    options = dict(eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip, eps_low_is=eps_low_is,
                   eps_high_is=eps_high_is, tau_pos=tau_pos, tau_neg=tau_neg)
    sur = _check_args(logp, old_logp, advantages, mask, ratio, surrogate, agg, options)
    # a plug-in surrogate's own settings take their defaults here (compute_loss passes ObjectiveConfig.options)
    return _masked_policy_loss(*_masked_log_probs(logp, old_logp, mask), advantages, mask, ratio, sur, options, agg,
                               max_len, settings_kwargs(sur, surrogate, {}))


def _masked_log_probs(logp, old_logp, mask):
    """(logp, old_logp detached), 0 under ~mask: garbage there is replaced before any arithmetic, so it reaches
    neither value nor gradient."""
    inv = complement(mask)
    return logp.masked_fill(inv, 0.0), old_logp.detach().masked_fill(inv, 0.0)


def _check_args(logp, old_logp, advantages, mask, ratio, surrogate, agg, options):
    """policy_loss's argument checks (mask: a bool mask); returns the surrogate."""
    check_float(logp, "logp", shape=mask.shape)
    check_float(old_logp, "old_logp", shape=mask.shape)
    check_float(advantages, "advantages")
    if advantages.shape not in (mask.shape[:1], mask.shape):
        raise ValueError(
            f"advantages must have shape (B,) = {tuple(mask.shape[:1])} or (B, T) = {tuple(mask.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    key = (ratio, surrogate, agg, tuple(options.items()))
    try:
        sur = _CHECKED.get(key)
    except TypeError:  # an unhashable value: the checks say what is wrong with it
        return _check_choices(ratio, surrogate, agg, options)
    if sur is None:
        sur = _check_choices(ratio, surrogate, agg, options)
        if len(_CHECKED) >= 256:
            _CHECKED.clear()
        _CHECKED[key] = sur
    return sur


# (ratio, surrogate, agg, options) combinations that passed _check_choices -> their surrogate. Registered names
# are never re-bound (Registry refuses a second registration), so a passed combination stays valid; one that
# failed raised and is not kept. Every training step calls policy_loss with the same few combinations.
_CHECKED: dict = {}


def _check_choices(ratio, surrogate, agg, options):
    if ratio not in RATIO_LEVELS:
        raise ValueError(f"ratio must be one of {list(RATIO_LEVELS.names())}, got {ratio!r}")
    if surrogate not in SURROGATES:
        raise ValueError(f"surrogate must be one of {list(SURROGATES.names())}, got {surrogate!r}")
    if agg not in AGGREGATION_MODES:
        raise ValueError(f"agg must be one of {list(AGGREGATION_MODES.names())}, got {agg!r}")
    check_surrogate_options(options)
    sur = SURROGATES.get(surrogate)
    if ratio not in sur.levels:
        raise ValueError(f"ratio {ratio!r} is not accepted by surrogate {surrogate!r} (accepts {list(sur.levels)}); "
                         f"see algos.surrogates")
    for name, value in options.items():
        if name not in sur.reads and value != OPTION_DEFAULTS[name]:
            raise ValueError(
                f"{name}={value!r} is not read by surrogate {surrogate!r} (it reads {list(sur.reads)}); leave {name} "
                f"at its default {OPTION_DEFAULTS[name]!r}"
            )
    return sur


def _masked_policy_loss(lp, old, advantages, mask, ratio, sur, options, agg, max_len, settings_kw):
    """policy_loss after its checks, from log-probs already 0 under ~mask (``lp`` with grad, ``old`` detached);
    compute_loss calls it with the masked log-probs it shares with the KL term."""
    inv = complement(mask)
    adv = advantages.detach()
    if adv.dim() == 1:
        adv = adv[:, None].expand(mask.shape)
    adv = adv.masked_fill(inv, 0.0)  # (B, T)

    level = RATIO_LEVELS.get(ratio)
    log_r = level.log_ratio(lp, old, mask)  # (B, T)
    r = torch.exp(log_r)

    loss_mat, events = sur.loss(ratio=r, logp=lp, adv=adv, mask=mask, opts={k: options[k] for k in sur.reads},
                                **settings_kw)
    loss = aggregate(loss_mat, mask, agg, max_len)

    with torch.no_grad():
        dtype = lp.dtype
        rd = r.detach()
        x = old - lp.detach()  # log pi_old / pi_theta per token
        x = x.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        # the metrics below are aggregates / masked_max / masked_min, with the mask's complement, counts and any()
        # memoised (algos._checks.mask_memo: the same operations, so the same numbers)
        big = torch.finfo(dtype).max
        any_tok = any_valid(mask)
        r_max, r_min = rd.masked_fill(inv, -big).amax(), rd.masked_fill(inv, big).amin()
        # the means, stacked: aggregate_many gives each one's aggregate(., mask, mode) to the last bit. The clip
        # fractions and the mean ratio per token, or per sequence for a sequence-level ratio; the rest per token.
        # An event the surrogate does not report is 0 everywhere: its mean is 0.
        zero = torch.zeros((), dtype=dtype, device=mask.device)
        unit = [("clipfrac_low", events.get("clip_low")), ("clipfrac_high", events.get("clip_high")),
                ("ratio_mean", rd)]
        tok = [("dual_clip_frac", events.get("dual_clip")), ("approx_kl", torch.expm1(x) - x)]
        unit, tok = [(k, v) for k, v in unit if v is not None], [(k, v) for k, v in tok if v is not None]
        if not level.per_sequence:
            unit, tok = [], unit + tok
        metrics = {"clipfrac_low": zero, "clipfrac_high": zero, "dual_clip_frac": zero}
        for items, mode in ((unit, "seq_mean_token_mean"), (tok, "token_mean")):
            if items:
                means = aggregate_many(torch.stack([v.to(dtype) for _, v in items]), mask, mode)
                metrics.update(zip([k for k, _ in items], means.unbind()))
        metrics["ratio_max"] = torch.where(any_tok, r_max, 0.0)
        metrics["ratio_min"] = torch.where(any_tok, r_min, 0.0)
        metrics = {k: metrics[k] for k in ("clipfrac_low", "clipfrac_high", "ratio_mean", "ratio_max", "ratio_min",
                                           "dual_clip_frac", "approx_kl")}
    return loss, metrics


def check_surrogate_options(options: dict) -> None:
    """Range checks of the surrogate options (ValueError naming the option)."""
    eps_low, eps_high, dual_clip = options["eps_low"], options["eps_high"], options["dual_clip"]
    if not 0.0 <= eps_low < 1.0:
        raise ValueError(f"eps_low must be in [0, 1), got {eps_low}")
    if not eps_high >= 0.0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be None or > 1, got {dual_clip}")
    if options["eps_low_is"] is not None and not 0.0 <= options["eps_low_is"] <= 1.0:
        raise ValueError(f"eps_low_is must be None or in [0, 1], got {options['eps_low_is']}")
    if not options["eps_high_is"] >= 0.0:
        raise ValueError(f"eps_high_is must be >= 0, got {options['eps_high_is']}")
    for name in ("tau_pos", "tau_neg"):
        if not options[name] > 0.0:
            raise ValueError(f"{name} must be > 0, got {options[name]}")

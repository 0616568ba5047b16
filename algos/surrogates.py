"""Policy-gradient surrogates: the per-token loss made of the importance ratio and the advantage.

Registry ``SURROGATES``; every member is one function plus one registration, with one signature:

    loss(*, ratio (B,T), logp (B,T), adv (B,T), mask (B,T) bool, opts) -> (loss_mat (B,T), events)

``ratio`` is r = exp(log-ratio) of the configured ratio level (token r_it, or the sequence ratio s_i
broadcast to the tokens of y_i), differentiable; ``logp`` the current log-probs (0 under the mask);
``adv`` the advantages (constants, 0 under the mask); ``opts`` a dict holding exactly the ``RatioConfig``
fields the member declares in ``reads``; ``events`` (B, T) bool tensors, computed without grad, that
``policy_loss`` turns into metrics: ``clip_low`` / ``clip_high`` (the member's clip is active at that
token) and ``dual_clip``; a member without such events omits them (their metric is then 0).
``levels`` lists the ratio levels the member accepts; configs and ``policy_loss`` reject the others.

=========  ===========================================================================  ==================
name       per-token loss l (minimised; A = advantage, r = ratio, lp = log-prob)         reads
=========  ===========================================================================  ==================
ppo_clip   max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)); with dual_clip c, where   eps_low, eps_high,
           A < 0: min(-A c, l)                                                          dual_clip
cispo      -sg(clip(r, 1 - eps_low_is, 1 + eps_high_is)) A lp  (lower bound off when    eps_low_is,
           eps_low_is is None)                                                          eps_high_is
sapo       -(4 / tau) sigmoid(tau (r - 1)) A,  tau = tau_pos if A > 0 else tau_neg     tau_pos, tau_neg
=========  ===========================================================================  ==================

ppo_clip -- Schulman et al. 2017 (arXiv 1707.06347, eq. 7), decoupled bounds as DAPO's clip-higher (Yu et
    al. 2025, arXiv 2503.14476, sec. 3.1), dual clip (Ye et al. 2020, arXiv 1912.09729; verl
    ``clip_ratio_c``, for A < 0 only; TRL's ``delta`` caps the ratio for both signs of A and equals it only when
    delta >= 1 + eps_high, see docs/frameworks.md). Every preset uses it; its arithmetic is exactly that of
    ``policy_loss`` before the registry existed (tests/test_algos_pins.py). All ratio levels.

cispo -- MiniMax-M1 (Chen et al. 2025, arXiv 2506.13585, eqs. 4-5): the objective is
    J = E[ (1 / sum_i |o_i|) sum_i sum_t sg(r^_it) A_it log pi(o_it | q, o_i<t) ],
    r^_it = clip(r_it, 1 - eps_low^IS, 1 + eps_high^IS); the normaliser is token_mean's, which
    ``loss.agg`` supplies. Unlike PPO's clip the stop-gradient weight never zeroes a token's gradient:
    d l / d lp = -sg(r^) A, so on-policy (r = 1) the gradient equals ppo_clip's. The paper "did not impose
    a lower bound on the IS weight ... only tuned eps_high^IS": ``eps_low_is = None`` (the default) is
    that; a number sets the bound 1 - eps_low_is. The loss *value* is -w A lp (the paper's form), not
    comparable to ppo_clip's value; compare gradients. Metrics: clip_low / clip_high count tokens whose
    weight is clipped (r < 1 - eps_low_is / r > 1 + eps_high_is), whatever the sign of A -- the gradient
    is kept there, only its weight is capped.
    Ratio levels: token (the paper's) and sequence (weight sg(clip(s_i)), a sequence-level IS weight).
    sequence_token is rejected: the weight is a stop-gradient, and sequence_token's ratio has exactly
    sequence's value, so the two would be the same arm under two labels.

sapo -- Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv 2511.20347, the gate of its eqs. 5-6
    with the sign-dependent temperature of its eq. 12, as implemented in verl's ``compute_policy_loss_sapo``
    and TRL/ms-swift):
    J = E[ (1/G) sum_i (1/|y_i|) sum_t f_it(r_it) A_it ],  f_it(r) = (4 / tau_i) sigmoid(tau_i (r - 1)),
    tau_i = tau_pos if A_i > 0 else tau_neg
    (the per-sequence 1/|y_i| mean is ``loss.agg = seq_mean_token_mean``). A smooth gate instead of a hard
    clip: d f / d lp = 4 p (1 - p) r with p = sigmoid(tau (r - 1)), so the gradient weight relative to the
    unclipped r A is 4 p (1 - p), exactly 1 at r = 1 (on-policy SAPO = GRPO's gradient) and decaying
    smoothly -- faster with a larger tau -- as r leaves 1. The value at r = 1 is -(2 / tau) A (an offset,
    no gradient). Defaults tau_pos = 1.0, tau_neg = 1.05 are those of verl, TRL and ms-swift (the paper
    takes tau_neg > tau_pos: negative-advantage updates, which push many other tokens' probabilities up,
    are damped faster). tau is chosen per token from the sign of that token's advantage (the sequence's
    sign for per-sequence advantages). No hard clip, so clipfrac metrics are 0.
    Ratio levels: all three. token is the paper's; sequence gates s_i (a GSPO-style sequence gate);
    sequence_token gates s_i with each token's own gradient, equal to sequence for per-sequence advantages
    (as GSPO-token is to GSPO).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from objbench.algos.registry import SURROGATES

__all__ = ["Surrogate", "SURROGATES", "OPTION_DEFAULTS", "ppo_clip", "cispo", "sapo"]

# the defaults of every surrogate option, shared by policy_loss's signature and RatioConfig (a test checks
# all three agree); an option a surrogate does not read must be left at its default
OPTION_DEFAULTS = {
    "eps_low": 0.2,
    "eps_high": 0.2,
    "dual_clip": None,
    "eps_low_is": None,
    "eps_high_is": 0.28,
    "tau_pos": 1.0,
    "tau_neg": 1.05,
}


@dataclass(frozen=True)
class Surrogate:
    """Member type of ``SURROGATES`` (see the module docstring for the signature of ``loss``).

    reads: the ``RatioConfig`` fields (surrogate options) ``loss`` finds in ``opts``.
    levels: the ratio levels (``RATIO_LEVELS`` names) the surrogate accepts.
    settings: a plug-in's own settings (a dataclass; ``objective.options.<name>.<field>``), or None. When given,
        ``loss`` is also called with ``settings=`` that dataclass's instance.
    """

    loss: Callable[..., Tuple[torch.Tensor, Dict[str, torch.Tensor]]]
    reads: Tuple[str, ...]
    levels: Tuple[str, ...]
    settings: Optional[type] = None


def ppo_clip(*, ratio, logp, adv, mask, opts):
    eps_low, eps_high, dual_clip = opts["eps_low"], opts["eps_high"], opts["dual_clip"]
    neg_adv = -adv
    pg_losses1 = neg_adv * ratio  # unclipped surrogate
    pg_losses2 = neg_adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # clipped surrogate
    clip_pg_losses = torch.maximum(pg_losses1, pg_losses2)  # -min(r A, clip(r) A)
    if dual_clip is not None:
        pg_losses3 = neg_adv * dual_clip  # lower bound on the objective for A < 0
        loss_mat = torch.where(adv < 0, torch.minimum(pg_losses3, clip_pg_losses), clip_pg_losses)
    else:
        loss_mat = clip_pg_losses
    with torch.no_grad():
        rd = ratio.detach()
        events = {"clip_low": (adv < 0) & (rd < 1.0 - eps_low), "clip_high": (adv > 0) & (rd > 1.0 + eps_high)}
        if dual_clip is not None:
            events["dual_clip"] = (adv < 0) & (pg_losses3 < clip_pg_losses.detach())
    return loss_mat, events


def cispo(*, ratio, logp, adv, mask, opts):
    low = None if opts["eps_low_is"] is None else 1.0 - opts["eps_low_is"]
    high = 1.0 + opts["eps_high_is"]
    weight = torch.clamp(ratio.detach(), min=low, max=high)  # sg(clip(r)): a constant per token
    loss_mat = -weight * adv * logp
    with torch.no_grad():
        rd = ratio.detach()
        events = {"clip_high": rd > high}
        if low is not None:
            events["clip_low"] = rd < low
    return loss_mat, events


def sapo(*, ratio, logp, adv, mask, opts):
    # tau per token from the sign of its advantage, in the advantages' dtype (no float32 promotion)
    tau = torch.where(adv > 0, adv.new_full((), opts["tau_pos"]), adv.new_full((), opts["tau_neg"]))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)  # f(r) = (4 / tau) sigmoid(tau (r - 1))
    return -gate * adv, {}


_ALL_LEVELS = ("token", "sequence", "sequence_token")
SURROGATES.register("ppo_clip", Surrogate(ppo_clip, reads=("eps_low", "eps_high", "dual_clip"), levels=_ALL_LEVELS))
SURROGATES.register("cispo", Surrogate(cispo, reads=("eps_low_is", "eps_high_is"), levels=("token", "sequence")))
SURROGATES.register("sapo", Surrogate(sapo, reads=("tau_pos", "tau_neg"), levels=_ALL_LEVELS))

"""The one entry point the training loop calls: advantages, policy(+KL, +entropy) loss, value loss.

    adv, returns, m1 = compute_advantages(cfg, rewards=R, mask=mask, values=V, old_logp=old,
                                          ref_logp=ref, max_len=max_new_tokens, group_sizes=None)
    loss, m2 = compute_loss(cfg, logp=lp, old_logp=old, advantages=adv, mask=loss_mask, ref_logp=ref,
                            entropy=H, max_len=max_new_tokens)
    vloss, m3 = compute_value_loss(cfg, values=V_new, old_values=V, returns=returns, mask=loss_mask)
    (cfg.value.coef * vloss).backward()   # the loop applies the coefficient

Nothing here branches on a preset or component name: components come from the registries, and the only
branches are on config fields (KL placement, whether a coefficient is non-zero).

Masks: all three take (B, T) masks, True = valid token: torch.bool, or integer/float tensors holding only
0s and 1s (Hugging Face's int64 attention masks, verl's and TRL's float masks), converted once on entry
(``algos._checks.as_mask``; any other value, e.g. 0.5, 2 or NaN, is an error naming the argument). The mask may already have whole rows removed by
``algos.filters.overlong_filter``: such a row gets advantage 0 at every position, its reward still enters
its group's mean/std (the filter removes a response from the loss, not from the baseline), and
``aggregate`` leaves it out of the sequence count. Advantages are constants: ``compute_advantages`` runs
under ``torch.no_grad()``.

``max_len`` (the sampler's maximum response length) is the L of the seq_mean_token_sum_norm aggregation in
the losses; a set ``cfg.loss.max_len`` takes precedence over the argument.

Every metric key is documented in ``METRIC_DOCS``; values are detached 0-dim tensors (no ``.item()`` here:
the caller decides when to sync).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch

from objbench.algos._checks import as_mask, check_float, complement, masked_mean
from objbench.algos.advantages import value_loss, zero_variance_groups
from objbench.algos.groups import layout
from objbench.algos.aggregate import aggregate, aggregate_many
from objbench.algos.config import ObjectiveConfig
from objbench.algos.kl import estimate
from objbench.algos.policy import _check_args as _check_policy_loss_args
from objbench.algos.policy import _masked_log_probs, _masked_policy_loss
from objbench.algos.registry import ADVANTAGE_ESTIMATORS, settings_kwargs
from objbench.algos.surrogates import OPTION_DEFAULTS

__all__ = ["compute_advantages", "compute_loss", "compute_value_loss", "METRIC_DOCS"]

METRIC_DOCS: Dict[str, str] = {
    # compute_advantages
    "reward_mean": "mean of the input rewards R (before any shaping)",
    "pass_rate": "fraction of responses with input reward >= 0.5",
    "zero_var_frac": "fraction of groups whose rewards, as the all-equal test sees them (shaped, or the outcome "
    "rewards with kl.reward_zero_var_check 'outcome'), are all equal (zero advantage, no signal)",
    "kl_in_reward_mean": "mean over valid tokens of the per-token KL estimate k(old, ref) placed in the reward "
    "(before beta; 0 when off)",
    "adv_mean": "mean advantage over valid tokens",
    "adv_std": "std (ddof 0) of the advantage over valid tokens",
    "adv_abs_mean": "mean |advantage| over valid tokens",
    # compute_loss (policy_loss keys first)
    "clipfrac_low": "fraction of valid tokens (sequences for ratio 'sequence') where the surrogate's lower clip is "
    "active: ppo_clip A < 0 and r < 1 - eps_low; cispo r < 1 - eps_low_is (weight capped); sapo 0 (no hard clip)",
    "clipfrac_high": "fraction of valid tokens (sequences for ratio 'sequence') where the surrogate's upper clip is "
    "active: ppo_clip A > 0 and r > 1 + eps_high; cispo r > 1 + eps_high_is (weight capped); sapo 0",
    "ratio_mean": "mean importance ratio over valid tokens (sequences for ratio 'sequence')",
    "ratio_max": "max importance ratio over valid tokens",
    "ratio_min": "min importance ratio over valid tokens",
    "dual_clip_frac": "fraction of valid tokens where ppo_clip's dual clip caps the loss (0 when off)",
    "approx_kl": "mean over valid tokens of k3(old -> current): e^x - 1 - x with x = old - lp",
    "policy_loss": "the policy-gradient (surrogate) term, aggregated",
    "kl_loss": "aggregated KL estimate added to the loss (before beta; only with kl.placement 'loss')",
    "kl_ref": "mean over valid tokens of k3(current, ref), a cross-arm comparable KL to the reference",
    "entropy": "aggregated per-token entropy (when an entropy tensor is given)",
    "loss": "the total returned loss: policy_loss + beta kl_loss - entropy_coef entropy",
    # compute_value_loss
    "value_loss": "clipped value loss, aggregated (value.coef is applied by the training loop)",
    "value_clipfrac": "fraction of valid tokens where the clipped value loss is the larger term",
    "value_mean": "mean value prediction over valid tokens",
    "value_explained_var": "1 - Var[R - V] / Var[R] over valid tokens (0 when Var[R] = 0)",
}


def _loss_max_len(cfg: ObjectiveConfig, max_len: Optional[int]) -> Optional[int]:
    return cfg.loss.max_len if cfg.loss.max_len is not None else max_len


@torch.no_grad()
def compute_advantages(
    cfg: ObjectiveConfig,
    *,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    values: Optional[torch.Tensor] = None,
    old_logp: Optional[torch.Tensor] = None,
    ref_logp: Optional[torch.Tensor] = None,
    max_len: Optional[int] = None,
    group_sizes: Optional[Sequence[int]] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Dict[str, torch.Tensor]]:
    """KL-in-reward shaping, then the configured advantage estimator, broadcast to tokens.

    The DAPO overlong penalty is *not* applied here: the training loop adds ``algos.filters.overlong_penalty``
    to the rewards when it samples (before dynamic sampling looks at them), so ``rewards`` arrive shaped.

    1. KL in the reward when ``cfg.kl.placement == "reward"`` and beta > 0, with k_t = estimate(old, ref)
       (the behaviour policy's tokens):
         group estimators: R_i - beta sum_t m_t k_t before normalisation (verl use_kl_in_reward);
         gae: per-token reward -beta k_t at each valid token plus R_i on the last valid token
              (OpenRLHF / classic RLHF).
       Both views come from one construction (``_shaped_rewards``).
    2. The estimator from ``ADVANTAGE_ESTIMATORS``; per-sequence advantages are broadcast to valid tokens.
    3. The all-equal test with KL in the reward (``cfg.kl.reward_zero_var_check``; group baselines only, the
       estimators with ``all_equal_zero``):
         "shaped" (default): the estimator sees only the shaped rewards R_i - beta sum_t k_t, so a group whose
              outcome rewards are all equal (all correct / all wrong) is *not* all-equal any more: its
              advantages are the KL noise, and with std scaling that noise is blown up to unit size whatever
              beta is (beta = 0.04 and 1e-4 give the same advantages). This is verl's behaviour
              (``algorithm.use_kl_in_reward``: ``apply_kl_penalty`` subtracts beta * kl from the token-level
              scores before ``compute_grpo_outcome_advantage`` normalises their sum per group).
         "outcome": the test runs on the rewards as passed in (``rewards``: the outcome, plus the overlong
              penalty if on) -- a group whose outcome rewards are all equal gets advantage 0 at every token;
              other groups are normalised on their shaped rewards as under "shaped".
       Without KL in the reward (or with beta = 0) both are the same thing.

    Args:
        cfg: ObjectiveConfig.
        rewards: (B,) float outcome rewards, contiguous groups of cfg.group_size (or of ``group_sizes``).
        mask: (B, T) torch.bool response mask.
        values: (B, T) critic values (required by gae).
        old_logp, ref_logp: (B, T) behaviour / reference log-probs (required for KL in the reward).
        max_len: accepted for signature symmetry with ``compute_loss``; no current estimator uses it.
        group_sizes: None = equal groups of cfg.group_size; else the size of each contiguous group, Python ints
            summing to B (adaptive group sizes, ``cfg.groups``; see ``algos.groups``).

    Returns:
        advantages (B, T) (0 at masked positions), returns (B, T) for gae else None, metrics.
    """
    mask = as_mask(mask)
    check_float(rewards, "rewards", shape=mask.shape[:1])
    B = mask.shape[0]
    groups = cfg.group_size if group_sizes is None else group_sizes  # the layout: an int G or one size per group
    G, sizes = layout(groups, B, minimum=1)
    est = ADVANTAGE_ESTIMATORS.get(cfg.adv.estimator)
    if est.needs_values and values is None:
        raise ValueError(f"values (B, T) are required by adv.estimator={cfg.adv.estimator!r}")
    if values is not None:
        check_float(values, "values", shape=mask.shape)
        values = values.detach()

    R = rewards.detach()
    metrics: Dict[str, torch.Tensor] = {"reward_mean": R.mean(), "pass_rate": (R >= 0.5).to(R.dtype).mean()}
    # 1. KL in the reward (per token)
    token_rewards, seq_rewards, metrics["kl_in_reward_mean"] = _shaped_rewards(
        cfg, R, mask, old_logp, ref_logp, with_token_rewards=est.reads_token_rewards)
    # 3. the all-equal test, on the outcome or the shaped rewards
    outcome_test, zero_var, metrics["zero_var_frac"] = _zero_variance_test(cfg, R, seq_rewards, groups, G, sizes)

    # 2. the advantage estimator (one signature for every member)
    advantages, returns = est.compute(seq_rewards=seq_rewards, token_rewards=token_rewards, mask=mask, values=values,
                                      group_size=groups, cfg=cfg.adv,
                                      **settings_kwargs(est, cfg.adv.estimator, cfg.options))
    if outcome_test:  # all-equal outcome groups: advantage 0 at every token, the KL noise discarded
        repeats = G if sizes is None else torch.tensor(sizes, device=zero_var.device)
        advantages = advantages.masked_fill(zero_var.repeat_interleave(repeats)[:, None], 0.0)
    metrics.update(_advantage_metrics(advantages, mask))
    return advantages, returns, metrics


def _outcome_on_last_token(R: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T): R_i at row i's last valid token, 0 elsewhere (an empty row is all 0)."""
    is_last = mask & (mask.flip(-1).cumsum(-1).flip(-1) == 1)  # (B, T): exactly one True per non-empty row
    return torch.where(is_last, R[:, None], torch.zeros(mask.shape, dtype=R.dtype, device=R.device))


def _shaped_rewards(
    cfg: ObjectiveConfig,
    R: torch.Tensor,
    mask: torch.Tensor,
    old_logp: Optional[torch.Tensor],
    ref_logp: Optional[torch.Tensor],
    *,
    with_token_rewards: bool,
) -> Tuple[Optional[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Step 1 of ``compute_advantages``: (token_rewards, seq_rewards, kl_in_reward_mean).

    token_rewards (B, T) = R_i at the last valid token - beta k_t at every valid token (only when
    ``with_token_rewards``, i.e. for an estimator that reads them, else None); seq_rewards (B,) = sum_t
    token_rewards = R_i - beta sum_t k_t. Without KL in the reward, k_t = 0.
    """
    if cfg.kl.placement == "reward" and cfg.kl.beta > 0:
        if old_logp is None or ref_logp is None:
            raise ValueError("old_logp and ref_logp (B, T) are required for kl.placement='reward'")
        check_float(old_logp, "old_logp", shape=mask.shape)
        check_float(ref_logp, "ref_logp", shape=mask.shape)
        inv = complement(mask)
        old = old_logp.detach().masked_fill(inv, 0.0)
        ref = ref_logp.detach().masked_fill(inv, 0.0)
        kl_tok = estimate(old, ref, cfg.kl.estimator, clamp=cfg.kl.clamp).to(R.dtype).masked_fill(inv, 0.0)
        kl_mean = masked_mean(kl_tok, mask)
        token_penalty = -cfg.kl.beta * kl_tok
        token_rewards = _outcome_on_last_token(R, mask) + token_penalty if with_token_rewards else None
        seq_rewards = R + token_penalty.sum(-1)  # R_i - beta sum_t k_t  (B,)
    else:
        # k_t = 0: the same numbers as above without the zero tensors (x + (-0.0) = x, and the sum of the
        # zero penalties is +0.0, so R + 0.0); token_rewards only for an estimator that reads them (GAE)
        kl_mean = R.new_zeros(())
        token_rewards = _outcome_on_last_token(R, mask) if with_token_rewards else None
        seq_rewards = R + 0.0
    return token_rewards, seq_rewards, kl_mean


def _zero_variance_test(
    cfg: ObjectiveConfig, R: torch.Tensor, seq_rewards: torch.Tensor, groups, G: int, sizes: Optional[Sequence[int]]
) -> Tuple[bool, Optional[torch.Tensor], torch.Tensor]:
    """Step 3 of ``compute_advantages``: (outcome_test, zero_var (n_groups,) bool or None, zero_var_frac).

    outcome_test: the test runs on the outcome rewards ``R`` (kl.reward_zero_var_check 'outcome' with KL in the
    reward) and its all-equal groups get advantage 0; else it runs on ``seq_rewards``. A layout of singleton
    groups (equal groups of G = 1) has no test: zero_var None, zero_var_frac 0.
    """
    # config validation allows "outcome" only with placement reward and an estimator that has the test
    outcome_test = cfg.kl.reward_zero_var_check == "outcome" and cfg.kl.placement == "reward"
    if sizes is not None or G >= 2:
        zero_var = zero_variance_groups(R if outcome_test else seq_rewards, groups)  # (n_groups,)
        return outcome_test, zero_var, zero_var.to(R.dtype).mean()
    return outcome_test, None, R.new_zeros(())


def _advantage_metrics(advantages: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
    """adv_mean, adv_std, adv_abs_mean over valid tokens."""
    # masked_mean of A and |A| in one stacked pass (aggregate_many's token_mean is masked_mean to the last bit)
    a_mean, a_abs_mean = aggregate_many(torch.stack([advantages, advantages.abs()]), mask, "token_mean").unbind()
    return {
        "adv_mean": a_mean,
        "adv_std": masked_mean((advantages - a_mean) ** 2, mask).sqrt(),
        "adv_abs_mean": a_abs_mean,
    }


def compute_loss(
    cfg: ObjectiveConfig,
    *,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: Optional[torch.Tensor] = None,
    entropy: Optional[torch.Tensor] = None,
    max_len: Optional[int] = None,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Policy loss + beta * KL loss - entropy_coef * entropy, all aggregated with ``cfg.loss.agg``.

        loss = aggregate(l_pg) + beta aggregate(k(lp, ref)) - c_H aggregate(H)

    (the KL term only with ``cfg.kl.placement == "loss"``; GRPO eq. 3 places it inside the same
    per-sequence token mean as the policy term, which "same aggregation mode" reproduces).

    Args:
        cfg: ObjectiveConfig.
        logp: (B, T) current log-probs of the sampled tokens (with grad).
        old_logp: (B, T) behaviour log-probs.  advantages: (B, T) (or (B,)) from ``compute_advantages``.
        mask: (B, T) torch.bool loss mask.
        ref_logp: (B, T) reference log-probs; required when the KL is in the loss; if given, ``kl_ref`` is
            reported in any case.
        entropy: (B, T) per-token entropies (with grad for a bonus); required when loss.entropy_coef != 0.
        max_len: L for seq_mean_token_sum_norm when cfg.loss.max_len is None.

    Returns:
        (loss 0-dim, metrics); see ``METRIC_DOCS``.
    """
    mask = as_mask(mask)  # once here: policy_loss and aggregate below then see a bool mask
    agg = cfg.loss.agg
    L = _loss_max_len(cfg, max_len)
    # policy_loss(logp, old_logp, advantages, mask, ratio=..., surrogate=..., <surrogate options>, agg, max_len),
    # with the masked log-probs kept for the KL term
    options = {name: getattr(cfg.ratio, name) for name in OPTION_DEFAULTS}
    sur = _check_policy_loss_args(logp, old_logp, advantages, mask, cfg.ratio.level, cfg.ratio.surrogate, agg,
                                  options)
    lp, old = _masked_log_probs(logp, old_logp, mask)  # sanitised before exp/log: garbage must not reach the gradient
    loss, metrics = _masked_policy_loss(lp, old, advantages, mask, cfg.ratio.level, sur, options, agg, L,
                                        settings_kwargs(sur, cfg.ratio.surrogate, cfg.options))
    metrics["policy_loss"] = loss.detach()

    kl_in_loss = cfg.kl.placement == "loss" and cfg.kl.beta > 0
    if kl_in_loss and ref_logp is None:
        raise ValueError("ref_logp (B, T) is required for kl.placement='loss' with beta > 0")
    if ref_logp is not None:
        check_float(ref_logp, "ref_logp", shape=mask.shape)
        k3_ref = None
        if kl_in_loss:
            ref = ref_logp.detach().masked_fill(complement(mask), 0.0)
            kl_mat = estimate(lp, ref, cfg.kl.estimator, old_logp=old, clamp=cfg.kl.clamp)  # (B, T)
            kl_loss = aggregate(kl_mat, mask, agg, L)
            loss = loss + cfg.kl.beta * kl_loss
            metrics["kl_loss"] = kl_loss.detach()
            if cfg.kl.estimator == "k3" and cfg.kl.clamp is None:
                k3_ref = kl_mat.detach()  # the values kl_ref reads
        with torch.no_grad():
            if k3_ref is None:
                # a metric, no gradient: garbage under the mask may give inf / nan there, which masked_mean
                # drops (it fills those positions before summing); the valid positions' values are the same
                k3_ref = estimate(logp.detach(), ref_logp.detach(), "k3")
            metrics["kl_ref"] = masked_mean(k3_ref, mask)

    if entropy is not None:
        check_float(entropy, "entropy", shape=mask.shape)
        ent = aggregate(entropy, mask, agg, L)  # aggregate ignores (fills) what lies under ~mask
        metrics["entropy"] = ent.detach()
        if cfg.loss.entropy_coef != 0.0:
            loss = loss - cfg.loss.entropy_coef * ent
    elif cfg.loss.entropy_coef != 0.0:
        raise ValueError(f"entropy (B, T) is required when loss.entropy_coef = {cfg.loss.entropy_coef} != 0")

    metrics["loss"] = loss.detach()
    return loss, metrics


def compute_value_loss(
    cfg: ObjectiveConfig,
    *,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    max_len: Optional[int] = None,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Clipped value loss (``algos.advantages.value_loss``) with clip ``cfg.value.cliprange``, aggregated
    with ``cfg.loss.agg`` (the critic uses the actor's aggregation mode, as verl's default does).

    The returned loss is *not* multiplied by ``cfg.value.coef``: the critic has its own optimizer in the
    training loop, which applies the coefficient (and ``value.lr_scale``) itself.

    Args: values (B, T) with grad; old_values, returns (B, T) (constants); mask (B, T) torch.bool;
        max_len for seq_mean_token_sum_norm when cfg.loss.max_len is None.
    Returns: (loss, metrics).
    """
    mask = as_mask(mask)
    loss, metrics = value_loss(
        values,
        old_values.detach(),
        returns.detach(),
        mask,
        cfg.value.cliprange,
        cfg.loss.agg,
        _loss_max_len(cfg, max_len),
    )
    return loss, metrics

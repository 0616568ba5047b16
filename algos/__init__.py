"""objbench.algos: pure-torch RL objectives for language models (PPO, GRPO, Dr. GRPO, DAPO, GSPO and any mix).

Tensors in, tensors out: explicit (B, T) masks (True = valid token; torch.bool, or integer/float tensors of
0s and 1s, converted on entry), no global state, no ``.item()``; every function keeps its inputs' floating dtype (float64 works). Imports nothing else of
objbench.

Public API
----------
    algos.compute_advantages(cfg, *, rewards, mask, values=None, old_logp=None, ref_logp=None, max_len=None,
                             group_sizes=None)
    algos.compute_loss(cfg, *, logp, old_logp, advantages, mask, ref_logp=None, entropy=None, max_len=None)
    algos.compute_value_loss(cfg, *, values, old_values, returns, mask, max_len=None)
    algos.policy_loss(logp, old_logp, advantages, mask, ratio="token", eps_low=0.2, eps_high=0.2,
                      dual_clip=None, agg="token_mean", max_len=None, surrogate="ppo_clip",
                      eps_low_is=None, eps_high_is=0.28, tau_pos=1.0, tau_neg=1.05)
    algos.aggregate(loss_mat, mask, mode, max_len=None)          # the function (module: algos/aggregate.py)
    algos.aggregate_many(loss_mats, mask, mode, max_len=None)    # (K, B, T) under one mask -> (K,)
    algos.micro_batch_weights(mask, mode, blocks)                 # gradient accumulation with global normalisers
    algos.global_block_weights(mask, mode, blocks, group=None)    # the same over data-parallel ranks (global_stats)
    algos.advantages.{gae, whiten, value_loss, group_relative, rloo, hybrid, group_stats}
    algos.kl.{estimate, exact_kl}; algos.entropy.token_entropy
    algos.filters.{dynamic_sampling_keep, overlong_penalty, overlong_filter, top_fraction_keep,
                   group_reward_correction}
    algos.groups.{layout, wanted_sizes, fill_budget, update_pass_rates}   # unequal and adaptive group sizes
    algos.schedules.{Schedule, TemperatureControl, progress, value_at, objective_at, scheduled_values,
                     controlled_temperature, check_temperature}
    algos.objective_at(cfg, progress)                  # the static objective in effect at progress in [0, 1]
    algos.ObjectiveConfig (+ AdvantageConfig, RatioConfig, LossConfig, KLConfig, ValueConfig, FilterConfig,
                           GroupConfig, Schedule)
    algos.row_counts(mask, dtype)                      # ((B,) row lengths clamped to >= 1, non-empty rows), memoised
    algos.check_against_rollout(cfg, max_new_tokens)   # checks that need the sampler's max response length
    algos.fields_read(cfg)                             # the fields the chosen components read, and who reads them
    algos.presets, algos.get_preset, algos.with_overrides, algos.config_to_dict, algos.format_config_table
    algos.surrogates.{ppo_clip, cispo, sapo}
    algos.registry.{ADVANTAGE_ESTIMATORS, AGGREGATION_MODES, KL_ESTIMATORS, RATIO_LEVELS, SURROGATES,
                    SCHEDULE_KINDS, GROUP_SIZE_RULES}

Extension API (plug-ins register into these; README "Extending objbench")
-------------------------------------------------------------------------
    algos.SURROGATES, ADVANTAGE_ESTIMATORS, AGGREGATION_MODES, KL_ESTIMATORS, RATIO_LEVELS, SCHEDULE_KINDS,
    GROUP_SIZE_RULES (``Registry``; ``.register(name, member)``, ``.origin(name)``) and the member types
    algos.Surrogate, AdvantageEstimator, RatioLevel, ScheduleKind, GroupSizeRule; aggregation modes and KL
    estimators are plain functions. algos.member_settings(cfg, name) gives a plug-in member's settings;
    algos.check_member(family, name) runs the conformance check (algos/conformance.py).
"""

# component modules first: importing them fills the registries that config validation reads
from objbench.algos import registry  # noqa: I001
from objbench.algos import aggregate as _aggregate_module  # noqa: F401
from objbench.algos import schedules, groups  # noqa: F401
from objbench.algos import advantages, entropy, filters, kl, policy, surrogates  # noqa: F401
# the function shadows the submodule name on purpose
from objbench.algos.aggregate import aggregate, aggregate_many, micro_batch_weights
from objbench.algos.policy import policy_loss
from objbench.algos import global_stats  # noqa: F401
from objbench.algos.global_stats import global_block_weights
from objbench.algos._checks import row_counts  # (B,) response lengths >= 1 and the non-empty row count, memoised per mask
from objbench.algos.config import AdvantageConfig, FilterConfig, GroupConfig, KLConfig, LossConfig, ObjectiveConfig, RatioConfig, Schedule, ValueConfig, fields_read
from objbench.algos.config_dict import check_against_rollout, config_from_dict, config_to_dict, format_config_table, with_overrides
from objbench.algos import presets as _presets_module  # noqa: F401
from objbench.algos.presets import get_preset, presets
from objbench.algos.objective import METRIC_DOCS, compute_advantages, compute_loss, compute_value_loss
from objbench.algos.schedules import objective_at
# the public extension API: the registries plug-ins register into, and their member types (algos/registry.py)
from objbench.algos.registry import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    GROUP_SIZE_RULES,
    KL_ESTIMATORS,
    RATIO_LEVELS,
    SCHEDULE_KINDS,
    SURROGATES,
    Registry,
)
from objbench.algos.surrogates import Surrogate
from objbench.algos.advantages import AdvantageEstimator
from objbench.algos.policy import RatioLevel
from objbench.algos.schedules import ScheduleKind
from objbench.algos.groups import GroupSizeRule
from objbench.algos.config import member_settings
from objbench.algos.conformance import check_member

__all__ = [
    "aggregate",
    "aggregate_many",
    "micro_batch_weights",
    "global_stats",
    "global_block_weights",
    "advantages",
    "entropy",
    "filters",
    "kl",
    "policy",
    "surrogates",
    "schedules",
    "groups",
    "registry",
    "policy_loss",
    "row_counts",
    "AdvantageConfig",
    "RatioConfig",
    "LossConfig",
    "KLConfig",
    "ValueConfig",
    "FilterConfig",
    "GroupConfig",
    "Schedule",
    "ObjectiveConfig",
    "objective_at",
    "check_against_rollout",
    "fields_read",
    "with_overrides",
    "config_to_dict",
    "config_from_dict",
    "format_config_table",
    "presets",
    "get_preset",
    "compute_advantages",
    "compute_loss",
    "compute_value_loss",
    "METRIC_DOCS",
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATION_MODES",
    "GROUP_SIZE_RULES",
    "KL_ESTIMATORS",
    "RATIO_LEVELS",
    "SCHEDULE_KINDS",
    "SURROGATES",
    "Registry",
    "Surrogate",
    "AdvantageEstimator",
    "RatioLevel",
    "ScheduleKind",
    "GroupSizeRule",
    "member_settings",
    "check_member",
]

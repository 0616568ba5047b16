"""Named objectives: each a composition of config fields, with a citation for every value that differs
from the ``ObjectiveConfig`` defaults.

Scale (decision): every group method uses G = 8 responses per prompt. G is the one published value scaled
down, so that all arms get the same number of completions per step at CPU scale (GRPO's paper uses 64,
DAPO's 16; Dr. GRPO's 8 is unchanged). Learning rates and lengths live in the experiment config, not here.
PPO samples one response per prompt (G = 1); the training loop keeps completions per step equal.

``presets`` is a read-only mapping; ``get_preset(name, **overrides)`` returns a (validated) copy.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from objbench.algos.config import AdvantageConfig, FilterConfig, KLConfig, LossConfig, ObjectiveConfig, RatioConfig, ValueConfig
from objbench.algos.config_dict import with_overrides

__all__ = ["presets", "get_preset", "PRESET_NAMES"]

_PPO = ObjectiveConfig(
    name="ppo",
    group_size=1,  # one response per prompt: the critic is the baseline (Ouyang et al. 2022)
    adv=AdvantageConfig(
        estimator="gae",  # Schulman et al. 2017; REFERENCE.md table
        gamma=1.0,  # verl ppo_trainer.yaml algorithm.gamma
        lam=1.0,  # verl ppo_trainer.yaml algorithm.lam
        whiten=True,  # advantages whitened over valid tokens (verl compute_gae_advantage_return)
    ),
    ratio=RatioConfig(level="token", eps_low=0.2, eps_high=0.2),  # PPO clip 0.2 (Schulman et al. 2017)
    loss=LossConfig(agg="token_mean"),  # verl default loss_agg_mode "token-mean"
    kl=KLConfig(
        estimator="k1",  # k1 in the reward (verl use_kl_in_reward, kl_penalty "kl")
        placement="reward",
        beta=0.001,  # verl ppo_trainer.yaml algorithm.kl_ctrl.kl_coef (fixed controller)
    ),
    value=ValueConfig(cliprange=0.5),  # verl critic cliprange_value 0.5
)

_GRPO = ObjectiveConfig(
    name="grpo",
    group_size=8,  # DeepSeekMath uses 64; scaled to 8 (module docstring)
    adv=AdvantageConfig(estimator="group", scale="group"),  # Shao et al. 2024, sec. 4.1.2 (std scaling)
    ratio=RatioConfig(level="token", eps_low=0.2, eps_high=0.2),  # Shao et al. 2024, eq. 3
    loss=LossConfig(agg="seq_mean_token_mean"),  # Shao et al. 2024, eq. 3: (1/G) sum_i (1/|o_i|) sum_t
    kl=KLConfig(estimator="k3", placement="loss", beta=0.04),  # Shao et al. 2024, eq. 4 and sec. 4.2 (beta 0.04)
)

_DR_GRPO = ObjectiveConfig(
    name="dr_grpo",
    group_size=8,  # REFERENCE.md table (Liu et al. 2025, arXiv 2503.20783)
    adv=AdvantageConfig(estimator="group", scale="none"),  # Liu et al. 2025: drop the std normaliser
    ratio=RatioConfig(level="token", eps_low=0.2, eps_high=0.2),
    loss=LossConfig(agg="seq_mean_token_sum_norm"),  # Liu et al. 2025: constant normaliser (max length)
    kl=KLConfig(placement="none", beta=0.0),  # Liu et al. 2025: no KL term
)

_DAPO = ObjectiveConfig(
    name="dapo",
    group_size=8,  # DAPO uses 16; scaled to 8 (module docstring)
    adv=AdvantageConfig(estimator="group", scale="group"),  # Yu et al. 2025 (arXiv 2503.14476): group std advantage
    ratio=RatioConfig(level="token", eps_low=0.2, eps_high=0.28),  # Yu et al. 2025, clip-higher, sec. 3.1
    loss=LossConfig(agg="token_mean"),  # Yu et al. 2025, token-level loss, sec. 3.3
    kl=KLConfig(placement="none", beta=0.0),  # Yu et al. 2025: KL term removed
    filters=FilterConfig(
        dynamic_sampling=True,  # Yu et al. 2025, sec. 3.2
        max_rounds=10,  # verl DAPO recipe: at most 10 generation rounds per step
        overlong_penalty=True,  # Yu et al. 2025, sec. 3.4 soft overlong punishment
        overlong_cache=4,  # DAPO: L_cache 4096 of L_max 20480; here in tokens of our short responses
        overlong_factor=1.0,  # Yu et al. 2025, sec. 3.4
        overlong_filter=False,  # the soft punishment is DAPO's final treatment of long samples; filtering is
        # an earlier ablation step in its Table 1 -- set True to add it (see the report)
    ),
)

_GSPO = ObjectiveConfig(
    name="gspo",
    group_size=8,  # not a GSPO-specific value; same G as the other group methods
    n_minibatches=4,  # Zheng et al. 2025 (arXiv 2507.18071), experiments: each rollout batch split into 4 minibatches
    adv=AdvantageConfig(estimator="group", scale="group"),  # Zheng et al. 2025: group-std advantage
    ratio=RatioConfig(level="sequence", eps_low=3e-4, eps_high=4e-4),  # Zheng et al. 2025, experiments: clip range (3e-4, 4e-4)
    loss=LossConfig(agg="seq_mean_token_mean"),  # Zheng et al. 2025: GSPO objective averages over sequences
    kl=KLConfig(placement="none", beta=0.0),  # GSPO's objective has no KL term
)

presets: Mapping[str, ObjectiveConfig] = MappingProxyType(
    {c.name: c for c in (_PPO, _GRPO, _DR_GRPO, _DAPO, _GSPO)}
)
PRESET_NAMES = tuple(presets)


def get_preset(name: str, **overrides: Any) -> ObjectiveConfig:
    """The preset ``name`` with overrides applied and validated.

    Override keys are top-level fields or nested paths with ``__`` for ``.``:
    ``get_preset("grpo", group_size=4, loss__agg="token_mean")``. Unknown preset names raise ValueError listing
    the valid ones. The ``name`` field is kept unless overridden (``format_config_table`` shows every field).
    """
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; valid names: {', '.join(PRESET_NAMES)}")
    cfg = presets[name]
    if overrides:
        cfg = with_overrides(cfg, {k.replace("__", "."): v for k, v in overrides.items()})
    return cfg

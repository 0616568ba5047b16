"""Objective configuration: frozen dataclasses, one field per ablation axis.

OmegaConf-compatible by construction (the experiments package wraps these as structured configs): field
types are only str, int, float, bool, Optional[...] of those, List[float] / List[int], nested dataclasses
built with ``field(default_factory=...)``, and the one mapping ``ObjectiveConfig.schedules`` (section ->
field -> ``algos.schedules.Schedule``). Every field has a one-line doc string under it.

Validation happens in ``__post_init__``: wrong types, unknown choices and out-of-range values raise
``ValueError`` naming the field (``RatioConfig.eps_low ...``) and, for choices, listing the valid ones;
invalid combinations across sub-configs are rejected in ``ObjectiveConfig.__post_init__`` -- errors, never
warnings. Choices of registry-backed fields come from the registries, so a newly registered component is
a valid config value at once.

Fields nothing reads are rejected. Each component declares the fields it reads (``fields_read``): the
advantage estimator (``AdvantageEstimator.reads``; ``value.*`` belongs to the estimator that needs a
critic), the surrogate (``Surrogate.reads``), the aggregation mode (its ``reads`` attribute), the KL
placement (``KL_PLACEMENT_READS``), the group-size rule (``GroupSizeRule.reads``; ``group_size`` itself is
read by the rule ``fixed`` only) and the filter switches (``filters.dynamic_sampling`` reads ``max_rounds``;
``filters.overlong_penalty`` reads ``overlong_cache`` and ``overlong_factor``; ``filters.top_select`` reads
``top_fraction`` and ``top_min_keep``; ``filters.group_correction`` reads ``correction_share`` and
``correction_factor``). A field
that some choice of those components would read but the chosen ones do not must keep its default:
otherwise, e.g., ``adv.estimator=rloo, adv.eps=5`` would run exactly like ``adv.eps=1e-6``, and a sweep
over it would produce identical arms under different labels. Defaults always pass, so every preset and
every config that only sets fields its components read still loads.

Schedules (``ObjectiveConfig.schedules``, see ``algos.schedules``): a scheduled field must be a float field
that the chosen components read and that the loop reads every step (not ``value.lr_scale``, read once when
the critic's optimizer is built); a schedule starts at the field's configured value; every value it reaches
must be a valid setting (checked at the schedule's corner points, ``algos.schedules.corners``).

``check_against_rollout(cfg, max_new_tokens)`` holds the checks that need the sampler's maximum response
length, which lives outside the objective (the experiment config calls it).

Helpers (algos/config_dict.py): ``with_overrides(cfg, {"loss.agg": "token_mean"})``, ``config_to_dict``,
``config_from_dict``, ``format_config_table`` (every field on its own line, so two runs can be diffed). The type
checks and the fields each member reads: algos/settings.py.

Note: no ``from __future__ import annotations`` here, so that the field types stay real types for
OmegaConf and for the type check below.
"""

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# the component modules register their members on import; config validation reads the registries
import objbench.algos.advantages as _advantages
import objbench.algos.aggregate  # noqa: F401  (registers aggregation modes)
import objbench.algos.groups  # noqa: F401  (registers group-size rules)
import objbench.algos.kl as _kl
import objbench.algos.policy  # noqa: F401  (registers ratio levels and, via algos.surrogates, surrogates)
from objbench.algos.registry import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    GROUP_SIZE_RULES,
    KL_ESTIMATORS,
    RATIO_LEVELS,
    SURROGATES,
)
from objbench.algos.schedules import Schedule, corners, objective_at, scheduled_values
from objbench.algos.settings import (
    KL_PLACEMENT_READS,
    KL_PLACEMENTS,
    _check_types,
    _choice,
    _default,
    _get,
    _range,
    _readers,
    _resolve_options,
    _unwrap_optional,
    fields_read,
    member_settings,
)

__all__ = [
    "AdvantageConfig",
    "RatioConfig",
    "LossConfig",
    "KLConfig",
    "ValueConfig",
    "FilterConfig",
    "GroupConfig",
    "ObjectiveConfig",
    "Schedule",
    "UNSCHEDULABLE",
    "KL_PLACEMENTS",
    "KL_PLACEMENT_READS",
    "ZERO_VAR_CHECKS",
    "fields_read",
    "member_settings",
]

# what each KL placement reads; reward_zero_var_check only matters where the KL term shapes the reward
ZERO_VAR_CHECKS = ("shaped", "outcome")
# float fields that cannot follow a schedule, and why
UNSCHEDULABLE = {"value.lr_scale": "the loop reads it once, when it builds the critic's optimizer"}


# ------------------------------------------------------------------------------------------ validation
















# The component slots: the config field that picks a component, its candidates, and the fields each
# candidate reads (dotted ObjectiveConfig paths). Validation only ever looks members up here, so a newly
# registered estimator / surrogate / aggregation mode brings its own declaration.






# -------------------------------------------------------------------------------------------- configs
@dataclass(frozen=True)
class AdvantageConfig:
    estimator: str = "group"
    """advantage estimator: gae | group | rloo | hybrid (registry ADVANTAGE_ESTIMATORS)."""
    scale: str = "group"
    """group (and hybrid) only: divide by the group std (GRPO), the batch std (TRL "batch") or nothing (Dr. GRPO)."""
    eps: float = 1e-6
    """group estimator with scale group|batch: added to the std (verl 1e-6; TRL 1e-4; OpenRLHF 1e-9)."""
    gamma: float = 1.0
    """gae (and hybrid) only: discount (verl default 1.0)."""
    lam: float = 1.0
    """gae (and hybrid) only: GAE lambda (verl default 1.0; 0.95 is common)."""
    whiten: bool = True
    """gae (and hybrid's GAE part) only: whiten advantages over the batch's valid tokens."""
    alpha: float = 0.5
    """hybrid only: A = alpha * group-relative + (1 - alpha) * GAE, in [0, 1] (seed 003 direction 2; no published value)."""

    def __post_init__(self):
        _check_types(self)
        _choice(self, "estimator", ADVANTAGE_ESTIMATORS.names())
        _choice(self, "scale", _advantages.GROUP_SCALES)
        _range(self, "eps", self.eps >= 0.0, ">= 0")
        _range(self, "gamma", 0.0 <= self.gamma <= 1.0, "in [0, 1]")
        _range(self, "lam", 0.0 <= self.lam <= 1.0, "in [0, 1]")
        _range(self, "alpha", 0.0 <= self.alpha <= 1.0, "in [0, 1]")
        if self.scale == "none" and self.eps != _default(AdvantageConfig, "eps"):
            raise ValueError(
                f"AdvantageConfig.eps = {self.eps!r} is not read with AdvantageConfig.scale 'none' (there is no std "
                f"to add it to); leave it at its default {_default(AdvantageConfig, 'eps')!r}"
            )


@dataclass(frozen=True)
class RatioConfig:
    level: str = "token"
    """importance-ratio level: token (PPO/GRPO) | sequence (GSPO) | sequence_token (GSPO-token)."""
    eps_low: float = 0.2
    """ppo_clip: lower clip, ratio >= 1 - eps_low; in [0, 1) (PPO 0.2)."""
    eps_high: float = 0.2
    """ppo_clip: upper clip, ratio <= 1 + eps_high; >= 0 (PPO 0.2; DAPO clip-higher 0.28)."""
    dual_clip: Optional[float] = None
    """ppo_clip: dual-clip constant c > 1 for A < 0 (Ye et al. 2020; verl clip_ratio_c, default 3); None = off."""
    surrogate: str = "ppo_clip"
    """per-token surrogate: ppo_clip (every preset) | cispo (MiniMax-M1) | sapo (soft gate); see algos.surrogates."""
    eps_low_is: Optional[float] = None
    """cispo: IS weight >= 1 - eps_low_is, in [0, 1]; None = no lower bound (MiniMax-M1 tunes only the upper one)."""
    eps_high_is: float = 0.28
    """cispo: IS weight <= 1 + eps_high_is, >= 0 (MiniMax-M1 gives no value; 0.28 is Trinity-RFT's CISPO default)."""
    tau_pos: float = 1.0
    """sapo: gate temperature for tokens with A > 0, > 0 (verl/TRL default 1.0)."""
    tau_neg: float = 1.05
    """sapo: gate temperature for tokens with A <= 0, > 0 (verl/TRL default 1.05; SAPO takes tau_neg > tau_pos)."""

    def __post_init__(self):
        _check_types(self)
        _choice(self, "level", RATIO_LEVELS.names())
        _choice(self, "surrogate", SURROGATES.names())
        _range(self, "eps_low", 0.0 <= self.eps_low < 1.0, "in [0, 1)")
        _range(self, "eps_high", self.eps_high >= 0.0, ">= 0")
        _range(self, "dual_clip", self.dual_clip is None or self.dual_clip > 1.0, "None or > 1")
        _range(self, "eps_low_is", self.eps_low_is is None or 0.0 <= self.eps_low_is <= 1.0, "None or in [0, 1]")
        _range(self, "eps_high_is", self.eps_high_is >= 0.0, ">= 0")
        _range(self, "tau_pos", self.tau_pos > 0.0, "> 0")
        _range(self, "tau_neg", self.tau_neg > 0.0, "> 0")
        levels = SURROGATES.get(self.surrogate).levels
        if self.level not in levels:
            raise ValueError(
                f"RatioConfig.level {self.level!r} is not accepted by RatioConfig.surrogate {self.surrogate!r}; "
                f"it accepts {list(levels)} (see algos.surrogates)"
            )


@dataclass(frozen=True)
class LossConfig:
    agg: str = "seq_mean_token_mean"
    """loss aggregation: token_mean | seq_mean_token_mean | seq_mean_token_sum | seq_mean_token_sum_norm."""
    max_len: Optional[int] = None
    """L of seq_mean_token_sum_norm; None = the training loop passes its maximum response length."""
    entropy_coef: float = 0.0
    """entropy bonus: loss -= entropy_coef * aggregate(entropy); 0 = off (no published recipe uses one)."""

    def __post_init__(self):
        _check_types(self)
        _choice(self, "agg", AGGREGATION_MODES.names())
        _range(self, "max_len", self.max_len is None or self.max_len > 0, "None or > 0")


@dataclass(frozen=True)
class KLConfig:
    estimator: str = "k3"
    """per-token KL estimator: k1 | k2 | k3 | k3_ratio | k3_k2grad (see algos.kl)."""
    placement: str = "none"
    """where the KL penalty goes: none | reward (R - beta sum_t k, before the advantage) | loss (+ beta k)."""
    beta: float = 0.0
    """KL coefficient (GRPO 0.04; DeepSeek-R1 0.001; DAPO, Dr. GRPO, GSPO 0)."""
    clamp: Optional[float] = None
    """clamp the per-token KL value to [-clamp, clamp]; None = off (verl clamps k3 to 10)."""
    reward_zero_var_check: str = "shaped"
    """placement reward: all-equal test on the shaped rewards (verl) | outcome (see compute_advantages)."""

    def __post_init__(self):
        _check_types(self)
        _choice(self, "estimator", KL_ESTIMATORS.names())
        _choice(self, "placement", KL_PLACEMENTS)
        _choice(self, "reward_zero_var_check", ZERO_VAR_CHECKS)
        _range(self, "beta", self.beta >= 0.0, ">= 0")
        _range(self, "clamp", self.clamp is None or self.clamp > 0.0, "None or > 0")
        if self.placement == "none" and self.beta > 0.0:
            raise ValueError(
                f"KLConfig.beta = {self.beta} > 0 but KLConfig.placement is 'none'; set placement to "
                f"'reward' or 'loss', or beta to 0"
            )
        if self.placement == "reward" and self.estimator not in _kl.VALUE_FORMS:
            raise ValueError(
                f"KLConfig.estimator {self.estimator!r} only changes the gradient, which a reward does not carry; "
                f"with placement 'reward' use one of {list(_kl.VALUE_FORMS)}"
            )


@dataclass(frozen=True)
class ValueConfig:
    coef: float = 1.0
    """weight of the value loss (gae only), applied by the training loop to compute_value_loss's loss."""
    cliprange: Optional[float] = 0.5
    """value clip: V_old +- cliprange (verl cliprange_value 0.5); None = unclipped."""
    lr_scale: float = 1.0
    """critic learning rate / policy learning rate (read by the training loop)."""

    def __post_init__(self):
        _check_types(self)
        _range(self, "coef", self.coef >= 0.0, ">= 0")
        _range(self, "cliprange", self.cliprange is None or self.cliprange > 0.0, "None or > 0")
        _range(self, "lr_scale", self.lr_scale > 0.0, "> 0")


@dataclass(frozen=True)
class FilterConfig:
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more prompts to refill the batch."""
    max_rounds: int = 10
    """dynamic sampling: give up refilling after this many generation rounds (verl DAPO recipe: 10)."""
    overlong_penalty: bool = False
    """DAPO soft overlong punishment added to the reward (the training loop applies it after sampling)."""
    overlong_cache: int = 4
    """soft-punishment zone L_cache in tokens (DAPO: 4096 of 20480; scaled to our short responses)."""
    overlong_factor: float = 1.0
    """scale of the soft punishment (DAPO: 1.0)."""
    overlong_filter: bool = False
    """DAPO overlong filtering: mask the loss of truncated responses (the training loop applies it)."""
    top_select: bool = False
    """seed 003 group selection: only each group's top responses by reward enter the loss (all stay in the baseline)."""
    top_fraction: float = 0.3
    """top_select: share of each group kept, ceil(top_fraction * G), in (0, 1] (seed 003: top 30%)."""
    top_min_keep: int = 1
    """top_select: keep at least this many responses per group, >= 1 (ties: the earlier response is kept)."""
    group_correction: bool = False
    """seed 003 group reward correction: scale a group's rewards when its share of malformed responses is high."""
    correction_share: float = 0.5
    """group_correction: correct a group whose share of malformed responses (verifier) exceeds this, in [0, 1)."""
    correction_factor: float = 0.8
    """group_correction: multiply the group's rewards by this, >= 0 (seed 003: x 0.8 for language mixing)."""

    def __post_init__(self):
        _check_types(self)
        _range(self, "max_rounds", self.max_rounds >= 1, ">= 1")
        _range(self, "overlong_cache", self.overlong_cache >= 0, ">= 0")
        _range(self, "overlong_factor", self.overlong_factor >= 0.0, ">= 0")
        _range(self, "top_fraction", 0.0 < self.top_fraction <= 1.0, "in (0, 1]")
        _range(self, "top_min_keep", self.top_min_keep >= 1, ">= 1")
        _range(self, "correction_share", 0.0 <= self.correction_share < 1.0, "in [0, 1)")
        _range(self, "correction_factor", self.correction_factor >= 0.0, ">= 0")
        if self.overlong_penalty:
            # the loop's L_max is the sampler's max_new_tokens and no response is longer, so without a soft
            # zone (or with factor 0) the penalty is 0 for every response: the same arm as the penalty off
            _range(self, "overlong_cache", self.overlong_cache >= 1,
                   ">= 1 with overlong_penalty (responses never exceed L_max = max_new_tokens, so with no soft "
                   "zone the penalty is always 0)")
            _range(self, "overlong_factor", self.overlong_factor > 0.0,
                   "> 0 with overlong_penalty (factor 0 makes the penalty 0 for every response)")


@dataclass(frozen=True)
class GroupConfig:
    rule: str = "fixed"
    """group size per prompt: fixed (group_size for every prompt) | difficulty | pass_rate (algos.groups)."""
    thresholds: List[float] = field(default_factory=list)
    """difficulty / pass_rate: increasing cut points of the prompt's difficulty level or running pass rate."""
    sizes: List[int] = field(default_factory=list)
    """difficulty / pass_rate: G below thresholds[0], between cut points, from the last one on (len(thresholds) + 1)."""
    ema: float = 0.5
    """pass_rate: weight of the newest step in each difficulty level's running pass rate, in (0, 1]."""
    prior: float = 0.5
    """pass_rate: running pass rate of a difficulty level before any of its completions was judged, in [0, 1]."""

    def __post_init__(self):
        _check_types(self)
        _choice(self, "rule", GROUP_SIZE_RULES.names())
        _range(self, "thresholds", all(a < b for a, b in zip(self.thresholds, self.thresholds[1:])),
               "strictly increasing")
        _range(self, "sizes", all(g >= 1 for g in self.sizes), "ints >= 1")
        _range(self, "ema", 0.0 < self.ema <= 1.0, "in (0, 1]")
        _range(self, "prior", 0.0 <= self.prior <= 1.0, "in [0, 1]")
        if "sizes" in GROUP_SIZE_RULES.get(self.rule).reads and len(self.sizes) != len(self.thresholds) + 1:
            raise ValueError(
                f"GroupConfig.sizes must hold one more size than GroupConfig.thresholds has cut points for rule "
                f"{self.rule!r} (e.g. thresholds [2], sizes [4, 12]), got thresholds {self.thresholds}, sizes "
                f"{self.sizes}"
            )


@dataclass(frozen=True)
class ObjectiveConfig:
    name: str = "custom"
    """label for tables and run folders; the fields below, not the name, define the objective."""
    group_size: int = 8
    """G, responses per prompt (group estimators need >= 2; gae allows 1); groups.rule fixed only."""
    n_minibatches: int = 1
    """optimizer steps per epoch over one rollout batch (GSPO: 4)."""
    n_epochs: int = 1
    """passes over each rollout batch."""
    adv: AdvantageConfig = field(default_factory=AdvantageConfig)
    """advantage estimation."""
    ratio: RatioConfig = field(default_factory=RatioConfig)
    """importance ratio and clipping."""
    loss: LossConfig = field(default_factory=LossConfig)
    """aggregation and entropy bonus."""
    kl: KLConfig = field(default_factory=KLConfig)
    """KL regularisation to the reference policy."""
    value: ValueConfig = field(default_factory=ValueConfig)
    """critic (gae only)."""
    filters: FilterConfig = field(default_factory=FilterConfig)
    """filters and reward shaping (DAPO's; seed 003's group selection and group reward correction)."""
    groups: GroupConfig = field(default_factory=GroupConfig)
    """group size per prompt (seed 003 direction 1: adaptive G at a fixed completion budget)."""
    schedules: Dict[str, Dict[str, Schedule]] = field(default_factory=dict)
    """float fields that follow a schedule over training: section -> field -> Schedule (algos.schedules); {} = none."""
    options: Dict[str, Dict[str, Any]] = field(default_factory=dict, metadata={"absent_means": {}})
    """plug-in members' own settings: member name -> field -> value (objective.options.gpg.beta=0.5); {} = none."""

    def __post_init__(self):
        _check_types(self)
        _range(self, "group_size", self.group_size >= 1, ">= 1")
        _range(self, "n_minibatches", self.n_minibatches >= 1, ">= 1")
        _range(self, "n_epochs", self.n_epochs >= 1, ">= 1")
        est = ADVANTAGE_ESTIMATORS.get(self.adv.estimator)
        if not GROUP_SIZE_RULES.get(self.groups.rule).adaptive:  # one G for every prompt
            field_name, sizes, got = "group_size must", [self.group_size], self.group_size
        else:  # the rule's sizes give each prompt's G; group_size is not read
            if self.group_size != _default(ObjectiveConfig, "group_size"):
                raise ValueError(
                    f"ObjectiveConfig.group_size = {self.group_size} is not read by groups.rule = "
                    f"{self.groups.rule!r} (its groups.sizes give each prompt's G); set it back to its default "
                    f"{_default(ObjectiveConfig, 'group_size')}"
                )
            field_name, sizes, got = "groups.sizes must all", self.groups.sizes, self.groups.sizes
        if min(sizes) < est.min_group_size:
            raise ValueError(
                f"ObjectiveConfig.{field_name} be >= {est.min_group_size} for adv.estimator={self.adv.estimator!r} "
                f"(a singleton group has no baseline; use 'gae'), got {got}"
            )
        if self.filters.dynamic_sampling and min(sizes) < 2:
            raise ValueError(
                f"ObjectiveConfig.{field_name} be >= 2 with filters.dynamic_sampling (it drops groups whose rewards "
                f"are all equal), got {got}"
            )
        self._reject_unread_fields()
        check = self.kl.reward_zero_var_check
        if check != _default(KLConfig, "reward_zero_var_check") and not est.all_equal_zero:
            with_rule = [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.get(n).all_equal_zero]
            raise ValueError(
                f"ObjectiveConfig.kl.reward_zero_var_check = {check!r} is not read by adv.estimator = "
                f"{self.adv.estimator!r}: it has no all-equal-group rule (only {with_rule} do); leave it at its "
                f"default {_default(KLConfig, 'reward_zero_var_check')!r}"
            )
        if self.schedules:
            self._check_schedules()
        object.__setattr__(self, "options", _resolve_options(self))

    def _check_schedules(self) -> None:
        """Each scheduled field is a float field the components read every step; every value it reaches is valid."""
        read, governed = fields_read(self), _readers()
        hints_of = {f.name: typing.get_type_hints(type(getattr(self, f.name)))
                    for f in dataclasses.fields(self) if dataclasses.is_dataclass(getattr(self, f.name))}
        for sec, fields in self.schedules.items():
            if sec not in hints_of:
                raise ValueError(f"ObjectiveConfig.schedules.{sec}: ObjectiveConfig has no section {sec!r}; "
                                 f"sections: {', '.join(hints_of)}")
            floats = [n for n, tp in hints_of[sec].items() if _unwrap_optional(tp)[0] is float]
            for name, sched in fields.items():
                path, where = f"{sec}.{name}", f"ObjectiveConfig.schedules.{sec}.{name}"
                if name not in hints_of[sec]:
                    raise ValueError(f"{where}: {type(getattr(self, sec)).__name__} has no field {name!r}; its float "
                                     f"fields: {', '.join(floats)}")
                if name not in floats:
                    raise ValueError(f"{where}: {path} is not a float field ({hints_of[sec][name]}); only float "
                                     f"fields follow a schedule: {', '.join(floats)}")
                if path in UNSCHEDULABLE:
                    raise ValueError(f"{where}: {path} cannot follow a schedule: {UNSCHEDULABLE[path]}")
                if path in governed and path not in read:
                    slot = governed[path][0][0]
                    raise ValueError(f"{where}: {path} is not read by {slot} = {_get(self, slot)!r}, so its schedule "
                                     f"would change nothing")
                value = _get(self, path)
                if value is None:
                    raise ValueError(f"{where}: {path} is None (off); set it to its value at the first step")
                if sched.start is not None and sched.start != value:
                    raise ValueError(f"{where}.start = {sched.start!r} but {path} = {value!r}: a schedule starts at "
                                     f"the field's value; set {path} to {sched.start!r} (start may then be left out)")
        points = sorted({p for fields in self.schedules.values() for sched in fields.values() for p in corners(sched)})
        for p in points:
            try:
                objective_at(self, p)
            except ValueError as e:
                raise ValueError(f"ObjectiveConfig.schedules reach an invalid setting at progress {p:g} (values "
                                 f"{scheduled_values(self, p)}): {e}") from None

    def _reject_unread_fields(self) -> None:
        """A non-default value in a field that the chosen components never read is an error (module docstring)."""
        read = fields_read(self)
        for path, readers in _readers().items():
            if path in read:
                continue
            head, _, name = path.partition(".")
            default = _default(type(getattr(self, head)), name)
            value = _get(self, path)
            if value != default:
                slot = readers[0][0]
                members = [m for s, m in readers if s == slot]
                raise ValueError(
                    f"ObjectiveConfig.{path} = {value!r} is not read by {slot} = {_get(self, slot)!r} (only {slot} "
                    f"in {members} reads it); set it back to its default {default!r} -- otherwise a sweep over "
                    f"{path} runs identical arms under different labels"
                )


# the slots whose members may declare settings of their own (a plug-in's dataclass), with their registries












# ------------------------------------------------------------------------------------------- helpers















"""What an objective config's fields mean and whether they hold: the type check of every field, which fields the
chosen members read (``fields_read``: a setting no chosen member reads is refused), and the chosen members' own
settings (``objective.options.<member>``, ``member_settings``). Used by the dataclasses of algos/config.py.

Note: no ``from __future__ import annotations`` here, so that field types stay real types for the type check.
"""


import dataclasses
import math
import numbers
import typing
from typing import Any, Dict, Mapping

# the component modules register their members on import; config validation reads the registries
import objbench.algos.aggregate  # noqa: F401  (registers aggregation modes)
import objbench.algos.groups  # noqa: F401  (registers group-size rules)
import objbench.algos.policy  # noqa: F401  (registers ratio levels and, via algos.surrogates, surrogates)
from objbench.algos.registry import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    GROUP_SIZE_RULES,
    SURROGATES,
)
from objbench.algos.schedules import Schedule

KL_PLACEMENT_READS = {
    "none": (),
    "reward": ("kl.estimator", "kl.beta", "kl.clamp", "kl.reward_zero_var_check"),
    "loss": ("kl.estimator", "kl.beta", "kl.clamp"),
}


KL_PLACEMENTS = tuple(KL_PLACEMENT_READS)


def _unwrap_optional(tp):
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _check_types(obj) -> None:
    """Type-check (and normalise int -> float) every field of a config dataclass."""
    cls = type(obj).__name__
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        tp, optional = _unwrap_optional(hints[f.name])
        v = getattr(obj, f.name)
        where = f"{cls}.{f.name}"
        if v is None:
            if optional:
                continue
            raise ValueError(f"{where} must not be None")
        if dataclasses.is_dataclass(tp):
            if not isinstance(v, tp):
                raise ValueError(f"{where} must be a {tp.__name__}, got {type(v).__name__}")
        elif tp is bool:
            if not isinstance(v, bool):
                raise ValueError(f"{where} must be a bool, got {v!r}")
        elif tp is int:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ValueError(f"{where} must be an int, got {v!r}")
            object.__setattr__(obj, f.name, int(v))
        elif tp is float:
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ValueError(f"{where} must be a float, got {v!r}")
            object.__setattr__(obj, f.name, float(v))
        elif tp is str:
            if not isinstance(v, str):
                raise ValueError(f"{where} must be a str, got {v!r}")
        elif typing.get_origin(tp) is list:
            object.__setattr__(obj, f.name, _check_list(where, v, typing.get_args(tp)[0]))
        elif tp == Dict[str, Dict[str, Schedule]]:
            object.__setattr__(obj, f.name, _check_schedule_map(where, v))
        elif tp == Dict[str, Dict[str, Any]]:  # ObjectiveConfig.options, checked by _resolve_options
            if not isinstance(v, Mapping) or not all(isinstance(x, Mapping) for x in v.values()):
                raise ValueError(f"{where} must map member names to mappings of settings, got {v!r}")
        else:  # pragma: no cover - guards the OmegaConf contract for future fields
            raise TypeError(f"{where}: unsupported field type {tp!r}")


def _check_list(where: str, v, elem) -> list:
    if isinstance(v, (str, bytes, Mapping)) or not hasattr(v, "__iter__"):
        raise ValueError(f"{where} must be a list of {elem.__name__}s, got {v!r}")
    out = []
    for i, x in enumerate(v):
        ok = not isinstance(x, bool) and isinstance(x, numbers.Integral if elem is int else numbers.Real)
        if not ok or (elem is float and not math.isfinite(x)):
            raise ValueError(f"{where}[{i}] must be {'an int' if elem is int else 'a finite float'}, got {x!r}")
        out.append(elem(x))
    return out


def _check_schedule_map(where: str, v) -> Dict[str, Dict[str, Schedule]]:
    """section -> field -> Schedule (a mapping of settings is turned into a Schedule)."""
    if not isinstance(v, Mapping):
        raise ValueError(f"{where} must be a mapping section -> field -> schedule, got {v!r}")
    out: Dict[str, Dict[str, Schedule]] = {}
    for sec, fields in v.items():
        if not isinstance(sec, str) or not isinstance(fields, Mapping):
            raise ValueError(f"{where}: entries are <section>: {{<field>: <schedule>}}, got {sec!r}: {fields!r}")
        out[sec] = {}
        for name, sched in fields.items():
            if isinstance(sched, Mapping):
                try:
                    sched = Schedule(**sched)
                except TypeError as e:
                    raise ValueError(f"{where}.{sec}.{name}: {e}") from None
            if not isinstance(name, str) or not isinstance(sched, Schedule):
                raise ValueError(f"{where}.{sec}.{name} must be a Schedule (kind, start, end, at, values), "
                                 f"got {sched!r}")
            out[sec][name] = sched
    return out


def _choice(obj, name: str, choices) -> None:
    v = getattr(obj, name)
    if v not in choices:
        raise ValueError(f"{type(obj).__name__}.{name} must be one of {sorted(choices)}, got {v!r}")


def _range(obj, name: str, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{type(obj).__name__}.{name} must be {what}, got {getattr(obj, name)!r}")


def _default(cls, name: str):
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _get(cfg, path: str):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


_SLOTS = (
    ("adv.estimator", lambda: ADVANTAGE_ESTIMATORS.names(), lambda m: tuple(ADVANTAGE_ESTIMATORS.get(m).reads)),
    ("ratio.surrogate", lambda: SURROGATES.names(), lambda m: tuple(f"ratio.{f}" for f in SURROGATES.get(m).reads)),
    ("loss.agg", lambda: AGGREGATION_MODES.names(),
     lambda m: tuple(f"loss.{f}" for f in getattr(AGGREGATION_MODES.get(m), "reads", ()))),
    ("kl.placement", lambda: KL_PLACEMENTS, lambda m: KL_PLACEMENT_READS[m]),
    ("filters.dynamic_sampling", lambda: (False, True), lambda m: ("filters.max_rounds",) if m else ()),
    ("filters.overlong_penalty", lambda: (False, True),
     lambda m: ("filters.overlong_cache", "filters.overlong_factor") if m else ()),
    ("filters.top_select", lambda: (False, True),
     lambda m: ("filters.top_fraction", "filters.top_min_keep") if m else ()),
    ("filters.group_correction", lambda: (False, True),
     lambda m: ("filters.correction_share", "filters.correction_factor") if m else ()),
    ("groups.rule", lambda: GROUP_SIZE_RULES.names(),
     lambda m: tuple(f"groups.{f}" for f in GROUP_SIZE_RULES.get(m).reads)),
)


def _readers() -> Dict[str, list]:
    """Every field some component could read -> [(slot, member), ...] of the members that read it."""
    out: Dict[str, list] = {}
    for slot, candidates, reads in _SLOTS:
        for member in candidates():
            for path in reads(member):
                out.setdefault(path, []).append((slot, member))
    return out


def fields_read(cfg) -> Dict[str, str]:
    """The fields the components chosen by ``cfg`` (an ObjectiveConfig) read, each -> ``"slot=member"``.

    Only fields that depend on a component choice appear; the others (name, n_minibatches, n_epochs, the
    slots themselves, loss.entropy_coef, filters.overlong_filter, schedules) are always read; group_size is
    read by groups.rule 'fixed' only (checked by ObjectiveConfig itself).
    """
    out: Dict[str, str] = {}
    for slot, _, reads in _SLOTS:
        member = _get(cfg, slot)
        for path in reads(member):
            out[path] = f"{slot}={member!r}"
    return out


_SETTINGS_SLOTS = (("ratio.surrogate", SURROGATES), ("adv.estimator", ADVANTAGE_ESTIMATORS),
                   ("groups.rule", GROUP_SIZE_RULES))


def _settings_members(cfg) -> Dict[str, tuple]:
    """The chosen members that declare settings: name -> (slot, settings dataclass)."""
    out: Dict[str, tuple] = {}
    for slot, registry in _SETTINGS_SLOTS:
        name = _get(cfg, slot)
        cls = getattr(registry.get(name), "settings", None)
        if cls is not None:
            if name in out:
                raise ValueError(f"ObjectiveConfig: {out[name][0]} and {slot} both choose a member named {name!r} "
                                 f"with settings; objective.options.{name} would be ambiguous (rename one)")
            out[name] = (slot, cls)
    return out


def _resolve_options(cfg) -> Dict[str, Dict[str, Any]]:
    """``cfg.options`` checked against the chosen members' settings dataclasses and completed with their defaults:
    an entry for a member that is not chosen (or declares no settings), an unknown setting or a wrong type raises
    ValueError naming ``objective.options.<member>.<field>``."""
    members = _settings_members(cfg)
    for name in cfg.options:
        if name not in members:
            raise ValueError(
                f"ObjectiveConfig.options.{name}: no chosen component named {name!r} declares settings, so nothing "
                f"reads them (chosen members with settings: {sorted(members) or 'none'})")
    return {name: dataclasses.asdict(_settings_instance(name, cls, cfg.options.get(name, {})))
            for name, (_, cls) in members.items()}


def _settings_instance(name: str, cls, values: Mapping[str, Any]):
    known = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in known:
            raise ValueError(f"ObjectiveConfig.options.{name}.{key}: {cls.__name__} has no setting {key!r}; its "
                             f"settings: {', '.join(known) or 'none'}")
    try:
        inst = cls(**dict(values))
    except (TypeError, ValueError) as e:
        raise ValueError(f"ObjectiveConfig.options.{name}: {e}") from None
    try:
        _check_types(inst)
    except (TypeError, ValueError) as e:
        raise ValueError(f"ObjectiveConfig.options.{name}: {e}") from None
    return inst


def member_settings(cfg, name: str):
    """The settings dataclass instance of chosen member ``name`` (``cfg.options[name]``), or None when the member
    declares no settings."""
    members = _settings_members(cfg)
    return members[name][1](**cfg.options.get(name, {})) if name in members else None

"""An objective config as data: to and from flat dicts, ``with_overrides(cfg, {"loss.agg": "token_mean"})``, a
table of every field (so two runs can be diffed), and the checks against the rollout's length budget."""


import dataclasses
import numbers
from typing import Any, Dict, Mapping

from objbench.algos.config import ObjectiveConfig
from objbench.algos.schedules import Schedule


def check_against_rollout(cfg: ObjectiveConfig, max_new_tokens: int) -> None:
    """Checks of the objective that need the sampler's maximum response length; ValueError naming the fields.

    Call it with the *resolved* length, the one the sampler will use (experiments: ``rollout.max_new_tokens``,
    or, when that is 0 = auto, ``task.max_response_len() + 6`` as ``experiments.train.make_setup`` computes it).

    - filters.overlong_penalty: DAPO's expected length L_exp = max_new_tokens - overlong_cache must be >= 1,
      i.e. overlong_cache < max_new_tokens (with overlong_cache = max_new_tokens every response would be
      penalised; with more, ``filters.overlong_penalty`` itself raises at the first step).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be the resolved maximum response length, an int >= 1, got "
                         f"{max_new_tokens!r}")
    f = cfg.filters
    if f.overlong_penalty and not f.overlong_cache < max_new_tokens:
        raise ValueError(
            f"objective.filters.overlong_cache = {f.overlong_cache} must be < rollout.max_new_tokens = "
            f"{max_new_tokens} with filters.overlong_penalty: DAPO's soft zone is (L_exp, L_max] with "
            f"L_max = max_new_tokens and L_exp = L_max - overlong_cache, which must be >= 1"
        )


def config_to_dict(cfg) -> Dict[str, Any]:
    """Nested plain dict of a config (dataclasses.asdict)."""
    return dataclasses.asdict(cfg)


def config_from_dict(d: Mapping[str, Any], cls=ObjectiveConfig):
    """Inverse of ``config_to_dict``; unknown keys raise ValueError naming them. Missing keys take defaults."""
    return with_overrides(cls(), _flatten(d))


def _flatten(d: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def with_overrides(cfg, overrides: Mapping[str, Any], _prefix: str = ""):
    """A copy of ``cfg`` with dotted-path overrides, e.g. ``{"loss.agg": "token_mean", "ratio.eps_high": 0.28}``.

    Values may also be mappings for nested configs (``{"ratio": {"eps_high": 0.28}}``). Unknown keys raise
    ValueError naming the full key and listing the valid fields; every touched config is re-validated
    (all overrides of one section are applied together, so e.g. KL placement and beta can change at once).
    """
    grouped: Dict[str, Dict[str, Any]] = {}
    mapped: Dict[str, Dict[str, Any]] = {}  # mapping-typed fields (ObjectiveConfig.schedules)
    direct: Dict[str, Any] = {}
    valid = {f.name: f for f in dataclasses.fields(cfg)}
    for key, value in _flatten(overrides).items():
        head, _, rest = key.partition(".")
        full = f"{_prefix}{key}"
        if head not in valid:
            raise ValueError(
                f"unknown config key {full!r} ({type(cfg).__name__} has no field {head!r}); "
                f"valid fields: {', '.join(valid)}"
            )
        sub = getattr(cfg, head)
        if rest and isinstance(sub, dict):
            mapped.setdefault(head, {})[rest] = value
        elif rest:
            if not dataclasses.is_dataclass(sub):
                raise ValueError(f"config key {full!r}: {type(cfg).__name__}.{head} has no sub-fields")
            grouped.setdefault(head, {})[rest] = value
        else:
            if dataclasses.is_dataclass(sub) and not dataclasses.is_dataclass(value):
                raise ValueError(f"config key {full!r} names a section; override its fields ({full}.<field>)")
            direct[head] = value
    for head, sub_overrides in grouped.items():
        direct[head] = with_overrides(direct.get(head, getattr(cfg, head)), sub_overrides, f"{_prefix}{head}.")
    for head, flat in mapped.items():
        merge = _merge_options if head == "options" else _merge_schedules
        direct[head] = merge(direct.get(head, getattr(cfg, head)), flat, f"{_prefix}{head}")
    return dataclasses.replace(cfg, **direct)


def _merge_schedules(current, flat: Mapping[str, Any], where: str) -> Dict[str, Dict[str, Schedule]]:
    """``current`` (section -> field -> Schedule) with ``{"ratio.eps_high.kind": "linear", ...}`` applied
    (or ``{"ratio.eps_high": Schedule(...)}``); the settings of one schedule are applied together."""
    out = {sec: dict(fields) for sec, fields in current.items()}
    pending: Dict[tuple, Dict[str, Any]] = {}
    settings = [f.name for f in dataclasses.fields(Schedule)]
    for key, value in flat.items():
        parts = key.split(".")
        if len(parts) == 2 and isinstance(value, Schedule):
            out.setdefault(parts[0], {})[parts[1]] = value
            continue
        if len(parts) != 3:
            raise ValueError(f"config key {where}.{key!r}: a schedule is set as {where}.<section>.<field>.<setting> "
                             f"(e.g. {where}.ratio.eps_high.kind), settings: {', '.join(settings)}")
        if parts[2] not in settings:
            raise ValueError(f"unknown config key {where}.{key!r}: a Schedule has no setting {parts[2]!r}; "
                             f"settings: {', '.join(settings)}")
        pending.setdefault((parts[0], parts[1]), {})[parts[2]] = value
    for (sec, name), kw in pending.items():
        base = out.get(sec, {}).get(name, Schedule())
        out.setdefault(sec, {})[name] = dataclasses.replace(base, **kw)
    return out


def _merge_options(current, flat: Mapping[str, Any], where: str) -> Dict[str, Dict[str, Any]]:
    """``current`` (member -> setting -> value) with ``{"gpg.beta": 0.5}`` applied."""
    out = {name: dict(values) for name, values in current.items()}
    for key, value in flat.items():
        name, dot, setting = key.partition(".")
        if not dot or "." in setting:
            raise ValueError(f"config key {where}.{key!r}: a plug-in member's setting is set as "
                             f"{where}.<member>.<setting> (e.g. {where}.gpg.beta)")
        out.setdefault(name, {})[setting] = value
    return out


def _leaves(cfg, prefix: str = ""):
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            yield from _leaves(v, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", v


def format_config_table(cfg) -> str:
    """Every leaf field as ``path  value``, one per line, in declaration order (diff two runs with it)."""
    rows = list(_leaves(cfg))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v!r}" for k, v in rows)

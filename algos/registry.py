"""Name -> implementation registries, one per component family.

Each family has exactly one call signature, written in the registry's ``signature`` string, so the
training loop calls any member the same way and never branches on a member's name:

=====================  =====================================================================================
registry               member signature
=====================  =====================================================================================
ADVANTAGE_ESTIMATORS   ``AdvantageEstimator(compute=fn(*, seq_rewards (B,), token_rewards (B,T), mask (B,T)
                       bool, values (B,T)|None, group_size, cfg) -> (advantages (B,T), returns (B,T)|None),
                       min_group_size: int, needs_values: bool, reads: tuple, all_equal_zero: bool)``
AGGREGATION_MODES      ``fn(loss_mat (B,T), mask (B,T) bool, max_len: int|None) -> 0-dim loss``
KL_ESTIMATORS          ``fn(logp (B,T), ref_logp (B,T), old_logp (B,T)|None) -> per-token KL (B,T)``
RATIO_LEVELS           ``RatioLevel(log_ratio=fn(logp, old_logp, mask) -> (B,T), per_sequence: bool)``
SURROGATES             ``Surrogate(loss=fn(*, ratio (B,T), logp (B,T), adv (B,T), mask (B,T) bool, opts: dict)
                       -> (loss_mat (B,T), events: dict of (B,T) bool), reads: tuple, levels: tuple)``
SCHEDULE_KINDS         ``ScheduleKind(value=fn(schedule, start: float, progress: float) -> float, reads: tuple)``
GROUP_SIZE_RULES       ``GroupSizeRule(wanted=fn(*, difficulties: list[int], pass_rates: dict[int, float],
                       cfg: ObjectiveConfig) -> list[int], reads: tuple, adaptive: bool)``
=====================  =====================================================================================

``group_size`` in the advantage estimators' signature is the group layout: an int G (equal groups) or a
sequence of Python ints, one size per contiguous group (see ``algos.groups``).

Members that have settings declare which config fields they read (``reads``: the advantage estimators,
the surrogates, an aggregation mode as a ``reads`` attribute of its function, the group-size rules, the KL
placements in ``algos.config.KL_PLACEMENT_READS``; a schedule kind declares the ``Schedule`` settings it
reads), so that
``ObjectiveConfig`` can reject a non-default value in a field that the chosen components never read.

Registration happens when the family's module is imported; ``import algos`` (which any ``import
algos.<module>`` triggers first) imports them all, so the registries are always complete.

Plug-ins (``objbench train --import FILE``, ``experiments/plugins.py``) register into these same registries with
the same member types; ``Registry.origin(name)`` says which plug-in registered a member (None: built in). A member
of ``SURROGATES``, ``ADVANTAGE_ESTIMATORS`` or ``GROUP_SIZE_RULES`` may declare ``settings=<a dataclass>``: its
values come from ``objective.options.<name>.<field>`` and the member is called with one more keyword argument,
``settings=<that dataclass's instance>`` (``algos.config.member_settings``). The signatures above are the contract
(tests/test_plugins.py pins them).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

_LOADING: list = []  # the plug-in being imported (experiments.plugins), innermost last


@contextlib.contextmanager
def registering_as(origin: str):
    """Tag every registration made inside the block with ``origin`` (a plug-in's label)."""
    _LOADING.append(origin)
    try:
        yield
    finally:
        _LOADING.pop()


def settings_kwargs(member: Any, name: str, options: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """``{"settings": <instance>}`` for a member that declares a settings dataclass (its values from
    ``options[name]``, ``ObjectiveConfig.options``), else ``{}``: the extra keyword argument the member is called
    with."""
    cls = getattr(member, "settings", None)
    return {} if cls is None else {"settings": cls(**options.get(name, {}))}


class Registry:
    """A small name -> object table.

    - registering a name twice raises ``ValueError`` (no silent overwrite);
    - looking up an unknown name raises ``ValueError`` listing the valid names.
    """

    def __init__(self, family: str, signature: str = "") -> None:
        self.family = family
        self.signature = signature
        self._items: Dict[str, Any] = {}
        self._origins: Dict[str, str] = {}

    def register(self, name: str, obj: Optional[Any] = None) -> Callable:
        """``@REG.register("name")`` as a decorator, or ``REG.register("name", obj)`` directly."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")

        def _add(o: Any) -> Any:
            if name in self._items:
                raise ValueError(f"{self.family} {name!r} is already registered")
            self._items[name] = o
            if _LOADING:
                self._origins[name] = _LOADING[-1]
            return o

        return _add if obj is None else _add(obj)

    def get(self, name: str) -> Any:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown {self.family} {name!r}; valid names: {', '.join(self.names())} (a plug-in's member? load "
                f"its file with --import FILE, or `imports:` in a sweep spec)"
            ) from None

    def origin(self, name: str) -> Optional[str]:
        """The plug-in that registered ``name`` (its label), or None for a built-in member."""
        return self._origins.get(name)

    def plugin_names(self) -> Tuple[str, ...]:
        return tuple(sorted(self._origins))

    def names(self) -> Tuple[str, ...]:
        return tuple(sorted(self._items))

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._items
        except TypeError:  # unhashable
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, names={list(self.names())})"


ADVANTAGE_ESTIMATORS = Registry(
    "advantage estimator",
    "AdvantageEstimator(compute=fn(*, seq_rewards (B,), token_rewards (B,T), mask (B,T) bool, "
    "values (B,T)|None, group_size, cfg) -> (advantages (B,T), returns (B,T)|None), min_group_size, needs_values, "
    "reads, all_equal_zero)",
)
AGGREGATION_MODES = Registry(
    "aggregation mode", "fn(loss_mat (B,T), mask (B,T) bool, max_len int|None) -> 0-dim tensor"
)
KL_ESTIMATORS = Registry(
    "kl estimator", "fn(logp (B,T), ref_logp (B,T), old_logp (B,T)|None) -> (B,T)"
)
RATIO_LEVELS = Registry(
    "ratio level", "RatioLevel(log_ratio=fn(logp (B,T), old_logp (B,T), mask (B,T) bool) -> (B,T), per_sequence)"
)
SURROGATES = Registry(
    "surrogate",
    "Surrogate(loss=fn(*, ratio (B,T), logp (B,T), adv (B,T), mask (B,T) bool, opts: dict) -> "
    "(loss_mat (B,T), events: dict of (B,T) bool), reads, levels)",
)
SCHEDULE_KINDS = Registry(
    "schedule kind", "ScheduleKind(value=fn(schedule, start: float, progress: float) -> float, reads)"
)
GROUP_SIZE_RULES = Registry(
    "group-size rule",
    "GroupSizeRule(wanted=fn(*, difficulties: list[int], pass_rates: dict[int, float], cfg) -> list[int], reads, "
    "adaptive)",
)

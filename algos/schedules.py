"""Schedules: a float setting that follows a curve over training (seed 003: "dynamic clip threshold -- eps 0.2
at the start, tightened to 0.05 later"; "dynamic temperature 1.2 -> 0.7 driven by the policy entropy").

A ``Schedule`` gives the value of one setting at training progress p in [0, 1], starting from the setting's
configured value (``start``):

==========  ==============================================================  ========================
kind        value at progress p                                             reads (besides start)
==========  ==============================================================  ========================
constant    start                                                            --
linear      start + (end - start) p                                          end
cosine      end + (start - end) (1 + cos(pi p)) / 2                          end
step        start before at[0]; values[j] from at[j] on (piecewise constant) at, values
==========  ==============================================================  ========================

(registry ``SCHEDULE_KINDS``; a setting a kind does not read must stay at its default, like every config
field nothing reads.) Progress of RL step t (1-based) of T: p = (t - 1) / (T - 1), so the first step runs at
``start`` and the last at ``end`` (p = 0 throughout when T = 1); it is a function of the step alone, so a
resumed run continues the same curve.

Objective fields: ``ObjectiveConfig.schedules`` maps section -> field -> Schedule, e.g. in YAML
``schedules: {ratio: {eps_high: {kind: linear, end: 0.05}}}`` or on the command line
``objective.schedules.ratio.eps_high.kind=linear objective.schedules.ratio.eps_high.end=0.05``. Any float
field of a section that the chosen components read can be scheduled (config validation says which not);
``objective_at(cfg, p)`` is the static objective in effect at p (the fields replaced, no schedules left), and
the training loop calls it once per step. ``scheduled_values(cfg, p)`` gives the scheduled values by dotted
path, for the ``sched/<section>.<field>`` metrics.

Sampling temperature (the loop owns sampling): ``rollout.temperature_schedule`` takes the same ``Schedule``;
``TemperatureControl`` and ``controlled_temperature`` are the entropy-driven alternative,
T <- clamp(T + gain (target - H), low, high) after each step, H the step's mean policy entropy.
"""

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from objbench.algos.registry import SCHEDULE_KINDS

__all__ = [
    "Schedule",
    "ScheduleKind",
    "SCHEDULE_KINDS",
    "TemperatureControl",
    "progress",
    "value_at",
    "corners",
    "objective_at",
    "scheduled_values",
    "controlled_temperature",
    "check_temperature",
]


def _finite(owner: str, name: str, v, optional: bool = False):
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{owner}.{name} must be a float, got {v!r}")
    if not math.isfinite(v):
        raise ValueError(f"{owner}.{name} must be a finite number, got {v!r}")
    return float(v)


# no ``from __future__ import annotations`` in this module: OmegaConf reads these dataclasses' field types
@dataclass(frozen=True)
class Schedule:
    kind: str = "constant"
    """constant (the configured value throughout) | linear | cosine | step (registry SCHEDULE_KINDS)."""
    start: Optional[float] = None
    """value at progress 0; None = the setting's configured value (a number must equal it: set the setting)."""
    end: Optional[float] = None
    """linear, cosine: the value at progress 1 (the last step)."""
    at: List[float] = field(default_factory=list)
    """step: increasing progress fractions in (0, 1] at which the value changes."""
    values: List[float] = field(default_factory=list)
    """step: the value from each fraction in `at` on (one per fraction)."""

    def __post_init__(self):
        own = "Schedule"
        if self.kind not in SCHEDULE_KINDS:
            raise ValueError(f"{own}.kind must be one of {list(SCHEDULE_KINDS.names())}, got {self.kind!r}")
        object.__setattr__(self, "start", _finite(own, "start", self.start, optional=True))
        object.__setattr__(self, "end", _finite(own, "end", self.end, optional=True))
        for name in ("at", "values"):
            v = getattr(self, name)
            if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
                raise ValueError(f"{own}.{name} must be a list of floats, got {v!r}")
            object.__setattr__(self, name, [_finite(own, f"{name}[{i}]", x) for i, x in enumerate(v)])
        reads = SCHEDULE_KINDS.get(self.kind).reads
        for name in ("end", "at", "values"):
            default = [] if name in ("at", "values") else None
            if name not in reads and getattr(self, name) != default:
                raise ValueError(f"{own}.{name} = {getattr(self, name)!r} is not read by kind {self.kind!r}; "
                                 f"leave it at its default {default!r}")
        if "end" in reads and self.end is None:
            raise ValueError(f"{own}.end is required by kind {self.kind!r} (the value at the last step)")
        if "at" in reads:
            if not self.at or len(self.at) != len(self.values):
                raise ValueError(f"{own}.at and {own}.values must be non-empty and of equal length for kind "
                                 f"'step', got at={self.at}, values={self.values}")
            if not all(0.0 < a <= 1.0 for a in self.at) or any(b <= a for a, b in zip(self.at, self.at[1:])):
                raise ValueError(f"{own}.at must be strictly increasing fractions in (0, 1], got {self.at}")


@dataclass(frozen=True)
class ScheduleKind:
    """Member type of ``SCHEDULE_KINDS``: value(schedule, start, progress) -> float; reads: the ``Schedule``
    settings besides ``start`` and ``kind`` that the kind reads."""

    value: Callable[[Schedule, float, float], float]
    reads: Tuple[str, ...]


def _constant(s: Schedule, start: float, p: float) -> float:
    return start


def _linear(s: Schedule, start: float, p: float) -> float:
    return start + (s.end - start) * p


def _cosine(s: Schedule, start: float, p: float) -> float:
    return s.end + (start - s.end) * 0.5 * (1.0 + math.cos(math.pi * p))


def _step(s: Schedule, start: float, p: float) -> float:
    v = start
    for a, x in zip(s.at, s.values):
        if p >= a:
            v = x
    return v


SCHEDULE_KINDS.register("constant", ScheduleKind(_constant, reads=()))
SCHEDULE_KINDS.register("linear", ScheduleKind(_linear, reads=("end",)))
SCHEDULE_KINDS.register("cosine", ScheduleKind(_cosine, reads=("end",)))
SCHEDULE_KINDS.register("step", ScheduleKind(_step, reads=("at", "values")))


def progress(step: int, steps: int) -> float:
    """Training progress of RL step ``step`` (1-based) of ``steps``: (step - 1) / (steps - 1), 0 when steps = 1."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= steps:
        raise ValueError(f"step must be an int in [1, {steps}], got {step!r}")
    return 0.0 if steps == 1 else (step - 1) / (steps - 1)


def value_at(schedule: Schedule, start: float, p: float) -> float:
    """The schedule's value at progress p in [0, 1], starting from ``start`` (the setting's configured value)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"progress must be in [0, 1], got {p!r}")
    if schedule.start is not None and schedule.start != start:
        raise ValueError(f"the schedule starts at {schedule.start!r} but the setting is {start!r}")
    return float(SCHEDULE_KINDS.get(schedule.kind).value(schedule, float(start), p))


def corners(schedule: Schedule) -> Tuple[float, ...]:
    """Progress points where the schedule takes every one of its extreme values: 0 and 1 for every kind (linear
    and cosine move monotonically between start and end) plus the step fractions. A range check that holds
    at these points holds at every step (every range check of the configs is an interval)."""
    return tuple(sorted({0.0, 1.0, *schedule.at}))


# ---------------------------------------------------------------------------------------------- objective
def _scheduled(cfg):
    for section, fields in cfg.schedules.items():
        for name, sched in fields.items():
            yield section, name, sched


def scheduled_values(cfg, p: float) -> Dict[str, float]:
    """{"section.field": value at progress p} for every scheduled field of ``cfg`` (an ObjectiveConfig)."""
    return {f"{sec}.{name}": value_at(sched, getattr(getattr(cfg, sec), name), p)
            for sec, name, sched in _scheduled(cfg)}


def objective_at(cfg, p: float):
    """The objective in effect at progress p: ``cfg`` with every scheduled field replaced by its value at p
    and no schedules left (a static, validated ObjectiveConfig). Without schedules, ``cfg`` itself."""
    if not cfg.schedules:
        return cfg
    by_section: Dict[str, Dict[str, float]] = {}
    for path, v in scheduled_values(cfg, p).items():
        sec, name = path.split(".")
        by_section.setdefault(sec, {})[name] = v
    sections = {sec: dataclasses.replace(getattr(cfg, sec), **vals) for sec, vals in by_section.items()}
    return dataclasses.replace(cfg, schedules={}, **sections)


# -------------------------------------------------------------------------------------------- temperature
@dataclass(frozen=True)
class TemperatureControl:
    target: Optional[float] = None
    """entropy-driven temperature: target mean policy entropy (nats/token); None = off."""
    gain: float = 0.5
    """temperature change per nat of entropy error per step: T <- T + gain (target - H)."""
    low: float = 0.7
    """lowest temperature (seed 003: 1.2 early -> 0.7 late)."""
    high: float = 1.2
    """highest temperature."""

    def __post_init__(self):
        own = "TemperatureControl"
        object.__setattr__(self, "target", _finite(own, "target", self.target, optional=True))
        for name in ("gain", "low", "high"):
            object.__setattr__(self, name, _finite(own, name, getattr(self, name)))
        if self.target is not None and self.target < 0:
            raise ValueError(f"{own}.target must be >= 0 (an entropy), got {self.target}")
        if not self.gain > 0:
            raise ValueError(f"{own}.gain must be > 0, got {self.gain}")
        if not 0 < self.low <= self.high:
            raise ValueError(f"{own}.low and {own}.high must satisfy 0 < low <= high, got {self.low}, {self.high}")
        if self.target is None:
            for f in dataclasses.fields(self):
                if f.name != "target" and getattr(self, f.name) != f.default:
                    raise ValueError(f"{own}.{f.name} = {getattr(self, f.name)!r} is not read while {own}.target "
                                     f"is None (control off); leave it at its default {f.default!r}")


def controlled_temperature(temperature: float, entropy: float, ctl: TemperatureControl) -> float:
    """The next step's temperature: clamp(T + gain (target - H), low, high); T unchanged when H is NaN (no
    update ran this step) or the control is off."""
    if ctl.target is None or entropy != entropy:
        return temperature
    return min(ctl.high, max(ctl.low, temperature + ctl.gain * (ctl.target - entropy)))


def check_temperature(temperature: float, schedule: Schedule, control: TemperatureControl) -> None:
    """Checks of a sampling temperature with its schedule and control (ValueError naming the setting)."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not math.isfinite(temperature):
        raise ValueError(f"rollout.temperature={temperature} is not a finite number")
    if control.target is not None:
        if schedule.kind != "constant":
            raise ValueError(f"rollout.temperature_schedule.kind = {schedule.kind!r} and "
                             f"rollout.temperature_control.target = {control.target} both set the temperature; "
                             f"choose one")
        if not control.low <= temperature <= control.high:
            raise ValueError(f"rollout.temperature = {temperature} must lie in [rollout.temperature_control.low, "
                             f".high] = [{control.low}, {control.high}] (it is the controlled start)")
    try:
        vals = [value_at(schedule, temperature, p) for p in corners(schedule)]
    except ValueError as e:
        raise ValueError(f"rollout.temperature_schedule: {e}") from None
    bad = [v for v in vals if not v > 0]
    if bad:
        raise ValueError(f"rollout.temperature_schedule reaches {bad[0]}: a sampling temperature must stay > 0")

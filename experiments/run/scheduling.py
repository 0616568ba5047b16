"""Settings that change over a run: the objective's schedules and the training-sampling temperature at a step."""

from __future__ import annotations

import copy
import dataclasses

from objbench import algos
from objbench.algos import schedules as SCH
from objbench.experiments.run.loop_state import LoopState
from objbench.experiments.run.setup import Setup


def at_step(s: Setup, state: LoopState, step: int) -> tuple[Setup, dict]:
    """The setup as it is at RL step ``step``: the objective with its schedules applied (algos.objective_at at the
    step's progress) and the training-sampling temperature (rollout.temperature_schedule, or the entropy-driven
    temperature kept in ``state``). Returns (setup, {"sched/<setting>": value}); ``s`` itself and {} when nothing
    is scheduled (every preset). The copy shares everything else with ``s`` (models, engine, timers)."""
    cfg, ro = s.cfg, s.cfg.rollout
    controlled = ro.temperature_control.target is not None
    if not cfg.objective.schedules and ro.temperature_schedule.kind == "constant" and not controlled:
        return s, {}
    p = SCH.progress(min(step, cfg.train.steps), cfg.train.steps)  # past the last step (bench): the end values
    sched = {f"sched/{k}": v for k, v in SCH.scheduled_values(cfg.objective, p).items()}
    if controlled:
        if state.temperature is None:
            state.temperature = ro.temperature
        T = state.temperature
    else:
        T = SCH.value_at(ro.temperature_schedule, ro.temperature, p)
    if controlled or ro.temperature_schedule.kind != "constant":
        sched["sched/rollout.temperature"] = T
    cfg_t = copy.copy(cfg)  # frozen: set its fields without re-running TrainConfig's (task-resolving) validation
    object.__setattr__(cfg_t, "objective", algos.objective_at(cfg.objective, p))
    object.__setattr__(cfg_t, "rollout", dataclasses.replace(ro, temperature=T, temperature_schedule=SCH.Schedule()))
    s_t = copy.copy(s)
    s_t.cfg, s_t.sampling = cfg_t, dataclasses.replace(s.sampling, temperature=T)
    return s_t, sched


def control_temperature(s: Setup, state: LoopState, m: dict) -> None:
    """rollout.temperature_control: the next step's temperature from this step's policy entropy (algos.schedules.
    controlled_temperature), kept in ``state`` so that a resumed run continues it."""
    ctl = s.cfg.rollout.temperature_control
    if ctl.target is not None:
        state.temperature = SCH.controlled_temperature(
            s.cfg.rollout.temperature if state.temperature is None else state.temperature,
            m.get("policy/entropy", float("nan")), ctl)

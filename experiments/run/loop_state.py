"""The training loop's state between steps: what a checkpoint keeps (state.json) so that a resumed run goes on
exactly where it stopped."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class LoopState:
    step: int = 0                 # RL steps done
    prompt_index: int = 0         # the next training problem of the prompt stream
    tokens: int = 0               # response tokens sampled so far
    elapsed: float = 0.0          # seconds spent in training steps (evaluation excluded)
    temperature: float | None = None        # rollout.temperature_control: the next step's sampling temperature
    pass_rates: dict[str, float] | None = None  # adaptive group sizes: running pass rate per difficulty

    def to_json(self) -> dict:
        """state.json's object: the fields that are set (None ones are left out, as older checkpoints did)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, d: dict) -> LoopState:
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown loop state field(s) {unknown}")
        return cls(**d)

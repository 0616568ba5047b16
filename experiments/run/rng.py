"""Random generators of the loop: one independent generator per (seed, step, purpose), so a resumed run
samples exactly what it would have."""

from __future__ import annotations

import torch


def seed_for(seed: int, step: int, stream: int) -> int:
    # independent generator per (seed, step, purpose): a resumed run samples exactly what it would have
    return (seed * 1_000_003 + step * 101 + stream) % (2**63 - 1)


def step_generator(seed: int, step: int, stream: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed_for(seed, step, stream))

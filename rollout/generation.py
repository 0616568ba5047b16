"""What every rollout engine takes and returns: sampling settings, a generation, and the engine interface
(rollout/engine.py holds the transformers engine and the registry; rollout/vllm_engine.py the vLLM one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    eos_id: int = 2
    pad_id: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Generation:
    response_ids: torch.Tensor   # (B, T) long, pad after EOS; EOS itself is part of the response
    response_mask: torch.Tensor  # (B, T) bool, True on generated tokens up to and including EOS
    logp: torch.Tensor           # (B, T) float32, behaviour log-probs (0 under the mask)
    truncated: torch.Tensor      # (B,) bool, True when max_new_tokens ran out before EOS

    @property
    def lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)


class RolloutEngine(Protocol):
    recompute_logp: bool
    """True when the behaviour log-probs come from other kernels than the trainer's forward: the loop rescores
    the samples with the trainer (old log-probs) and logs the difference"""

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator | None = None) -> Generation: ...

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """Make the engine sample from the policy's current weights (no-op when it shares the module)."""

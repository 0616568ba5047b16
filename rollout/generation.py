"""What every rollout engine takes and returns: sampling settings, a generation, and the engine interface
(rollout/engine.py holds the transformers engine and the registry; rollout/vllm_engine.py the vLLM one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch


@dataclass
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    eos_id: int = 2
    pad_id: int = 0
    top_k: int = 0
    """sample among the top_k most probable tokens only (ties at the k-th probability kept); 0 = off"""
    stop: tuple[str, ...] = ()
    """a row finishes at the first token whose decoding makes its response text contain one of these strings;
    that token is kept (in the response and its mask), nothing after it, and the row is not truncated. Engines
    need the tokenizer for it (HFEngine(..., tokenizer=...), VLLMEngine(..., tokenizer=...))"""

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.stop, str):
            raise ValueError(f"stop must be a list of strings, got the string {self.stop!r}")
        self.stop = tuple(self.stop)
        if not all(isinstance(x, str) and x for x in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(self.stop)!r}")


class StopStrings:
    """Which rows' response text has just come to contain a stop string (``SamplingParams.stop``).

    Called after every sampled token with the rows that are still running: it decodes only the last
    ``window`` tokens of each (the longest stop string's UTF-8 length + 2: every token decodes to at least one
    byte, so a stop string completed by the newest token lies inside; the 2 extra tokens absorb decoding
    effects at the window's start), special tokens included and no clean-up of spaces (vLLM's
    ``skip_special_tokens=False``, as rollout/vllm_engine.py asks for). A stop string that lay wholly in
    earlier tokens would have finished the row then, so a hit is the first token that completes one."""

    def __init__(self, tokenizer, stop: Sequence[str]):
        if not stop:
            raise ValueError("StopStrings needs at least one stop string")
        self.stop = tuple(stop)
        self.window = max(len(x.encode("utf-8")) for x in self.stop) + 2
        rust = getattr(tokenizer, "_tokenizer", None)
        if rust is not None and hasattr(rust, "decode_batch"):  # a fast tokenizer: straight to Rust
            self._decode = lambda rows: rust.decode_batch(rows, skip_special_tokens=False)
        else:
            self._decode = lambda rows: tokenizer.batch_decode(rows, skip_special_tokens=False,
                                                               clean_up_tokenization_spaces=False)

    def hits(self, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """ids: (B, t) the response tokens so far (row r's tokens contiguous from column 0); rows: (n,) long, the
        rows to check. Returns (n,) bool: the row's text now contains a stop string."""
        if rows.numel() == 0:
            return torch.zeros(0, dtype=torch.bool, device=ids.device)
        texts = self._decode(ids[rows, -self.window:].tolist())
        found = [any(x in t for x in self.stop) for t in texts]
        return torch.tensor(found, dtype=torch.bool, device=ids.device)


@dataclass
class Generation:
    response_ids: torch.Tensor   # (B, T) long, pad after EOS; EOS itself is part of the response
    response_mask: torch.Tensor  # (B, T) bool, True on generated tokens up to and including EOS (or the stop token)
    logp: torch.Tensor           # (B, T) float32, behaviour log-probs (0 under the mask)
    truncated: torch.Tensor      # (B,) bool, True when max_new_tokens ran out before EOS (or a stop string)

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

"""Policy, reference and critic models.

Every model here is a Hugging Face ``transformers`` causal LM, so the same code runs a 0.1M-parameter
CPU toy and a local multi-billion-parameter checkpoint. Tiny models are built from a config (no download);
any other value of ``arch`` is read as a local model directory.
"""

from __future__ import annotations

import copy
import inspect
import os
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel

# Named tiny Llama-architecture families for CPU work. Parameter counts are for the 24-token character
# vocabulary of envs.tokenizer (tied embeddings): tiny ~0.13M, small ~1.05M. tiny has head_dim 16, which vLLM's
# CPU attention rejects (it supports 32, 64, 80, ...; small has 32); tiny_h32 is tiny with 2 heads of 32 (same
# parameter count) for rollout.engine=vllm on a CPU. Never change an existing entry: committed results and
# cached warm starts depend on them.
TINY_ARCHS: dict[str, dict] = {
    "tiny": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4),
    "small": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4),
    "tiny_h32": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2),
}


def head_dim(arch: str) -> int | None:
    """Attention head size of a built-in arch or of a local model directory's config.json (None if unknown)."""
    if arch in TINY_ARCHS:
        spec = TINY_ARCHS[arch]
        return spec["hidden_size"] // spec["num_attention_heads"]
    cfg_file = os.path.join(arch, "config.json")
    if not os.path.isfile(cfg_file):
        return None
    import json

    with open(cfg_file) as fh:
        cfg = json.load(fh)
    cfg = cfg.get("text_config", cfg)  # multimodal wrappers keep the LM's settings in text_config
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    if cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    return None


def build_policy(arch: str, vocab_size: int, *, seed: int, max_positions: int = 64,
                 attn_implementation: str = "sdpa", pad_token_id: int = 0, bos_token_id: int = 1,
                 eos_token_id: int = 2) -> PreTrainedModel:
    """A fresh random-initialised policy (``arch`` in TINY_ARCHS) or a local HF model directory."""
    if arch in TINY_ARCHS:
        spec = TINY_ARCHS[arch]
        config = LlamaConfig(
            vocab_size=vocab_size,
            max_position_embeddings=max_positions,
            num_key_value_heads=spec["num_attention_heads"],
            tie_word_embeddings=True,
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            **spec,
        )
        config._attn_implementation = attn_implementation
        # torch's global RNG is the only source transformers uses for init: seed it right before building.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config)
        return model
    if os.path.isdir(arch):
        return AutoModelForCausalLM.from_pretrained(arch, attn_implementation=attn_implementation)
    raise ValueError(
        f"model.arch={arch!r} is neither a built-in tiny architecture ({', '.join(TINY_ARCHS)}) "
        "nor an existing local model directory"
    )


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    """The reference policy: a frozen, eval-mode copy of the start policy."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


class ValueModel(nn.Module):
    """PPO critic: the policy's transformer trunk (copied from the start policy) plus a scalar head.

    This is the common LLM-PPO setup (critic initialised from the actor, value head zero-initialised so the
    first value estimates are 0). ``forward`` returns per-position values, shape (B, L).
    """

    def __init__(self, policy: PreTrainedModel):
        super().__init__()
        self.backbone = copy.deepcopy(policy.base_model)  # LlamaModel: trunk without the LM head
        hidden = policy.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids):
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids).last_hidden_state  # (B, L, H)
        return self.head(h).squeeze(-1)  # (B, L)


# transformers 5.x renamed `past_key_values` to `cache`; accept both so older 4.x installs keep working.
_CACHE_KW: dict[type, str] = {}


def cache_kwarg(model: nn.Module) -> str:
    cls = type(model)
    if cls not in _CACHE_KW:
        params = inspect.signature(model.forward).parameters
        _CACHE_KW[cls] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KW[cls]


def output_cache(out):
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


@dataclass
class ModelBundle:
    """What the training loop holds: the trained policy, an optional frozen reference and an optional critic."""

    policy: PreTrainedModel
    reference: PreTrainedModel | None = None
    critic: ValueModel | None = None

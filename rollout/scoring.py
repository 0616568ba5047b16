"""Teacher-forced scoring: per-token log-probs, entropies and (optionally) full-vocabulary logits of the
response tokens given the prompt, in one batched forward pass.

Layout: the model reads [prompt (left-padded, P) | response (right-padded, T)]. The logit at position
P-1+t predicts response token t, so only the last T+1 positions go through the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from objbench.algos.entropy import entropy_from_log_probs
from objbench.rollout import fastlm
from objbench.rollout.engine import log_softmax


@dataclass
class Scored:
    logp: torch.Tensor            # (B, T) log-prob of each response token at the given temperature
    entropy: torch.Tensor | None  # (B, T) entropy of the next-token distribution
    logits: torch.Tensor | None   # (B, T, V) temperature-scaled logits, when asked for
    log_probs: torch.Tensor | None = None  # (B, T, V) their log_softmax, with the logits


def full_inputs(prompt_ids, prompt_mask, response_ids, response_mask):
    """Concatenate prompt and response; positions count real tokens only (left padding)."""
    ids = torch.cat([prompt_ids, response_ids], dim=1)                 # (B, P+T)
    attn = torch.cat([prompt_mask, response_mask], dim=1).long()       # (B, P+T)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids, attn, pos


def score(model, prompt_ids, prompt_mask, response_ids, response_mask, *, temperature: float = 1.0,
          with_entropy: bool = True, with_logits: bool = False, entropy_grad: bool = True,
          forward: str = "auto") -> Scored:
    """Teacher-forced pass; differentiable when called with grad enabled. ``entropy_grad=False`` computes the
    entropy as a detached metric (less autograd work when no loss term uses it). ``forward``: "auto" (the lean
    forward of rollout/fastlm.py where it supports the model) or "hf" (always the transformers forward)."""
    T = response_ids.shape[1]
    if fastlm.supports(model, forward):  # same function, shared prompts computed once, padding mostly skipped
        logits = fastlm.response_logits(model, prompt_ids, prompt_mask, response_ids, response_mask).float()
    else:
        ids, attn, pos = full_inputs(prompt_ids, prompt_mask, response_ids, response_mask)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                       logits_to_keep=T + 1).logits[:, :-1].float()     # (B, T, V)
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp_all = log_softmax(logits)
    logp = logp_all.gather(-1, response_ids[..., None]).squeeze(-1)    # (B, T)
    ent = None
    if with_entropy:
        if entropy_grad:
            ent = entropy_from_log_probs(logp_all)
        else:
            with torch.no_grad():
                ent = entropy_from_log_probs(logp_all)
    return Scored(logp=logp, entropy=ent, logits=logits if with_logits else None,
                  log_probs=logp_all if with_logits else None)


def row_blocks(n_rows: int, block_rows: int) -> list[slice]:
    """Consecutive row slices of at most ``block_rows`` rows covering ``n_rows`` (one slice when block_rows is 0)."""
    if block_rows <= 0 or n_rows <= block_rows:
        return [slice(0, n_rows)]
    return [slice(i, min(i + block_rows, n_rows)) for i in range(0, n_rows, block_rows)]


def score_blocks(model, prompt_ids, prompt_mask, response_ids, response_mask, *, block_rows: int,
                 **kwargs) -> Scored:
    """``score`` a batch block by block (no gradient: the reference, rescoring), so the (rows, T, V) logits exist
    for ``block_rows`` rows at a time; the per-token results are concatenated. One block = exactly ``score``."""
    blocks = row_blocks(response_ids.shape[0], block_rows)
    if len(blocks) == 1:
        return score(model, prompt_ids, prompt_mask, response_ids, response_mask, **kwargs)
    parts = [score(model, prompt_ids[b], prompt_mask[b], response_ids[b], response_mask[b], **kwargs)
             for b in blocks]

    def cat(name):
        values = [getattr(sc, name) for sc in parts]
        return None if values[0] is None else torch.cat(values)

    return Scored(cat("logp"), cat("entropy"), cat("logits"), cat("log_probs"))


def score_values(critic, prompt_ids, prompt_mask, response_ids, response_mask) -> torch.Tensor:
    """Critic values V(s_t) for the state before each response token t: (B, T)."""
    T = response_ids.shape[1]
    ids, attn, pos = full_inputs(prompt_ids, prompt_mask, response_ids, response_mask)
    v = critic(ids, attn, pos)                                          # (B, P+T)
    return v[:, -T - 1:-1]


def score_values_blocks(critic, prompt_ids, prompt_mask, response_ids, response_mask, *, block_rows: int):
    """``score_values`` block by block (no gradient), concatenated; one block = exactly ``score_values``."""
    blocks = row_blocks(response_ids.shape[0], block_rows)
    if len(blocks) == 1:
        return score_values(critic, prompt_ids, prompt_mask, response_ids, response_mask)
    return torch.cat([score_values(critic, prompt_ids[b], prompt_mask[b], response_ids[b], response_mask[b])
                      for b in blocks])

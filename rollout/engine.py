"""Rollout engines: sample completions and their behaviour log-probs.

An engine takes left-padded prompts (already repeated G times by the caller, so group i occupies rows
[i*G, (i+1)*G)) and returns one ``Generation``. The training loop only sees this interface: engines are
registered factories (``ENGINES``, ``register_engine``, ``make_engine(name, policy, **settings)``), so the
vLLM engine (rollout/vllm_engine.py) drops in without touching the loop. The loop calls
``engine.sync_weights(policy)`` after every optimizer update and after a checkpoint resume.

An engine whose behaviour log-probs are not the trainer's own function (other kernels, another dtype) sets
``recompute_logp = True``: the loop then rescores the sampled tokens with the trainer and uses those as the
old log-probs (verl and TRL do the same), logging the engine/trainer difference.

Behaviour log-probs are log-softmax(logits / temperature) of the sampled token, *before* top-k and top-p
truncation (the convention of verl and TRL: the ratio compares the policy at the sampling temperature, and the
top-k / top-p renormalisation is ignored). With temperature 1, top_p 1 and top_k 0 they equal the teacher-forced
log-probs of the same weights (tests/test_rollout.py checks this). Top-k comes first, then top-p over the
top-k distribution renormalised (the order of vLLM and transformers' generate); ties at the k-th probability
are all kept (as vLLM does).

Stop strings (``SamplingParams.stop``) need the tokenizer, given to the engine: ``HFEngine(..., tokenizer=)``
(``make_engine("hf", policy, tokenizer=...)``); see generation.StopStrings for how a row is checked.
"""

from __future__ import annotations

from typing import Callable

import torch

from objbench.rollout import fastlm
from objbench.rollout.generation import Generation, RolloutEngine, SamplingParams, StopStrings
from objbench.rollout.models import cache_kwarg, output_cache


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last dim as ``x - logsumexp(x)``: the same values to float rounding, about twice as
    fast as torch.log_softmax on CPU for the short vocabulary rows of objbench's tiny models (measured 62 vs 130
    us for 1280 rows of 15). The trainer's scoring (rollout/scoring.py) uses it too."""
    return logits - logits.logsumexp(-1, keepdim=True)


def _sample(logits: torch.Tensor, params: SamplingParams, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of ``logits`` (B, V); return (token (B,), behaviour log-prob (B,)).

    Sampling is by inverse CDF: one uniform u in (0, 1] per row, token = the first index whose cumulative
    probability reaches u * total. The same distribution as torch.multinomial (a zero-probability token is
    never picked), one uniform per row instead of one exponential per vocabulary entry (4x faster on CPU)."""
    if params.temperature == 0:
        tok = logits.argmax(-1)
        return tok, log_softmax(logits.float()).gather(-1, tok[:, None]).squeeze(-1)
    logp_all = log_softmax(logits.float() / params.temperature)  # (B, V)
    probs = logp_all.exp()
    top_k = 0 < params.top_k < probs.shape[-1]
    if top_k:  # the k most probable tokens, and every token tied with the k-th
        probs = probs.masked_fill(probs < probs.topk(params.top_k, dim=-1).values[:, -1:], 0.0)
    if params.top_p < 1.0:
        sorted_p, idx = probs.sort(-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (of the top-k mass with top_k; the first token is
        # always kept)
        drop = sorted_p.cumsum(-1) - sorted_p >= (params.top_p * sorted_p.sum(-1, keepdim=True) if top_k
                                                  else params.top_p)
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
    cdf = probs.cumsum(-1)
    u = 1.0 - torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=probs.dtype)
    # #{v : cdf_v < u * total}: token v is picked iff cdf_{v-1} < u * total <= cdf_v, so never one with p_v = 0
    tok = (cdf < u * cdf[:, -1:]).sum(-1).clamp_(max=probs.shape[-1] - 1)
    return tok, logp_all.gather(-1, tok[:, None]).squeeze(-1)


class HFEngine:
    """Sampling loop over a transformers causal LM with its KV cache; stops when every row hit EOS.

    ``use_cache=False`` recomputes the full prefix each step (slow; used to test the cached path). With the
    cache, Llama-family models go through rollout/fastlm.py (same sampler, lean forward, finished rows dropped);
    other models, or every model with ``forward="hf"``, through the transformers forward.
    """

    recompute_logp = False  # the sampler's log-probs are the trainer's (same module, tests/test_rollout.py)

    def __init__(self, model: torch.nn.Module, use_cache: bool = True, forward: str = "auto", tokenizer=None):
        self.model = model
        self.use_cache = use_cache
        self.forward = forward  # "auto" | "hf" (model.forward): which forward the sampler runs
        self.tokenizer = tokenizer  # decodes the response tails that stop strings are looked for in
        self._stoppers: dict[tuple, StopStrings] = {}

    def stopper(self, params: SamplingParams) -> StopStrings | None:
        """The stop-string check of ``params`` (None without stop strings)."""
        if not params.stop:
            return None
        if self.tokenizer is None:
            raise ValueError(f"stop strings {list(params.stop)!r} need the tokenizer: HFEngine(..., tokenizer=...)")
        if params.stop not in self._stoppers:
            self._stoppers[params.stop] = StopStrings(self.tokenizer, params.stop)
        return self._stoppers[params.stop]

    def sync_weights(self, policy: torch.nn.Module) -> None:
        self.model = policy  # shares the module: nothing to copy

    def generate(self, prompt_ids, prompt_mask, params: SamplingParams, generator=None) -> Generation:
        g = self._generate(prompt_ids, prompt_mask, params, generator)
        # copies made outside inference mode: ordinary tensors that autograd may save (e.g. as gather indices)
        return Generation(g.response_ids.clone(), g.response_mask.clone(), g.logp.clone(), g.truncated.clone())

    @torch.inference_mode()
    def _generate(self, prompt_ids, prompt_mask, params: SamplingParams, generator=None) -> Generation:
        if prompt_ids.shape != prompt_mask.shape or prompt_mask.dtype != torch.bool:
            raise ValueError("prompt_mask must be a bool tensor with prompt_ids' shape")
        model = self.model
        stopper = self.stopper(params)
        if self.use_cache and fastlm.supports(model, self.forward):  # same sampler, lean forward (rollout/fastlm.py)
            return Generation(*fastlm.generate(model, prompt_ids, prompt_mask, params, _sample, generator,
                                               stop_fn=None if stopper is None else stopper.hits))
        was_training = model.training
        model.eval()
        B = prompt_ids.shape[0]
        T = params.max_new_tokens
        dev = prompt_ids.device
        out_ids = torch.full((B, T), params.pad_id, dtype=torch.long, device=dev)
        out_logp = torch.zeros(B, T, dtype=torch.float32, device=dev)
        out_mask = torch.zeros(B, T, dtype=torch.bool, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        attn = prompt_mask.long()
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # left padding: positions count real tokens only
        ids = prompt_ids
        cache = None
        ckw = cache_kwarg(model)
        n_steps = 0
        for t in range(T):
            if self.use_cache:
                kwargs = {ckw: cache} if cache is not None else {}
                out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True,
                            logits_to_keep=1, **kwargs)
                cache = output_cache(out)
            else:
                out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                            logits_to_keep=1)
            tok, lp = _sample(out.logits[:, -1], params, generator)
            live = ~done
            out_ids[:, t] = torch.where(live, tok, params.pad_id)
            out_logp[:, t] = torch.where(live, lp, 0.0)
            out_mask[:, t] = live
            done = done | (tok == params.eos_id)
            if stopper is not None:  # running rows whose text now holds a stop string finish here
                rows = (live & ~done).nonzero().squeeze(-1)
                done[rows] |= stopper.hits(out_ids[:, :t + 1], rows)
            n_steps = t + 1
            if bool(done.all()):
                break
            step_tok = torch.where(done, params.pad_id, tok)
            # finished rows keep attending to their own prefix; their extra tokens are masked out
            attn = torch.cat([attn, live.long()[:, None]], dim=1)
            next_pos = pos[:, -1:] + 1
            if self.use_cache:
                ids, pos = step_tok[:, None], next_pos
            else:
                ids = torch.cat([ids, step_tok[:, None]], dim=1)
                pos = torch.cat([pos, next_pos], dim=1)
        if was_training:
            model.train()
        truncated = ~done
        # trim the unused tail so downstream tensors stay small
        return Generation(out_ids[:, :n_steps], out_mask[:, :n_steps], out_logp[:, :n_steps], truncated)


def repeat_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int):
    """Rows [i*G, (i+1)*G) are G copies of prompt i (the group layout algos/ expects)."""
    return prompt_ids.repeat_interleave(group_size, 0), prompt_mask.repeat_interleave(group_size, 0)


# ---------------------------------------------------------------------------------------------------------
# registry

EngineFactory = Callable[..., RolloutEngine]
ENGINES: dict[str, EngineFactory] = {}
"""name -> factory(policy, **settings) returning a RolloutEngine"""


def register_engine(name: str, factory: EngineFactory) -> EngineFactory:
    """Register a rollout engine factory under ``name`` (``rollout.engine=name``); duplicates raise."""
    if name in ENGINES:
        raise ValueError(f"rollout engine {name!r} is already registered")
    ENGINES[name] = factory
    return factory


def make_engine(name: str, policy: torch.nn.Module, **settings) -> RolloutEngine:
    """The engine ``name`` built around the start policy (the loop syncs later weights into it)."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; registered: {', '.join(ENGINES)}")
    return ENGINES[name](policy, **settings)


def _hf_engine(policy: torch.nn.Module, use_cache: bool = True, forward: str = "auto", tokenizer=None) -> HFEngine:
    return HFEngine(policy, use_cache=use_cache, forward=forward, tokenizer=tokenizer)


def _vllm_engine(policy: torch.nn.Module, **settings) -> RolloutEngine:
    from objbench.rollout.vllm_engine import VLLMEngine  # imports vLLM only when chosen

    return VLLMEngine(policy, **settings)


register_engine("hf", _hf_engine)
register_engine("vllm", _vllm_engine)

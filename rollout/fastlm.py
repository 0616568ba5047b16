"""A lean forward pass and sampling loop for Llama-family causal LMs, over the model's own parameters.

Why: at the sizes objbench runs on a CPU (a 0.1M-1M parameter policy, batches of a few hundred short
sequences) a step is dominated by per-call overhead around small matrix products, not by the products
themselves: transformers' generic forward builds masks and cache objects every call, its CPU sdpa kernel is
slow for sequences of ~15 tokens, and ``generate()``-style loops keep finished rows in the batch. This module
computes the same function with fewer, larger operations:

- fused q/k/v and gate/up projections (one matmul each), ``F.rms_norm``, attention as two batched matmuls
  with an additive mask (finite minimum, so fully padded query rows stay finite instead of NaN);
- sampling with a preallocated KV cache, the prompt prefilled once per *distinct* prompt (a group's G copies
  share it), and finished rows dropped from the batch as they finish.

It reads the parameters of the transformers module every call, so it sees the optimizer's updates and autograd
flows into the same ``nn.Parameter`` objects: the policy stays a transformers model (saved with
``save_pretrained``, scored by ``model(...)`` anywhere else). tests/test_fastlm.py checks logits, gradients
and sampled log-probs against the transformers forward (agreement to ~1e-6 in float32).

Device and dtype: every tensor this module creates lives on the model's device (that of its embedding, or of
the caller's prompt tensors) and uses the model's dtype, except where float32 is the point: rotary angles are
computed in float32 as transformers does, attention probabilities in at least float32 (float64 models keep
float64), and behaviour log-probs are float32 (the engine's ``Generation`` contract).

Supported: ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` configs (biases on any projection allowed), rotary
embeddings whose frequencies are fixed at init (default, linear, llama3, yarn: all read from the model's own
``inv_freq`` and ``attention_scaling``), no sliding window, silu MLP. Anything else (``supports()`` says why)
uses the transformers forward unchanged.
"""

from __future__ import annotations

import itertools
import weakref

import torch
import torch.nn.functional as F

_TYPES = ("llama", "qwen2")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn", None)


def why_unsupported(model) -> str | None:
    """None when the lean path computes this model's function; otherwise the reason it does not."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in _TYPES:
        return f"model type {getattr(cfg, 'model_type', None)!r} is not one of {_TYPES}"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}"
    rope = getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None) or {}
    rtype = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    if rtype not in _STATIC_ROPE:
        return f"rope type {rtype!r} (frequencies change with length)"
    if not hasattr(getattr(model, "model", None), "rotary_emb"):
        return "no rotary embedding module"
    if getattr(model, "_objbench_forward", "auto") == "hf":
        return "disabled (model.forward=hf)"
    return None


def supports(model) -> bool:
    return why_unsupported(model) is None


def _bias(linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias
    return torch.zeros(linear.out_features, dtype=linear.weight.dtype, device=linear.weight.device)


def _cat_bias(*linears):
    if all(l.bias is None for l in linears):
        return None
    return torch.cat([_bias(l) for l in linears])


class _Weights:
    """The parameters of one forward, with the fused projections concatenated (differentiably)."""

    def __init__(self, model):
        cfg = model.config
        m = model.model
        self.H = cfg.num_attention_heads
        self.Hkv = getattr(cfg, "num_key_value_heads", None) or self.H
        self.hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        self.emb = m.embed_tokens.weight
        # nn.Embedding(padding_idx=...) gives the padding row no gradient from lookups (a sampled <pad> inside a
        # response is looked up too); the tied LM head still trains it
        self.pad_idx = m.embed_tokens.padding_idx
        self.norm = (m.norm.weight, m.norm.variance_epsilon)
        self.lm = (model.lm_head.weight, model.lm_head.bias)
        rot = m.rotary_emb
        self.inv_freq = rot.inv_freq.float()
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.layers = []
        for layer in m.layers:
            a, p = layer.self_attn, layer.mlp
            # q, rotate_half(q), k, rotate_half(k), v in ONE matmul: rotate_half is a signed permutation of each
            # head's dims, so it can be applied to the weight rows instead of to the activations (exactly)
            wq, wk, wv = a.q_proj.weight, a.k_proj.weight, a.v_proj.weight
            bq, bk, bv = (_bias(l) for l in (a.q_proj, a.k_proj, a.v_proj))
            rq, rk = self._rot(self.H), self._rot(self.Hkv)
            self.layers.append((
                (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                torch.cat([wq, wq[rq] * self._sign(self.H)[:, None], wk, wk[rk] * self._sign(self.Hkv)[:, None], wv]),
                torch.cat([bq, bq[rq] * self._sign(self.H), bk, bk[rk] * self._sign(self.Hkv), bv])
                if a.q_proj.bias is not None or a.k_proj.bias is not None or a.v_proj.bias is not None else None,
                a.o_proj.weight, a.o_proj.bias, float(a.scaling),
                (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                torch.cat([p.gate_proj.weight, p.up_proj.weight]), _cat_bias(p.gate_proj, p.up_proj),
                p.down_proj.weight, p.down_proj.bias,
            ))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.emb, padding_idx=self.pad_idx)

    def _rot(self, heads: int) -> torch.Tensor:
        """Row order of rotate_half applied to `heads` heads: out[:h] = -in[h:], out[h:] = in[:h]."""
        h, dev = self.hd // 2, self.emb.device
        one = torch.cat([torch.arange(h, 2 * h, device=dev), torch.arange(0, h, device=dev)])
        return (one[None] + self.hd * torch.arange(heads, device=dev)[:, None]).reshape(-1)

    def _sign(self, heads: int) -> torch.Tensor:
        h, like = self.hd // 2, dict(dtype=self.emb.dtype, device=self.emb.device)
        return torch.cat([-torch.ones(h, **like), torch.ones(h, **like)]).repeat(heads)  # +-1: exact in any dtype

    def rope(self, pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (B, 1, L, hd) for integer positions (B, L)."""
        freqs = pos[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.rope_scale != 1.0:
            cos, sin = cos * self.rope_scale, sin * self.rope_scale
        return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


def _distinct_prompts(ids: torch.Tensor, mask: torch.Tensor):
    """(first row of each run of identical consecutive rows, run index of every row).

    Engines get prompts in the group layout (G identical rows in a row), so runs are groups; identical rows
    that are not adjacent are simply computed twice. Much cheaper than torch.unique(dim=0).
    """
    if ids.shape[0] == 1:
        zero = torch.zeros(1, dtype=torch.long, device=ids.device)
        return zero, zero
    same = ((ids[1:] == ids[:-1]) & (mask[1:] == mask[:-1])).all(-1)
    starts = torch.cat([torch.ones(1, dtype=torch.bool, device=ids.device), ~same])
    return starts.nonzero().squeeze(-1), starts.long().cumsum(0) - 1


# frozen model -> (its parameter and buffer tensors, their (data_ptr, _version), the fused weights built from them).
# Kept beside the model, not on it: copy.deepcopy / pickling of the model never carry a fused copy, and the
# entry goes when the model does.
_FUSED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _state(model):
    tensors = tuple(itertools.chain(model.parameters(), model.buffers()))
    return tensors, tuple((t.data_ptr(), t._version) for t in tensors)


def _weights(model) -> _Weights:
    """Fused weights for this call. A model being trained (some parameter requires grad) gets them built afresh
    every call, differentiably. A frozen model (e.g. the reference) reuses its fused copy for as long as its
    parameters and buffers are the same tensor objects with the same storage and version counters: any
    in-place edit (``with torch.no_grad(): p.add_(...)``, ``load_state_dict``, an optimizer step), a
    replaced or moved tensor (``model.to(...)``) or a copy of the model builds it again.

    Not seen: edits through ``p.data`` (``p.data.copy_(x)``), since PyTorch gives ``.data`` a version counter
    of its own; edit frozen weights under ``torch.no_grad()`` instead.
    """
    if any(p.requires_grad for p in model.parameters()):
        return _Weights(model)
    tensors, stamp = _state(model)
    hit = _FUSED.get(model)
    if hit is not None and len(hit[0]) == len(tensors) and all(a is b for a, b in zip(hit[0], tensors)) \
            and hit[1] == stamp:
        return hit[2]
    with torch.no_grad():
        fused = _Weights(model)
    # the entry holds the tensors themselves, so their ids cannot be reused by new tensors while it lives
    _FUSED[model] = (tensors, stamp, fused)
    return fused


def _rms(x, w_eps):
    w, eps = w_eps
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _additive_mask(key_valid: torch.Tensor, L_q: int, dtype) -> torch.Tensor:
    """(B, 1, L_q, L_k) additive mask: causal (queries are the last L_q keys) and key padding."""
    B, L_k = key_valid.shape
    dev = key_valid.device
    q_idx = torch.arange(L_k - L_q, L_k, device=dev)[:, None]
    allowed = (torch.arange(L_k, device=dev)[None, :] <= q_idx)[None] & key_valid[:, None, :]
    out = torch.zeros(B, 1, L_q, L_k, dtype=dtype, device=dev)
    return out.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)


def _attend(q, k, v, mask, scaling, groups):
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scaling + mask
    # softmax in float32 for half-precision models (as transformers' eager attention), float64 kept
    p = torch.softmax(s, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    return torch.matmul(p, v)


def _layer(x, lw, W: _Weights, cos, sin, mask, cache_kv=None, prefix_kv=None):
    """One decoder layer. With cache_kv=(K, V, at) the new keys/values are written at positions ``at`` of the
    preallocated cache and attention runs over the cache prefix; with prefix_kv=(k, v) the keys/values of a
    shared prefix come first (differentiably); otherwise attention runs over x itself. Returns (x, k, v)."""
    n_in, wqkv, bqkv, wo, bo, scaling, n_post, wgu, bgu, wd, bd = lw
    B, L, _ = x.shape
    H, Hkv, hd = W.H, W.Hkv, W.hd
    qkv = F.linear(_rms(x, n_in), wqkv, bqkv)
    q, q_r, k, k_r, v = qkv.split([H * hd, H * hd, Hkv * hd, Hkv * hd, Hkv * hd], dim=-1)
    # rotary embedding: x cos + rotate_half(x) sin, with rotate_half(x) already computed by the projection
    q = (q.view(B, L, H, hd).transpose(1, 2) * cos).add_(q_r.view(B, L, H, hd).transpose(1, 2) * sin)
    k = (k.view(B, L, Hkv, hd).transpose(1, 2) * cos).add_(k_r.view(B, L, Hkv, hd).transpose(1, 2) * sin)
    v = v.view(B, L, Hkv, hd).transpose(1, 2)
    if cache_kv is not None:
        K, V, at = cache_kv
        K[:, :, at:at + L] = k
        V[:, :, at:at + L] = v
        k, v = K[:, :, :at + L], V[:, :, :at + L]
    elif prefix_kv is not None:
        k = torch.cat([prefix_kv[0], k], dim=2)
        v = torch.cat([prefix_kv[1], v], dim=2)
    o = _attend(q, k, v, mask, scaling, H // Hkv)
    x = x + F.linear(o.transpose(1, 2).reshape(B, L, H * hd), wo, bo)
    g, u = F.linear(_rms(x, n_post), wgu, bgu).chunk(2, dim=-1)
    x = x + F.linear(F.silu(g) * u, wd, bd)
    return x, k, v


def forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
            logits_to_keep: int = 0) -> torch.Tensor:
    """Logits of the last ``logits_to_keep`` positions (all when 0), like ``model(...).logits``.

    attention_mask: (B, L) bool or 0/1, False/0 on padding. Differentiable w.r.t. the model's parameters.
    """
    W = _weights(model)
    x = W.embed(input_ids)
    cos, sin = W.rope(position_ids, x.dtype)
    mask = _additive_mask(attention_mask.bool(), input_ids.shape[1], x.dtype)
    for lw in W.layers:
        x, _, _ = _layer(x, lw, W, cos, sin, mask)
    if logits_to_keep:
        x = x[:, -logits_to_keep:]
    return F.linear(_rms(x, W.norm), *W.lm)


BUCKET_PENALTY = 600.0  # padded positions one more bucket must save to pay for its extra calls (measured on CPU)


def _buckets(lengths: list[int], penalty: float | None = None) -> list[int]:
    """Split rows sorted by length into contiguous buckets, each padded to its longest row: the cut points
    (indices into the sorted rows) minimising sum(rows x padded length) + penalty per bucket."""
    penalty = BUCKET_PENALTY if penalty is None else penalty
    n = len(lengths)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        if j < n and lengths[j] == lengths[j - 1]:
            continue  # never split a run of equal lengths
        for i in range(j):
            if i > 0 and lengths[i] == lengths[i - 1]:
                continue
            c = best[i] + (j - i) * lengths[j - 1] + penalty
            if c < best[j]:
                best[j], cut[j] = c, i
    bounds, j = [], n
    while j > 0:
        bounds.append(j)
        j = cut[j]
    return sorted(bounds)


def _prefill(W: _Weights, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """Each distinct prompt through the model once. Returns (logits of the next token for every row (B, V),
    per-layer (k, v) of the distinct prompts (U, Hkv, P, hd), row -> distinct-prompt index (B,))."""
    first_rows, inverse = _distinct_prompts(prompt_ids, prompt_mask)
    u_ids, u_mask = prompt_ids[first_rows], prompt_mask[first_rows]
    x = W.embed(u_ids)
    cos, sin = W.rope((u_mask.long().cumsum(-1) - 1).clamp(min=0), W.emb.dtype)
    mask = _additive_mask(u_mask, prompt_ids.shape[1], W.emb.dtype)
    kv = []
    for lw in W.layers:
        x, k, v = _layer(x, lw, W, cos, sin, mask)
        kv.append((k, v))
    return F.linear(_rms(x[:, -1], W.norm), *W.lm).index_select(0, inverse), kv, inverse


def response_logits(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                    response_mask: torch.Tensor) -> torch.Tensor:
    """Teacher-forced logits predicting each response token: (B, T, V); zeros past each row's length.

    Same function as ``model(cat(prompt, response))`` sliced to the response, computed with less work: each
    distinct prompt goes through the model once (a group's G copies share its keys and values, gradients
    included), and rows are bucketed by response length so that padding past a row's end is mostly skipped.
    Differentiable w.r.t. the model's parameters.
    """
    W = _weights(model)
    B, P = prompt_ids.shape
    T = response_ids.shape[1]
    dtype = W.emb.dtype
    pm = prompt_mask.bool()
    first, prefix, inverse = _prefill(W, prompt_ids, pm)                 # first: (B, V), predicts token 0
    V_ = first.shape[-1]
    if T == 1:
        return first[:, None]
    # response token t (t >= 1) is predicted at response position t-1: a row of length l needs l-1 positions
    need = (response_mask.sum(-1) - 1).clamp(min=0)
    order = torch.argsort(need, stable=True)
    need_sorted = need[order].tolist()
    start_pos = pm.long().sum(-1)
    parts = []
    lo = 0
    for hi in _buckets(need_sorted):
        rows = order[lo:hi]
        Tb = need_sorted[hi - 1]
        lo = hi
        if Tb == 0:
            parts.append(first.new_zeros(len(rows), T - 1, V_))
            continue
        r_ids, r_mask = response_ids[rows, :Tb], response_mask[rows, :Tb]
        key_valid = torch.cat([pm[rows], r_mask], 1)
        xb = W.embed(r_ids)
        cos_b, sin_b = W.rope(start_pos[rows, None] + torch.arange(Tb, device=start_pos.device), dtype)
        mask_b = _additive_mask(key_valid, Tb, dtype)
        inv_b = inverse[rows]
        for (k, v), lw in zip(prefix, W.layers):
            xb, _, _ = _layer(xb, lw, W, cos_b, sin_b, mask_b,
                              prefix_kv=(k.index_select(0, inv_b), v.index_select(0, inv_b)))
        lb = F.linear(_rms(xb, W.norm), *W.lm)                          # (b, Tb, V)
        if Tb < T - 1:
            lb = torch.cat([lb, lb.new_zeros(len(rows), T - 1 - Tb, V_)], 1)
        parts.append(lb)
    rest = torch.cat(parts, 0)[torch.argsort(order)]                     # back to the original row order
    return torch.cat([first[:, None], rest], 1)


@torch.inference_mode()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params, sample_fn, generator=None):
    """Sample up to params.max_new_tokens per row. Returns (ids, mask, logp, truncated) in the engine's layout.

    sample_fn(logits (n, V), params, generator) -> (token (n,), behaviour log-prob (n,)) is the engine's
    sampler, so both engines pick tokens by the same rule.
    """
    B, P = prompt_ids.shape
    T = params.max_new_tokens
    W = _weights(model)
    dtype = W.emb.dtype
    dev = prompt_ids.device
    logits, prefix, inverse = _prefill(W, prompt_ids, prompt_mask.bool())  # logits (B, V)
    K = torch.zeros(len(W.layers), B, W.Hkv, P + T, W.hd, dtype=dtype, device=dev)
    V = torch.zeros_like(K)
    for i, (k, v) in enumerate(prefix):
        K[i, :, :, :P] = k.index_select(0, inverse)
        V[i, :, :, :P] = v.index_select(0, inverse)
    # decode-time mask: one query per row sees every valid key so far; kept as an additive row, updated in place
    amask = torch.full((B, 1, 1, P + T), torch.finfo(dtype).min, dtype=dtype, device=dev)
    amask[:, 0, 0, :P].masked_fill_(prompt_mask.bool(), 0.0)
    next_pos = prompt_mask.long().sum(-1)                              # (B,) position of the first new token
    cos_t, sin_t = W.rope(torch.arange(P + T, device=dev)[None], dtype)  # rotary table for every position
    cos_t, sin_t = cos_t[0, 0], sin_t[0, 0]                            # (P+T, hd)

    out_ids = torch.full((B, T), params.pad_id, dtype=torch.long, device=dev)
    out_logp = torch.zeros(B, T, dtype=torch.float32, device=dev)  # float32: the Generation contract
    out_mask = torch.zeros(B, T, dtype=torch.bool, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    rows = torch.arange(B, device=dev)  # original row of each row of the (compacted) working batch
    n_steps = 0
    active = torch.ones(B, dtype=torch.bool, device=dev)  # rows of the working batch that have not finished
    full = torch.zeros(B, logits.shape[-1], dtype=logits.dtype, device=dev)
    for t in range(T):
        # sample over all B rows, as the transformers path does, so both consume the generator identically
        # (rows that left the working batch get dummy logits; their draws are discarded)
        full[rows] = logits
        tok, lp = sample_fn(full, params, generator)
        tok, lp = tok[rows], lp[rows]
        r = rows[active]
        out_ids[r, t] = tok[active]
        out_logp[r, t] = lp[active]
        out_mask[r, t] = True
        finished = active & (tok == params.eos_id)
        done[rows[finished]] = True
        n_steps = t + 1
        live = active & ~finished
        n_live = int(live.sum())
        if n_live == 0 or t == T - 1:
            break
        if n_live < 0.75 * len(rows):  # drop finished rows from the working batch (and from the cache)
            keep = live.nonzero().squeeze(-1)
            rows, tok = rows[keep], tok[keep]
            K, V = K.index_select(1, keep), V.index_select(1, keep)
            amask, next_pos = amask.index_select(0, keep), next_pos[keep]
            active = torch.ones(len(rows), dtype=torch.bool, device=dev)
        else:  # finished rows stay until enough have finished; their further tokens are discarded
            active = active & live
        at = P + t
        amask[..., at] = 0.0
        x = W.embed(tok[:, None])
        cos, sin = cos_t[next_pos][:, None, None], sin_t[next_pos][:, None, None]
        mask = amask[..., :at + 1]
        for i, lw in enumerate(W.layers):
            x, _, _ = _layer(x, lw, W, cos, sin, mask, cache_kv=(K[i], V[i], at))
        logits = F.linear(_rms(x[:, -1], W.norm), *W.lm)
        next_pos = next_pos + 1
    truncated = ~done
    return out_ids[:, :n_steps], out_mask[:, :n_steps], out_logp[:, :n_steps], truncated

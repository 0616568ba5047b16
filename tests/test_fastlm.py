"""The lean forward and sampler (rollout/fastlm.py) compute the transformers model's function."""

import pytest
import torch

from objbench.rollout import fastlm
from objbench.rollout.engine import HFEngine, SamplingParams, repeat_prompts
from objbench.rollout.models import build_policy
from objbench.rollout.scoring import full_inputs, score


def _qwen_gqa():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    cfg = Qwen2Config(vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg)  # q/k/v carry biases, 2 query heads per key/value head


def _batch(G=3, T=6):
    # 4 prompts of different lengths (left padded), G copies each; responses of lengths 1..T, one with a
    # sampled <pad> (id 0) inside it
    torch.manual_seed(0)
    P = 6
    lens_p = torch.tensor([6, 4, 5, 2])
    pm = torch.arange(P)[None] >= (P - lens_p)[:, None]
    pid = torch.randint(3, 20, (4, P)).masked_fill(~pm, 0)
    pid, pm = repeat_prompts(pid, pm, G)
    B = pid.shape[0]
    lens_r = torch.tensor([1, 2, 6, 3, 3, 4, 5, 6, 1, 2, 2, 6] * 2)[:B]
    rm = torch.arange(T)[None] < lens_r[:, None]
    rid = torch.randint(3, 20, (B, T)).masked_fill(~rm, 0)
    rid[4, 1] = 0  # <pad> inside a response: no gradient through its embedding lookup, as in nn.Embedding
    return pid, pm, rid, rm


@pytest.mark.parametrize("make", [lambda: build_policy("tiny", 24, seed=0), _qwen_gqa], ids=["llama", "qwen2-gqa"])
def test_logits_and_gradients_equal_the_transformers_forward(make):
    model = make()
    assert fastlm.why_unsupported(model) is None
    pid, pm, rid, rm = _batch()
    w = torch.randn(rm.shape)

    def run(forward):
        model.zero_grad(set_to_none=True)
        sc = score(model, pid, pm, rid, rm, with_logits=True, forward=forward)
        (sc.logp * w * rm).sum().backward()
        return sc, {n: p.grad.clone() for n, p in model.named_parameters()}

    a, ga = run("hf")
    b, gb = run("auto")
    assert torch.allclose(a.logits[rm], b.logits[rm], atol=1e-5)
    assert torch.allclose(a.logp[rm], b.logp[rm], atol=1e-5)
    for n in ga:
        assert torch.allclose(ga[n], gb[n], atol=1e-5), n
    # the plain full-sequence forward too (what logits_to_keep=0 returns)
    ids, attn, pos = full_inputs(pid, pm, rid, rm)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
        got = fastlm.forward(model, ids, attn, pos)
    valid = attn.bool()
    assert torch.allclose(ref[valid], got[valid], atol=1e-5)


@pytest.mark.parametrize("make", [lambda: build_policy("tiny", 24, seed=1), _qwen_gqa], ids=["llama", "qwen2-gqa"])
def test_sampler_draws_what_the_transformers_path_draws(make):
    model = make()
    pid, pm, _, _ = _batch(G=4)
    for params in (SamplingParams(9, temperature=1.0), SamplingParams(9, temperature=0.7, top_p=0.9),
                   SamplingParams(9, temperature=0.0)):
        a = HFEngine(model, forward="hf").generate(pid, pm, params, torch.Generator().manual_seed(7))
        b = HFEngine(model).generate(pid, pm, params, torch.Generator().manual_seed(7))
        assert torch.equal(a.response_ids, b.response_ids)
        assert torch.equal(a.response_mask, b.response_mask)
        assert torch.equal(a.truncated, b.truncated)
        assert torch.allclose(a.logp, b.logp, atol=1e-5)


def test_unsupported_models_say_why_and_use_transformers():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=24, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    assert "gpt2" in fastlm.why_unsupported(gpt2)
    assert "disabled" in fastlm.why_unsupported(build_policy("tiny", 24, seed=0), forward="hf")
    pid, pm, rid, rm = _batch()
    sc = score(gpt2, pid, pm, rid, rm)  # falls back to model(...)
    assert sc.logp.shape == rid.shape


@pytest.mark.parametrize("forward", ["hf", "auto"])
def test_config_switch_selects_the_forward_of_every_model_call(monkeypatch, forward):
    """model.forward=hf: one training step samples, scores the reference and the policy through the transformers
    forward only; auto: through the lean one (the spy sees it, so the check can fail)."""
    from objbench.envs.tokenizer import VOCAB_SIZE, build_char_tokenizer
    from objbench.experiments.config import build_task, load_config
    from objbench.experiments.run.loop_state import LoopState
    from objbench.experiments.run.setup import make_optimizers, make_setup
    from objbench.experiments.run.train import train_step

    cfg = load_config(None, [f"model.forward={forward}", "objective=grpo", "rollout.completions_per_step=16",
                             "train.eval_size=4"])
    s = make_setup(cfg, build_task(cfg), build_char_tokenizer(), build_policy("tiny", VOCAB_SIZE, seed=0))
    assert s.forward == forward and s.engine.forward == forward
    calls = []
    for name in ("response_logits", "generate"):
        real = getattr(fastlm, name)
        monkeypatch.setattr(fastlm, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    train_step(s, LoopState(), *make_optimizers(s))
    if forward == "hf":
        assert calls == []
    else:
        assert {"response_logits", "generate"} <= set(calls)


# ----------------------------------------------------------------------------------- the frozen-model cache
def test_frozen_cache_follows_copies_and_in_place_edits():
    # the reference model is frozen, so fastlm keeps its fused weights; a deepcopy of it edited in place (how a
    # perturbed reference is made) must not be scored with the original's fused weights
    import copy

    model = build_policy("tiny", 24, seed=0)
    model.requires_grad_(False)
    pid, pm, rid, rm = _batch()
    with torch.no_grad():
        before = score(model, pid, pm, rid, rm).logp  # fills the frozen model's fused-weight cache
        assert fastlm._weights(model) is fastlm._weights(model)  # and reuses it while nothing changes
        clone = copy.deepcopy(model)
        assert clone not in fastlm._FUSED and model in fastlm._FUSED  # a copy carries no fused weights
        g = torch.Generator().manual_seed(0)
        for p in clone.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
        fast = score(clone, pid, pm, rid, rm).logp
        hf = score(clone, pid, pm, rid, rm, forward="hf").logp
        assert (fast - hf)[rm].abs().max() < 1e-5
        assert (hf - before)[rm].abs().max() > 1e-2  # the edit matters: a stale cache would be caught

        # in place on the model itself, on a fused weight (q_proj) -- and through load_state_dict
        model.model.layers[0].self_attn.q_proj.weight.mul_(1.5)
        fast = score(model, pid, pm, rid, rm).logp
        hf = score(model, pid, pm, rid, rm, forward="hf").logp
        assert (fast - hf)[rm].abs().max() < 1e-5 and (hf - before)[rm].abs().max() > 1e-3
        model.load_state_dict(clone.state_dict())
        fast = score(model, pid, pm, rid, rm).logp
        hf = score(clone, pid, pm, rid, rm, forward="hf").logp
        assert (fast - hf)[rm].abs().max() < 1e-5


def test_tensors_are_made_on_the_models_device_and_dtype():
    # a CPU model run with the default device set to "meta": any tensor fastlm made without the model's device
    # would land on "meta" and fail or poison the result (the CPU stand-in for a CUDA model on a CPU-default host)
    model = build_policy("tiny", 24, seed=2)
    pid, pm, rid, rm = _batch()
    ids, attn, pos = full_inputs(pid, pm, rid, rm)
    params = SamplingParams(9, temperature=0.7, top_p=0.9)

    def run():
        from objbench.rollout.engine import _sample

        with torch.no_grad():
            return (fastlm.forward(model, ids, attn, pos), fastlm.response_logits(model, pid, pm, rid, rm),
                    *fastlm.generate(model, pid, pm, params, _sample, torch.Generator().manual_seed(3)))

    ref = run()
    with torch.device("meta"):
        got = run()  # trainable: fused weights built every call
        model.requires_grad_(False)
        got_frozen = run()  # frozen: the cached fused weights are built here, under "meta" too
    for outs in (got, got_frozen):
        for a, b in zip(ref, outs):
            assert b.device.type == "cpu" and torch.equal(a, b)


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-5), (torch.bfloat16, 0.1)])
def test_other_dtypes(dtype, atol):
    # the model's dtype throughout (float64 attention stays float64: a float32 softmax turned the float64
    # minimum of padded query rows into -inf and the sampler's probabilities into NaN)
    model = build_policy("tiny", 24, seed=0).to(dtype)
    pid, pm, rid, rm = _batch()
    ids, attn, pos = full_inputs(pid, pm, rid, rm)
    with torch.no_grad():
        got = fastlm.forward(model, ids, attn, pos)
        ref = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    assert got.dtype == dtype
    assert torch.allclose(got[attn.bool()].double(), ref[attn.bool()].double(), atol=atol)
    gen = HFEngine(model).generate(pid, pm, SamplingParams(6), torch.Generator().manual_seed(0))
    assert torch.isfinite(gen.logp).all() and gen.logp.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_model_matches_cpu():
    from objbench.rollout.engine import _sample

    cpu = build_policy("tiny", 24, seed=0)
    gpu = build_policy("tiny", 24, seed=0).cuda()
    pid, pm, rid, rm = _batch()
    a = fastlm.response_logits(cpu, pid, pm, rid, rm)
    b = fastlm.response_logits(gpu, pid.cuda(), pm.cuda(), rid.cuda(), rm.cuda())
    assert b.device.type == "cuda" and torch.allclose(a[rm], b.cpu()[rm], atol=1e-4)
    gpu.requires_grad_(False)
    out = fastlm.generate(gpu, pid.cuda(), pm.cuda(), SamplingParams(6, temperature=0.0), _sample, None)
    ref = fastlm.generate(cpu, pid, pm, SamplingParams(6, temperature=0.0), _sample, None)
    assert all(x.device.type == "cuda" for x in out)
    assert torch.equal(out[0].cpu(), ref[0])


def test_masked_softmax_equals_torch_softmax_with_gradients():
    # scores of 3 query rows over 5 keys; key 4 disallowed for every row, row 2 has no allowed key (a padding
    # query): torch.softmax(s + mask) on rows with an allowed key, exactly 0 on disallowed keys, zeros (not
    # NaN, not uniform) on the empty row; the gradient is softmax's on the allowed rows
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    valid = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    keep = valid.double()
    add = (keep - 1) * -torch.finfo(torch.float64).min
    p = fastlm._MaskedSoftmax.apply(s + add, keep)
    ref = torch.softmax(s[:2].masked_fill(~valid[:2], float("-inf")), -1)
    assert torch.allclose(p[:2], ref, atol=1e-15) and (p[~valid] == 0).all() and (p[2] == 0).all()
    w = torch.randn(3, 5, generator=g, dtype=torch.float64)
    (gs,) = torch.autograd.grad((p[:2] * w[:2]).sum(), s)
    (gr,) = torch.autograd.grad((ref * w[:2]).sum(), s)
    assert torch.allclose(gs, gr, atol=1e-15)
    assert torch.equal(fastlm._softmax_forward(s.detach() + add, keep), p.detach())  # the no-grad path

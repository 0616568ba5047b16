"""The lean forward (rollout/fastlm.py) on SmolLM2-135M-Instruct's architecture: 30 layers, hidden 576, 9 query
heads over 3 key/value heads (head_dim 64), rope_theta 1e5, RMSNorm eps 1e-5, tied embeddings. Randomly
initialised (the real weights are fetched by `objbench models fetch`, tests/test_fetch.py's `-m real` test); the
vocabulary is cut to 96 tokens so the test stays small (the vocabulary size changes no code path)."""

import pytest
import torch

from objbench.rollout import fastlm
from objbench.rollout.scoring import score


def smollm2_shaped():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    assert model.config.rope_parameters["rope_theta"] == 100000.0 and model.config.tie_word_embeddings
    return model


@pytest.fixture(scope="module")
def model():
    return smollm2_shaped()


def batch():
    g = torch.Generator().manual_seed(1)
    P, T = 7, 5
    lens_p, lens_r = torch.tensor([7, 3, 5, 7]), torch.tensor([5, 2, 4, 1])
    pm = torch.arange(P)[None] >= (P - lens_p)[:, None]
    pid = torch.randint(3, 96, (4, P), generator=g).masked_fill(~pm, 2)
    rm = torch.arange(T)[None] < lens_r[:, None]
    rid = torch.randint(3, 96, (4, T), generator=g).masked_fill(~rm, 2)
    return pid, pm, rid, rm


def test_smollm2_architecture_runs_the_lean_forward(model):
    assert fastlm.why_unsupported(model) is None


def test_lean_logits_equal_transformers_on_smollm2_shape(model):
    pid, pm, rid, rm = batch()
    with torch.no_grad():
        hf = score(model, pid, pm, rid, rm, forward="hf", with_logits=True)
        lean = score(model, pid, pm, rid, rm, forward="auto", with_logits=True)
    assert float((hf.logits - lean.logits)[rm].abs().max()) < 1e-4
    assert float((hf.logp - lean.logp)[rm].abs().max()) < 1e-4


@pytest.mark.slow  # ~30 s on 2 shared cores: the backward through 30 layers, twice
def test_lean_gradients_equal_transformers_on_smollm2_shape(model):
    pid, pm, rid, rm = batch()
    w = torch.randn(rm.shape, generator=torch.Generator().manual_seed(2))

    def run(forward):
        model.zero_grad(set_to_none=True)
        sc = score(model, pid, pm, rid, rm, forward=forward)
        (sc.logp * w * rm).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return sc.logp.detach(), grads

    logp_hf, g_hf = run("hf")
    logp_lean, g_lean = run("auto")
    assert float((logp_hf - logp_lean)[rm].abs().max()) < 1e-4
    assert g_hf.keys() == g_lean.keys()
    for n in g_hf:
        scale = max(1.0, float(g_hf[n].abs().max()))
        assert float((g_hf[n] - g_lean[n]).abs().max()) < 1e-4 * scale, n

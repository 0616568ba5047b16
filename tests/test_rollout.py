"""Rollout layer: sampling loop, teacher-forced scoring, critic, warm-start cache."""

import torch

from objbench.envs.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, build_char_tokenizer
from objbench.rollout.engine import HFEngine, SamplingParams, repeat_prompts
from objbench.rollout.models import ValueModel, build_policy, n_params
from objbench.rollout.scoring import score, score_values
from objbench.rollout.sft import cached_warm_start, encode_prompts


def _prompts(texts=("12+34=", "7+8=", "123+456=")):
    return encode_prompts(build_char_tokenizer(), list(texts), BOS_ID, PAD_ID)


def _policy(seed=0):
    return build_policy("tiny", VOCAB_SIZE, seed=seed)


def test_tiny_and_small_sizes():
    assert 0.1e6 < n_params(_policy()) < 0.2e6
    assert 0.9e6 < n_params(build_policy("small", VOCAB_SIZE, seed=0)) < 1.2e6


def test_same_seed_same_weights_different_seed_different():
    a, b, c = _policy(0), _policy(0), _policy(1)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_prompts_are_left_padded_with_bos():
    ids, mask = _prompts()
    assert ids.shape == mask.shape == (3, 9)  # <bos> + 8 characters of the longest prompt
    assert mask[:, -1].all() and not mask[1, 0]
    for i in range(3):
        assert ids[i][mask[i]][0] == BOS_ID
        assert (ids[i][~mask[i]] == PAD_ID).all()


def test_rollout_logp_equals_teacher_forced_logp():
    # same weights, temperature 1: the sampler's behaviour log-probs are the policy's log-probs
    model = _policy()
    ids, mask = repeat_prompts(*_prompts(), 4)
    gen = HFEngine(model).generate(ids, mask, SamplingParams(max_new_tokens=10),
                                   torch.Generator().manual_seed(0))
    with torch.no_grad():
        sc = score(model, ids, mask, gen.response_ids, gen.response_mask)
    m = gen.response_mask
    assert torch.allclose(sc.logp[m], gen.logp[m], atol=1e-5)
    assert (gen.logp[~m] == 0).all()


def test_kv_cache_generation_equals_no_cache_generation():
    model = _policy(3)
    ids, mask = repeat_prompts(*_prompts(), 3)
    p = SamplingParams(max_new_tokens=9)
    a = HFEngine(model, use_cache=True).generate(ids, mask, p, torch.Generator().manual_seed(5))
    b = HFEngine(model, use_cache=False).generate(ids, mask, p, torch.Generator().manual_seed(5))
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    assert torch.allclose(a.logp, b.logp, atol=1e-5)
    g1 = HFEngine(model).generate(ids, mask, SamplingParams(9, temperature=0.0))
    g2 = HFEngine(model, use_cache=False).generate(ids, mask, SamplingParams(9, temperature=0.0))
    assert torch.equal(g1.response_ids, g2.response_ids)


def test_generation_stops_at_eos_and_flags_truncation():
    model = _policy(1)
    ids, mask = repeat_prompts(*_prompts(), 8)
    gen = HFEngine(model).generate(ids, mask, SamplingParams(max_new_tokens=6),
                                   torch.Generator().manual_seed(0))
    # a random 25-token policy emits EOS with p ~ 1/25 per token: both outcomes occur among 24 rows
    assert gen.truncated.any() and (~gen.truncated).any()
    L = gen.response_mask.sum(-1)
    for i in range(len(L)):
        row = gen.response_ids[i]
        if gen.truncated[i]:
            assert L[i] == 6
            assert EOS_ID not in row[: L[i]].tolist()
        else:
            assert row[L[i] - 1] == EOS_ID  # EOS is the last valid token
            assert (row[L[i]:] == PAD_ID).all()
        # the mask is a prefix
        assert gen.response_mask[i, : L[i]].all() and not gen.response_mask[i, L[i]:].any()


def test_sampling_is_seeded():
    model = _policy(2)
    ids, mask = repeat_prompts(*_prompts(), 2)
    p = SamplingParams(8)
    a = HFEngine(model).generate(ids, mask, p, torch.Generator().manual_seed(11))
    b = HFEngine(model).generate(ids, mask, p, torch.Generator().manual_seed(11))
    c = HFEngine(model).generate(ids, mask, p, torch.Generator().manual_seed(12))
    assert torch.equal(a.response_ids, b.response_ids)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_top_p_keeps_only_the_nucleus():
    from objbench.rollout.engine import _sample

    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    g = torch.Generator().manual_seed(0)
    toks = {int(_sample(logits, SamplingParams(1, top_p=0.5), g)[0]) for _ in range(50)}
    assert toks == {0}  # the first token alone reaches 0.5
    toks = {int(_sample(logits, SamplingParams(1, top_p=0.8), g)[0]) for _ in range(200)}
    assert toks == {0, 1}


def test_sampler_draws_from_the_categorical_and_never_a_zero_probability_token():
    # inverse-CDF sampling: 40,000 draws of p = [0.5, 0, 0.2, 0.3] (one row repeated); the frequencies must be
    # within 5 standard errors (sqrt(p (1 - p) / n) <= 0.0025) of p, and the zero-probability token never drawn
    from objbench.rollout.engine import _sample

    p = torch.tensor([0.5, 0.0, 0.2, 0.3])
    logits = torch.log(p).expand(40_000, 4)
    tok, lp = _sample(logits, SamplingParams(1), torch.Generator().manual_seed(0))
    freq = torch.bincount(tok, minlength=4).double() / len(tok)
    assert freq[1] == 0
    assert (freq - p.double()).abs().max() < 5 * 0.0025
    assert torch.allclose(lp, torch.log(p)[tok])  # the behaviour log-prob of the drawn token
    # the last token with positive probability is reachable (u = 1 draws the top of the CDF), never one past it
    assert int(tok.max()) == 3


def test_value_model_starts_at_zero_and_has_response_shape():
    policy = _policy()
    critic = ValueModel(policy)
    ids, mask = _prompts()
    resp = torch.tensor([[3, 4, EOS_ID], [5, EOS_ID, PAD_ID], [6, 7, 8]])
    rmask = resp != PAD_ID
    v = score_values(critic, ids, mask, resp, rmask)
    assert v.shape == (3, 3) and torch.all(v == 0)
    # the critic trunk is a copy: training it leaves the policy untouched
    assert critic.backbone is not policy.base_model


def test_warm_start_cache_reuses_the_same_weights(tmp_path):
    calls = []

    def build():
        return _policy(4)

    def train(model):
        calls.append(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        return {"final_loss": 0.0}

    key = {"k": 1}
    m1, d1, _ = cached_warm_start(key, build, train, cache_dir=tmp_path)
    m2, d2, info = cached_warm_start(key, build, train, cache_dir=tmp_path)
    assert len(calls) == 1 and d1 == d2 and (d1 / "model.safetensors").is_file()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    _, d3, _ = cached_warm_start({"k": 2}, build, train, cache_dir=tmp_path)
    assert d3 != d1 and len(calls) == 2


def _sft_weights(grad_clip: float, steps: int = 6):
    from objbench.rollout.sft import sft_train

    tok = build_char_tokenizer()
    model = build_policy("tiny", VOCAB_SIZE, seed=0)

    def batch_fn(step, rng):
        a = [rng.randrange(10, 99) for _ in range(8)]
        return [f"{x}+1=" for x in a], [str(x + 1)[::-1] for x in a]

    losses = sft_train(model, tok, batch_fn, steps=steps, lr=3e-3, seed=0, grad_clip=grad_clip,
                       special={"bos": BOS_ID, "eos": EOS_ID, "pad": PAD_ID})
    return torch.cat([p.detach().flatten() for p in model.parameters()]), losses


def test_sft_grad_clip_off_and_non_binding_clip_are_bit_identical_and_a_binding_clip_changes_the_weights():
    w0, l0 = _sft_weights(0.0)
    w_big, l_big = _sft_weights(1e9)  # clip_grad_norm_ multiplies by exactly 1.0 when it does not bind
    assert torch.equal(w0, w_big) and l0 == l_big
    w_small, l_small = _sft_weights(1e-3)
    assert l_small[0] == l0[0]  # same first loss (clipping acts after it)
    assert not torch.equal(w0, w_small)


def _until_run(reached_at_check, max_steps, check_every=3, then_steps=2):
    from objbench.rollout.sft import Until, sft_train

    tok = build_char_tokenizer()
    model = build_policy("tiny", VOCAB_SIZE, seed=0)
    calls = {"clean": [], "noisy": [], "checks": 0}

    def batch(kind):
        def fn(step, rng):
            calls[kind].append(step)
            return ["1+1="] * 4, ["2"] * 4
        return fn

    def reached(policy):
        calls["checks"] += 1
        assert not policy.training  # checked in eval mode, without gradients
        assert not torch.is_grad_enabled()
        return calls["checks"] == reached_at_check, {"acc_d1": 0.5}

    u = Until(reached, check_every, max_steps, then_steps, batch("noisy"), warmup=2)
    losses = sft_train(model, tok, batch("clean"), steps=999, lr=1e-3, seed=0, until=u,
                       special={"bos": BOS_ID, "eos": EOS_ID, "pad": PAD_ID})
    return u, calls, losses


def test_competence_based_warm_start_stops_at_the_first_check_that_passes():
    u, calls, losses = _until_run(reached_at_check=2, max_steps=100)
    assert (u.done, u.clean_steps) == (True, 6)  # checks after steps 3 and 6; the second passes
    assert calls["clean"] == [0, 1, 2, 3, 4, 5] and calls["noisy"] == [6, 7]  # then 2 noisy steps
    assert len(losses) == 8 and [h["step"] for h in u.history] == [3, 6]


def test_competence_based_warm_start_gives_up_at_the_cap_and_says_so():
    u, calls, losses = _until_run(reached_at_check=-1, max_steps=7)  # never passes
    assert (u.done, u.clean_steps) == (False, 7)  # checks after 3, 6 and at the cap 7
    assert [h["step"] for h in u.history] == [3, 6, 7]
    assert len(calls["clean"]) == 7 and calls["noisy"] == [7, 8] and len(losses) == 9


def test_score_entropy_grad_switch_and_one_log_softmax():
    # entropy_grad=False: the same entropy values, detached (no loss term uses them); the returned log-probs are
    # the normalised log_softmax of the returned logits, and logp is their value at the response tokens
    policy = _policy()
    ids, mask = _prompts()
    resp = torch.tensor([[3, 4, EOS_ID], [5, EOS_ID, PAD_ID], [6, 7, 8]])
    a = score(policy, ids, mask, resp, resp != PAD_ID, with_logits=True)
    b = score(policy, ids, mask, resp, resp != PAD_ID, entropy_grad=False)
    assert a.entropy.requires_grad and not b.entropy.requires_grad
    assert torch.allclose(a.entropy, b.entropy, atol=1e-6)
    assert torch.allclose(a.log_probs, torch.log_softmax(a.logits, -1), atol=1e-6)
    assert torch.equal(a.logp, a.log_probs.gather(-1, resp[..., None]).squeeze(-1))
    assert b.log_probs is None and b.logits is None

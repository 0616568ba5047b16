"""Sampling settings a real-model run needs (rollout.top_k, rollout.stop) and the learning-rate schedule
(optim.lr_schedule, optim.warmup_steps, optim.min_lr_ratio): defaults change nothing, the new settings do what
their docs say, and a resumed run continues the schedule exactly."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from objbench.envs.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE
from objbench.experiments.config import ConfigError, build_task, load_config
from objbench.rollout.bundle import char_codec, load_hf
from objbench.rollout.engine import HFEngine, SamplingParams, _sample, repeat_prompts
from objbench.rollout.models import build_policy

FORWARDS = ("hf", "auto")  # the transformers sampling loop, and the lean one (rollout/fastlm.py)


@pytest.fixture(scope="module")
def tiny():
    """The built-in tiny Llama (random weights) and three char-tokenizer prompts, two copies each."""
    codec = char_codec()
    ids, mask = codec.encode_prompts(["12+34=", "7+5=", "100-9="])
    ids, mask = repeat_prompts(ids, mask, 2)
    return build_policy("tiny", VOCAB_SIZE, seed=0), ids, mask


def _gen(policy, ids, mask, params, forward="auto", seed=1, tokenizer=None):
    return HFEngine(policy, forward=forward, tokenizer=tokenizer).generate(ids, mask, params,
                                                                          torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------------
# defaults: nothing changes

# sampled with the code before rollout.top_k / rollout.stop existed (same model, prompts and seed)
PINNED_T1 = [[5, 14, 7, 1, 15, 9, 1, 1], [17, 6, 16, 8, 10, 0, 14, 12], [14, 10, 12, 16, 4, 4, 5, 17],
             [6, 12, 12, 19, 5, 22, 18, 5], [23, 9, 9, 13, 23, 23, 0, 18], [4, 10, 11, 16, 4, 17, 17, 8]]
PINNED_T07_P08 = [[7, 15, 8, 1, 16, 10, 2, 0], [18, 4, 17, 9, 9, 0, 16, 16], [14, 8, 11, 14, 4, 3, 4, 18],
                  [5, 8, 12, 19, 4, 23, 19, 4], [23, 11, 11, 11, 23, 23, 0, 18], [4, 8, 11, 15, 5, 15, 16, 8]]


@pytest.mark.parametrize("forward", FORWARDS)
def test_default_settings_sample_the_pinned_ids(tiny, forward):
    policy, ids, mask = tiny
    assert SamplingParams(8, 1.0, 1.0, EOS_ID, PAD_ID) == SamplingParams(8, 1.0, 1.0, EOS_ID, PAD_ID, top_k=0, stop=[])
    g = _gen(policy, ids, mask, SamplingParams(8, 1.0, 1.0, EOS_ID, PAD_ID), forward)
    assert g.response_ids.tolist() == PINNED_T1 and g.truncated.all()
    g = _gen(policy, ids, mask, SamplingParams(8, 0.7, 0.8, EOS_ID, PAD_ID), forward)
    assert g.response_ids.tolist() == PINNED_T07_P08  # row 0 ends with EOS at token 6
    assert g.truncated.tolist() == [False] + [True] * 5 and g.response_mask[0].tolist() == [True] * 7 + [False]


def test_default_config_builds_the_same_setup_and_no_schedule():
    from objbench.experiments.run.setup import make_optimizers, make_setup

    cfg = load_config(None, ["train.threads=1"])
    assert (cfg.rollout.top_k, cfg.rollout.stop, cfg.optim.lr_schedule, cfg.optim.warmup_steps,
            cfg.optim.min_lr_ratio) == (0, [], "constant", 0, 0.0)
    codec = char_codec()
    s = make_setup(cfg, build_task(cfg), codec, build_policy("tiny", VOCAB_SIZE, seed=0))
    n = s.sampling.max_new_tokens
    assert s.sampling == SamplingParams(n, 1.0, 1.0, codec.eos_id, codec.pad_id)
    assert s.eval_sampling == SamplingParams(n, 1.0, 1.0, codec.eos_id, codec.pad_id)
    assert s.greedy_sampling == SamplingParams(n, 0.0, 1.0, codec.eos_id, codec.pad_id)  # evaluate.py's greedy
    assert s.engine.tokenizer is None
    opt, _ = make_optimizers(s)
    assert s.lr_schedule is None and opt.param_groups[0]["lr"] == cfg.optim.lr
    assert "initial_lr" not in opt.param_groups[0]  # no scheduler ever touched the optimizer


def test_the_settings_reach_the_sampling_params_and_the_engine():
    from objbench.experiments.run.setup import make_setup

    cfg = load_config(None, ["rollout.top_k=5", 'rollout.stop=["+1", "9"]', "train.eval_temperature=0.5"])
    codec = char_codec()
    s = make_setup(cfg, build_task(cfg), codec, build_policy("tiny", VOCAB_SIZE, seed=0))
    for p in (s.sampling, s.eval_sampling, s.greedy_sampling):
        assert p.stop == ("+1", "9")
    assert s.sampling.top_k == s.eval_sampling.top_k == 5 and s.greedy_sampling.top_k == 0
    assert s.eval_sampling.temperature == 0.5 and s.engine.tokenizer is codec.tokenizer


# ---------------------------------------------------------------------------------------------------------
# top-k


@pytest.mark.parametrize("forward", FORWARDS)
def test_top_k_1_equals_greedy(tiny, forward):
    policy, ids, mask = tiny
    greedy = _gen(policy, ids, mask, SamplingParams(8, 0.0, 1.0, EOS_ID, PAD_ID), forward)
    top1 = _gen(policy, ids, mask, SamplingParams(8, 1.0, 1.0, EOS_ID, PAD_ID, top_k=1), forward)
    assert torch.equal(top1.response_ids, greedy.response_ids)
    assert torch.allclose(top1.logp, greedy.logp, atol=1e-6)  # at temperature 1 the log-probs agree too


P = [0.4, 0.3, 0.2, 0.1]


@pytest.mark.parametrize("top_k, top_p, kept", [
    (2, 1.0, [4 / 7, 3 / 7, 0, 0]),             # 0.4 and 0.3, renormalised over 0.7
    (3, 1.0, [4 / 9, 3 / 9, 2 / 9, 0]),
    (4, 1.0, P), (0, 1.0, P), (9, 1.0, P),      # k >= V or 0: off
    # top-k first, then top-p over the renormalised top-k: 4/9 < 0.75 <= 4/9 + 3/9 keeps two tokens; top-p
    # alone (0.4, 0.7 < 0.75 <= 0.9) would keep three
    (3, 0.75, [4 / 7, 3 / 7, 0, 0]),
    (0, 0.75, [4 / 9, 3 / 9, 2 / 9, 0]),
    (2, 0.5, [1, 0, 0, 0]),                      # 4/7 >= 0.5: the first token alone
])
def test_top_k_filters_a_hand_worked_distribution(top_k, top_p, kept):
    n = 40_000
    logits = torch.tensor(P).log().repeat(n, 1)
    tok, lp = _sample(logits, SamplingParams(4, 1.0, top_p, top_k=top_k), torch.Generator().manual_seed(0))
    freq = torch.bincount(tok, minlength=4).float() / n
    assert all(f == 0 for f, k in zip(freq.tolist(), kept) if k == 0)  # never a filtered token
    assert torch.allclose(freq, torch.tensor(kept, dtype=torch.float32), atol=0.01), freq
    # behaviour log-prob: of the untruncated distribution at the temperature (the top-p convention)
    assert torch.allclose(lp, torch.tensor(P).log()[tok], atol=1e-6)


def test_top_k_keeps_ties_and_scales_with_the_temperature():
    logits = torch.tensor([[2.0, 2.0, 2.0, 0.0]]).repeat(30_000, 1)
    tok, lp = _sample(logits, SamplingParams(4, 0.5, top_k=2), torch.Generator().manual_seed(0))
    freq = torch.bincount(tok, minlength=4).float() / len(tok)
    assert freq[3] == 0 and torch.allclose(freq[:3], torch.full((3,), 1 / 3), atol=0.01)  # three tied at the 2nd
    full = torch.log_softmax(logits[0] / 0.5, -1)
    assert torch.allclose(lp, full[tok])


# ---------------------------------------------------------------------------------------------------------
# stop strings


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A real Hugging Face folder (Qwen2, byte-level BPE trained in memory), loaded as a run loads it."""
    from objbench.rollout.toy_hf import write_toy_model

    policy, codec = load_hf(str(write_toy_model(tmp_path_factory.mktemp("models") / "toy")))
    ids, mask = codec.encode_prompts(["12+34=", "Tom has 5 apples and gets 7 more."])
    ids, mask = repeat_prompts(ids, mask, 3)
    return policy, codec, ids, mask


def _first_hit(tokenizer, row: list[int], stop: str) -> int | None:
    """The index of the first token whose decoding (of the whole response so far) contains ``stop``."""
    for j in range(len(row)):
        if stop in tokenizer.decode(row[:j + 1], skip_special_tokens=False, clean_up_tokenization_spaces=False):
            return j
    return None


def _stop_string(tokenizer, row: list[int]) -> str:
    """Two consecutive tokens of the row (from the 3rd on) that decode to printable ASCII: a stop string that
    spans a token boundary."""
    for j in range(2, len(row) - 1):
        text = tokenizer.decode(row[j:j + 2])
        if text.isascii() and text.isprintable() and len(text.strip()) >= 2:
            return text
    raise AssertionError(f"no ASCII token pair in {row}")


@pytest.mark.parametrize("forward", FORWARDS)
def test_a_stop_string_ends_the_row_at_the_token_that_completes_it(toy, forward):
    from objbench.rollout import fastlm

    policy, codec, ids, mask = toy
    assert fastlm.supports(policy, forward) == (forward == "auto")
    tok = codec.tokenizer
    free = SamplingParams(20, 1.0, 1.0, codec.eos_id, codec.pad_id)
    base = _gen(policy, ids, mask, free, forward, seed=3)
    rows = [r[m].tolist() for r, m in zip(base.response_ids, base.response_mask)]
    stop = _stop_string(tok, rows[0])
    g = _gen(policy, ids, mask, SamplingParams(20, 1.0, 1.0, codec.eos_id, codec.pad_id, stop=[stop]), forward,
             seed=3, tokenizer=tok)
    stopped = 0
    for i, row in enumerate(rows):
        j = _first_hit(tok, row, stop)
        n = len(row) if j is None else j + 1
        assert g.response_mask[i].tolist()[:n] == [True] * n and not g.response_mask[i, n:].any()  # nothing after
        assert g.response_ids[i, :n].tolist() == row[:n], i  # the same draws up to there; the stop token kept
        assert (g.response_ids[i, n:] == codec.pad_id).all()
        assert torch.allclose(g.logp[i, :n], base.logp[i, :n], atol=1e-6)
        assert bool(g.truncated[i]) == (bool(base.truncated[i]) if j is None else False)  # finished, not truncated
        stopped += j is not None
    assert _first_hit(tok, rows[0], stop) is not None and stopped >= 1


def test_stop_strings_need_a_tokenizer_and_valid_values(tiny):
    policy, ids, mask = tiny
    with pytest.raises(ValueError, match="need the tokenizer"):
        _gen(policy, ids, mask, SamplingParams(4, stop=["="]))
    for bad, msg in [({"stop": "abc"}, "list of strings"), ({"stop": ["a", ""]}, "non-empty"),
                     ({"top_k": -1}, "top_k must be"), ({"top_k": 1.5}, "top_k must be")]:
        with pytest.raises(ValueError, match=msg):
            SamplingParams(4, **bad)


def test_a_stop_string_with_the_char_tokenizer(tiny):
    """The lean sampler with the character tokenizer: every row stops at its first '1' (or runs on)."""
    policy, ids, mask = tiny
    codec = char_codec()
    free = _gen(policy, ids, mask, SamplingParams(8, 1.0, 1.0, EOS_ID, PAD_ID))
    g = _gen(policy, ids, mask, SamplingParams(8, 1.0, 1.0, EOS_ID, PAD_ID, stop=["1"]), tokenizer=codec.tokenizer)
    one = codec.tokenizer.convert_tokens_to_ids("1")
    assert any(one in row for row in free.response_ids.tolist())  # the check is not vacuous
    for i, row in enumerate(free.response_ids.tolist()):
        n = row.index(one) + 1 if one in row else len(row)
        assert g.response_ids[i, :n].tolist() == row[:n] and int(g.response_mask[i].sum()) == n
        assert bool(g.truncated[i]) == (one not in row)


# ---------------------------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize("bad, msg", [
    ("rollout.top_k=-1", "rollout.top_k must be an int >= 0"),
    ('rollout.stop=["x", ""]', "rollout.stop must be a list of non-empty strings"),
    ("optim.lr_schedule=step", "optim.lr_schedule='step' is not valid"),
    ("optim.warmup_steps=-2", "optim.warmup_steps must be an int >= 0"),
    ("optim.min_lr_ratio=1.5", r"optim.min_lr_ratio must be in \[0, 1\]"),
    ("optim.min_lr_ratio=0.1", "read by optim.lr_schedule=cosine or linear only"),
])
def test_bad_settings_are_refused_at_load(bad, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(None, [bad])


def test_a_warm_up_longer_than_the_run_is_refused():
    from objbench.experiments.run.setup import make_lr_schedule

    cfg = load_config(None, ["train.steps=3", "objective.n_minibatches=2", "optim.warmup_steps=7"])
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ConfigError, match="warmup_steps=7 is more than the run's 6 optimizer steps"):
        make_lr_schedule(opt, cfg)


# ---------------------------------------------------------------------------------------------------------
# learning-rate schedule


def _lrs(cfg, n: int) -> list[float]:
    """The learning rate of each of n optimizer updates under make_lr_schedule (stepped after each update)."""
    from objbench.experiments.run.setup import make_lr_schedule

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim.lr)
    sched = make_lr_schedule(opt, cfg)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_optimizer_steps_are_rl_steps_times_epochs_times_minibatches():
    from objbench.experiments.run.setup import optimizer_steps

    assert optimizer_steps(load_config(None, ["train.steps=5", "objective.n_minibatches=2"])) == 10
    assert optimizer_steps(load_config(None, ["train.steps=5", "objective.n_epochs=2"])) == 10
    assert optimizer_steps(load_config(None, ["train.steps=5", "objective.n_epochs=2",
                                              "objective.n_minibatches=2"])) == 20


# 5 RL steps x 2 minibatches = 10 optimizer updates, numbered 0..9; lr = 2.0 so the values read as factors x 2
RUN = ["train.steps=5", "objective.n_minibatches=2", "optim.lr=2.0"]


@pytest.mark.parametrize("settings, expect", [
    # constant with a 4-step warm-up: 0/4, 1/4, 2/4, 3/4, then 1
    (["optim.warmup_steps=4"], {0: 0.0, 1: 0.5, 3: 1.5, 4: 2.0, 9: 2.0, 11: 2.0}),
    # cosine, warm-up 2, floor 0.1: updates 0, 1 warm up (0, 1/2); from 2 on p = (u - 2) / 8,
    # factor 0.1 + 0.9 (1 + cos(pi p)) / 2: u=2: 1; u=3: 0.1 + 0.45 (1 + cos(pi/8)) = 0.1 + 0.45 * 1.9238795
    # = 0.96574578; u=6: p=1/2: 0.55; u=9: p=7/8: 0.1 + 0.45 (1 - 0.9238795) = 0.13425422; from u=10: 0.1
    (["optim.lr_schedule=cosine", "optim.warmup_steps=2", "optim.min_lr_ratio=0.1"],
     {0: 0.0, 1: 1.0, 2: 2.0, 3: 1.93149156, 6: 1.1, 9: 0.26850844, 10: 0.2, 12: 0.2}),
    # linear, warm-up 2, floor 0: from 2 on 1 - (u - 2) / 8: u=6: 0.5, u=9: 0.125, u=10: 0
    (["optim.lr_schedule=linear", "optim.warmup_steps=2"], {0: 0.0, 1: 1.0, 2: 2.0, 6: 1.0, 9: 0.25, 10: 0.0}),
    # linear, no warm-up, floor 0.2: 0.2 + 0.8 (1 - u / 10): u=0: 1, u=5: 0.6, u=9: 0.28, u=10: 0.2
    (["optim.lr_schedule=linear", "optim.min_lr_ratio=0.2"], {0: 2.0, 5: 1.2, 9: 0.56, 10: 0.4, 11: 0.4}),
    # cosine without warm-up or floor: (1 + cos(pi u / 10)) / 2: u=5: 0.5
    (["optim.lr_schedule=cosine"], {0: 2.0, 5: 1.0, 10: 0.0}),
])
def test_learning_rates_at_chosen_updates_worked_out_by_hand(settings, expect):
    lrs = _lrs(load_config(None, RUN + settings), 13)
    for u, lr in expect.items():
        assert lrs[u] == pytest.approx(lr, abs=1e-7), (u, lrs)


def test_checkpoint_restores_the_schedule(tmp_path):
    """Stop after 4 of 10 updates, save, build everything afresh, load, go on: the same learning rates as
    without the interruption (and the default run writes no schedule file)."""
    from objbench.experiments.run.checkpoint import load_checkpoint, save_checkpoint
    from objbench.experiments.run.loop_state import LoopState
    from objbench.experiments.run.setup import make_lr_schedule

    cfg = load_config(None, RUN + ["optim.lr_schedule=cosine", "optim.warmup_steps=3", "optim.min_lr_ratio=0.1"])
    whole = _lrs(cfg, 10)

    def fresh():
        policy = build_policy("tiny", VOCAB_SIZE, seed=0)
        opt = torch.optim.AdamW(policy.parameters(), lr=cfg.optim.lr)
        s = SimpleNamespace(policy=policy, critic=None, history=None, device=torch.device("cpu"),
                            lr_schedule=make_lr_schedule(opt, cfg))
        return s, opt

    def update(s, opt, lrs):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        s.lr_schedule.step()

    s, opt = fresh()
    lrs: list[float] = []
    for _ in range(4):
        update(s, opt, lrs)
    save_checkpoint(tmp_path, s, opt, None, LoopState(step=2))
    assert (tmp_path / "checkpoints" / "last" / "lr_schedule.pt").is_file()
    s, opt = fresh()
    assert opt.param_groups[0]["lr"] == 0.0  # a new schedule starts at the first update's rate...
    assert load_checkpoint(tmp_path, s, opt, None).step == 2
    for _ in range(6):
        update(s, opt, lrs)  # ...the loaded one where the saved one stood
    assert lrs == whole and not math.isclose(lrs[4], lrs[5])

    s.lr_schedule = None  # the default run: no schedule, no file
    save_checkpoint(tmp_path, s, opt, None, LoopState(step=3))
    assert not (tmp_path / "checkpoints" / "last" / "lr_schedule.pt").exists()


FAST = ["sft.steps=30", "train.steps=4", "rollout.completions_per_step=16", "train.eval_size=4",
        "train.eval_samples=2", "train.eval_every=2", "train.checkpoint_every=2", "train.threads=1",
        "objective.n_minibatches=2", "optim.lr_schedule=cosine", "optim.warmup_steps=2", "optim.min_lr_ratio=0.1"]


def test_a_run_killed_mid_schedule_resumes_it_exactly(tmp_path, tmp_path_factory, monkeypatch):
    """train() with a schedule, interrupted after the step-2 checkpoint and resumed, equals an uninterrupted run,
    and its schedule has taken all 8 updates (needs experiments/train.py to step ``s.lr_schedule`` after
    ``opt.step()``)."""
    import objbench.experiments.run.train as T
    from objbench.experiments.run.metrics import undocumented
    from objbench.experiments.run.setup import lr_factor

    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    cfg = load_config(None, FAST + [f"out_dir={tmp_path}", "name=r"])
    real_update = T.update

    def crash_at_3(s, b, opt, critic_opt, step):
        if step == 3:
            raise KeyboardInterrupt  # after the step-2 checkpoint
        return real_update(s, b, opt, critic_opt, step)

    monkeypatch.setattr(T, "update", crash_at_3)
    with pytest.raises(KeyboardInterrupt):
        T.train(cfg, progress=False)
    monkeypatch.setattr(T, "update", real_update)
    run = T.train(cfg, progress=False)
    ref = T.train(load_config(None, FAST + [f"out_dir={tmp_path}", "name=ref"]), progress=False)

    def rows(folder):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(T.NONDETERMINISTIC_KEYS)}
                for line in open(folder / "metrics.jsonl")]

    assert rows(run) == rows(ref) and [r["step"] for r in rows(run)] == [1, 2, 3, 4]
    assert undocumented({k for r in rows(run) for k in r}) == []
    if "optim/lr" in rows(run)[0]:  # the learning rate of the step's two updates (their mean, or either one)
        o = cfg.optim
        for i, r in enumerate(rows(run)):
            a, b = sorted(o.lr * lr_factor(u, o, 8) for u in (2 * i, 2 * i + 1))
            assert a - 1e-12 <= r["optim/lr"] <= b + 1e-12, (r["step"], r["optim/lr"], a, b)
    for folder in (run, ref):
        last = folder / "checkpoints" / "last"
        state = torch.load(last / "lr_schedule.pt", weights_only=True)
        assert state["last_epoch"] == 8, "the schedule did not step once per optimizer update"
        lr = torch.load(last / "optimizer.pt", weights_only=True)["param_groups"][0]["lr"]
        assert lr == pytest.approx(cfg.optim.lr * 0.1)  # the floor, after the last update


# ---------------------------------------------------------------------------------------------------------
# the vLLM engine's side, without vLLM: the requests it builds and how it reads a stop


def _fake_vllm(monkeypatch, completions):
    """A stand-in ``vllm`` module: records the SamplingParams the engine builds; every request answers with
    ``completions(sp)``, a list of (tokens, stop_reason)."""
    import sys

    made = []

    def sampling_params(**kw):
        made.append(kw)
        return SimpleNamespace(**kw)

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=sampling_params))
    monkeypatch.setitem(sys.modules, "vllm.inputs", SimpleNamespace(TokensPrompt=lambda **kw: kw))

    def generate(prompts, sps, use_tqdm=False):
        return [SimpleNamespace(outputs=[
            SimpleNamespace(index=i, token_ids=t, stop_reason=why, logprobs=[{x: SimpleNamespace(logprob=-1.0)}
                                                                             for x in t])
            for i, (t, why) in enumerate(completions(sp))]) for sp in sps]

    return made, SimpleNamespace(generate=generate)


def _vllm_engine(llm, has_tokenizer: bool):
    from objbench.rollout.vllm_engine import VLLMEngine

    eng = VLLMEngine.__new__(VLLMEngine)  # no vLLM start-up: the fields generate() reads
    eng.llm, eng.has_tokenizer, eng.max_model_len, eng.sleep_mode, eng._asleep, eng.dtype = (
        llm, has_tokenizer, 64, False, set(), "float32")
    return eng


def test_vllm_requests_carry_top_k_and_stop_only_when_set(monkeypatch):
    made, llm = _fake_vllm(monkeypatch, lambda sp: [([4, 5], None)] * sp.n)
    ids, mask = torch.tensor([[1, 3], [1, 3]]), torch.ones(2, 2, dtype=torch.bool)
    _vllm_engine(llm, False).generate(ids, mask, SamplingParams(4, 1.0, 0.9, EOS_ID, PAD_ID))
    assert made[-1] == dict(n=2, temperature=1.0, top_p=0.9, max_tokens=4, logprobs=0, stop_token_ids=[EOS_ID],
                            seed=None, detokenize=False, skip_special_tokens=False)  # the request as before
    with pytest.raises(ValueError, match="need the tokenizer"):
        _vllm_engine(llm, False).generate(ids, mask, SamplingParams(4, stop=["</a>"]))
    _vllm_engine(llm, True).generate(ids, mask, SamplingParams(4, 1.0, 1.0, EOS_ID, PAD_ID, top_k=7, stop=["</a>"]))
    assert made[-1]["top_k"] == 7 and made[-1]["stop"] == ["</a>"] and made[-1]["include_stop_str_in_output"]
    assert made[-1]["detokenize"] is True


def test_vllm_rows_ended_by_a_stop_string_are_not_truncated(monkeypatch):
    # row 0 stopped by a string, row 1 by EOS, row 2 ran out of tokens
    answers = iter([[([4, 5], "</a>"), ([4, EOS_ID], EOS_ID), ([4, 4, 4, 4], None)]])
    _, llm = _fake_vllm(monkeypatch, lambda sp: next(answers))
    ids, mask = torch.tensor([[1, 3]] * 3), torch.ones(3, 2, dtype=torch.bool)
    g = _vllm_engine(llm, True).generate(ids, mask, SamplingParams(4, 1.0, 1.0, EOS_ID, PAD_ID, stop=["</a>"]))
    assert g.truncated.tolist() == [False, False, True]
    assert g.response_mask.sum(-1).tolist() == [2, 2, 4]

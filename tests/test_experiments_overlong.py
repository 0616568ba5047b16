"""DAPO's soft overlong punishment inside the collection step: the reward each response gets, worked out by hand
from its length, and the metrics that say how much the shaping acted (filters/overlong_frac, .../overlong_penalty)."""

import json

import pytest
import torch

from objbench.experiments.cli.main import main
from objbench.experiments.run.metrics import undocumented


def _collect_fixed_lengths(*overrides):
    """One collect() of 2 prompts x G = 8 whose responses are fixed (the engine returns them) at
    rollout.max_new_tokens = 6. Response lengths |y| (EOS included): 2, 4, 5, 6 and 6 truncated (no EOS), then
    three of length 2; the second group the same. Returns (rewards of the training batch, metrics)."""
    from objbench.envs.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE, build_char_tokenizer
    from objbench.experiments.run.collect import collect
    from objbench.experiments.config import build_task, load_config
    from objbench.experiments.run.loop_state import LoopState
    from objbench.experiments.run.setup import make_setup
    from objbench.rollout.engine import Generation
    from objbench.rollout.models import build_policy

    cfg = load_config(None, ["objective=grpo", "rollout.completions_per_step=16", "rollout.max_new_tokens=6",
                             *overrides])
    task, tok = build_task(cfg), build_char_tokenizer()
    s = make_setup(cfg, task, tok, build_policy("tiny", VOCAB_SIZE, seed=0))
    texts = ["1", "123", "1234", "12345", "123456", "1", "1", "1"] * 2
    truncated = [t == "123456" for t in texts]
    rows = [tok.encode(t, add_special_tokens=False) + ([] if tr else [EOS_ID]) for t, tr in zip(texts, truncated)]
    assert [len(r) for r in rows[:8]] == [2, 4, 5, 6, 6, 2, 2, 2]
    ids = torch.tensor([r + [PAD_ID] * (6 - len(r)) for r in rows])
    mask = torch.tensor([[True] * len(r) + [False] * (6 - len(r)) for r in rows])

    class FixedEngine:
        def generate(self, prompt_ids, prompt_mask, params, generator=None):
            return Generation(ids, mask, torch.zeros(ids.shape), torch.tensor(truncated))

    s.engine = FixedEngine()
    train_b, _, m = collect(s, 1, LoopState())
    return train_b.rewards, m


def test_overlong_penalty_by_hand_and_how_much_it_acted():
    base, m0 = _collect_fixed_lengths()
    assert "filters/overlong_frac" not in m0  # no shaping, no metric
    shaped, m = _collect_fixed_lengths("objective.filters.overlong_penalty=true",
                                       "objective.filters.overlong_cache=2")
    # L_max = 6, L_cache = 2, L_exp = 4: |y| <= 4 -> 0; 5 -> (4 - 5) / 2 = -0.5; 6 (with or without EOS) -> -1
    per_group = [0.0, 0.0, -0.5, -1.0, -1.0, 0.0, 0.0, 0.0]
    assert (shaped - base).tolist() == pytest.approx(per_group * 2, abs=1e-7)
    assert m["filters/overlong_frac"] == 3 / 8  # 3 of every 8 responses fall in the soft zone or beyond
    assert m["filters/overlong_penalty"] == pytest.approx(-2.5 / 8)
    # factor 0.5 halves the penalty; the share penalised stays
    half, m = _collect_fixed_lengths("objective.filters.overlong_penalty=true", "objective.filters.overlong_cache=2",
                                     "objective.filters.overlong_factor=0.5")
    assert (half - base).tolist() == pytest.approx([p / 2 for p in per_group] * 2, abs=1e-7)
    assert m["filters/overlong_frac"] == 3 / 8 and m["filters/overlong_penalty"] == pytest.approx(-1.25 / 8)


def test_dapo_run_logs_how_much_the_overlong_shaping_acted(tmp_path, monkeypatch):
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    # a 4-token budget with a 3-token cache: every response longer than 1 token is penalised
    args = ["train", "--quiet", "objective=dapo", "sft.steps=20", "train.steps=2", "rollout.completions_per_step=16",
            "rollout.max_new_tokens=4", "objective.filters.overlong_cache=3", "objective.filters.max_rounds=2",
            "train.eval_size=6", "train.eval_samples=2", "train.threads=1", f"out_dir={tmp_path}", "name=dapo"]
    assert main(args) == 0
    rows = [json.loads(line) for line in open(tmp_path / "dapo" / "metrics.jsonl")]
    assert undocumented({k for r in rows for k in r}) == []
    for r in rows:
        assert 0 < r["filters/overlong_frac"] <= 1 and -1 <= r["filters/overlong_penalty"] < 0
        # a binary task reward: the shaped mean is the accuracy plus the mean penalty
        assert r["reward/mean"] == pytest.approx(r["reward/acc"] + r["filters/overlong_penalty"], abs=1e-6)

"""Seed 003's directions end to end: one short `objbench train` per component trains and logs its keys (all of
them documented in experiments/metrics.py)."""

import json
import math

import pytest

from objbench.experiments.cli.main import main
from objbench.experiments.run.metrics import undocumented

# format_reward 0.5: well-formed wrong answers earn 0.5, so groups are not all-equal even this early
FAST = ["sft.steps=20", "train.steps=3", "rollout.completions_per_step=16", "train.eval_size=6",
        "train.eval_samples=2", "train.threads=1", "task.format_reward=0.5"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _run(tmp_path, name, *overrides):
    assert main(["train", "--quiet", *FAST, f"out_dir={tmp_path}", f"name={name}", *overrides]) == 0
    rows = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
    evals = [json.loads(line) for line in open(tmp_path / name / "eval.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert undocumented({k for r in rows + evals for k in r}) == []
    assert any(r.get("optim/grad_norm", 0) > 0 for r in rows)  # it trained: some update had a gradient
    return rows


def test_schedules_of_objective_fields_and_temperature(tmp_path):
    rows = _run(tmp_path, "sched", "objective.schedules.ratio.eps_high.kind=linear",
                "objective.schedules.ratio.eps_high.end=0.05", "objective.schedules.kl.beta.kind=step",
                "objective.schedules.kl.beta.at=[0.5]", "objective.schedules.kl.beta.values=[0.01]",
                "rollout.temperature=1.2", "rollout.temperature_schedule.kind=cosine",
                "rollout.temperature_schedule.end=0.7")
    # 3 steps: progress 0, 0.5, 1. eps_high 0.2 -> 0.125 -> 0.05; beta 0.04, then 0.01 from progress 0.5;
    # cosine temperature 1.2 -> (1.2 + 0.7) / 2 = 0.95 -> 0.7
    assert [r["sched/ratio.eps_high"] for r in rows] == pytest.approx([0.2, 0.125, 0.05])
    assert [r["sched/kl.beta"] for r in rows] == pytest.approx([0.04, 0.01, 0.01])
    assert [r["sched/rollout.temperature"] for r in rows] == pytest.approx([1.2, 0.95, 0.7])


def test_eval_temperature_stays_fixed_while_training_temperature_moves(tmp_path):
    """train.eval_temperature: held-out sampling at 1.0 while training samples 1.2 -> 0.7, so a temperature arm is
    evaluated like its baseline; unset, held-out sampling uses rollout.temperature; <= 0 is refused at load."""
    from objbench.experiments.config import ConfigError, load_config
    from objbench.experiments.run.setup import build_setup

    over = [*FAST, f"out_dir={tmp_path}", "rollout.temperature=1.2", "rollout.temperature_schedule.kind=linear",
            "rollout.temperature_schedule.end=0.7"]
    s = build_setup(load_config(None, [*over, "train.eval_temperature=1.0"]), tmp_path / "cache")
    assert (s.sampling.temperature, s.eval_sampling.temperature) == (1.2, 1.0)
    s = build_setup(load_config(None, over), tmp_path / "cache")
    assert (s.sampling.temperature, s.eval_sampling.temperature) == (1.2, 1.2)
    with pytest.raises(ConfigError, match="train.eval_temperature"):
        load_config(None, [*over, "train.eval_temperature=0"])


def test_entropy_driven_temperature(tmp_path, monkeypatch):
    # The loop's calls of the controller (algos.schedules.controlled_temperature) are wrapped: the entropy the
    # loop passes is recorded, and a hand-chosen entropy goes on in its place, so every temperature is a number
    # worked out by hand. T_{t+1} = clamp(T_t + gain (target - H_t), low, high), gain 0.2, target 1.5, [0.7, 1.2]:
    #   T_1 = 1.2 (rollout.temperature)
    #   H_1 = 2.0:  T_2 = 1.2 + 0.2 * (1.5 - 2.0) = 1.1
    #   H_2 = 1.25: T_3 = 1.1 + 0.2 * (1.5 - 1.25) = 1.15
    #   H_3 = 4.5:  T_4 = 1.15 + 0.2 * (1.5 - 4.5) = 0.55 -> clamped to 0.7 (no step 4: kept for a resumed run)
    from objbench.algos import schedules as SCH

    real, hand, passed = SCH.controlled_temperature, [2.0, 1.25, 4.5], []

    def fed_by_hand(temperature, entropy, ctl):
        passed.append(entropy)
        return real(temperature, hand[len(passed) - 1], ctl)

    monkeypatch.setattr(SCH, "controlled_temperature", fed_by_hand)
    rows = _run(tmp_path, "ent", "rollout.temperature=1.2", "rollout.temperature_control.target=1.5",
                "rollout.temperature_control.gain=0.2")
    assert [r["sched/rollout.temperature"] for r in rows] == pytest.approx([1.2, 1.1, 1.15], abs=1e-12)
    assert passed == [r["policy/entropy"] for r in rows]  # the loop controls with each step's logged entropy
    state = json.loads((tmp_path / "ent" / "checkpoints" / "last" / "state.json").read_text())
    assert state["temperature"] == pytest.approx(0.7, abs=1e-12)  # a resumed run continues the controlled temperature
    # the clamp at the top and a step without an entropy (NaN: no update ran), by hand
    ctl = SCH.TemperatureControl(target=1.5, gain=0.2)
    assert real(1.15, 0.25, ctl) == 1.2  # 1.15 + 0.2 * 1.25 = 1.4 -> 1.2
    assert real(0.9, float("nan"), ctl) == 0.9


def test_adaptive_group_size_by_difficulty(tmp_path):
    # levels 1 -> G = 3, 2 and 3 -> G = 5 at a budget of 16 completions (not a multiple of either)
    rows = _run(tmp_path, "by_d", "objective.groups.rule=difficulty", "objective.groups.thresholds=[2]",
                "objective.groups.sizes=[3,5]")
    for r in rows:
        assert r["rollout/completions"] == 16  # the fixed budget
        sizes = {k: v for k, v in r.items() if k.startswith("groups/size_d")}
        assert sizes and all(v <= (3 if k == "groups/size_d1" else 5) + 1 for k, v in sizes.items())
        assert any(k.startswith("adv/group_weight_g") for k in r) and r["groups/prompts"] >= 16 // 5


def test_adaptive_group_size_by_running_pass_rate_with_dynamic_sampling(tmp_path):
    rows = _run(tmp_path, "by_p", "objective=dapo", "objective.groups.rule=pass_rate",
                "objective.groups.thresholds=[0.5]", "objective.groups.sizes=[6,4]", "objective.groups.ema=0.5",
                "objective.filters.max_rounds=3")
    assert not any(k.startswith("groups/pass_rate_d") for k in rows[0])  # nothing observed before step 1
    assert all(any(k.startswith("groups/pass_rate_d") for k in r) for r in rows[1:])
    for r in rows:
        assert r["rollout/completions"] == 16 * r["rollout/rounds"] and "rollout/zero_var_frac" in r
    for r in rows[1:]:  # every rate is a running average of shares: in [0, 1]
        assert all(0 <= v <= 1 for k, v in r.items() if k.startswith("groups/pass_rate_d"))


def test_hybrid_advantage_builds_and_trains_a_critic(tmp_path):
    rows = _run(tmp_path, "hyb", "objective.adv.estimator=hybrid", "objective.adv.alpha=0.8",
                "objective.schedules.adv.alpha.kind=linear", "objective.schedules.adv.alpha.end=0.2")
    assert all("value/loss" in r and math.isfinite(r["value/loss"]) for r in rows)
    assert [r["sched/adv.alpha"] for r in rows] == pytest.approx([0.8, 0.5, 0.2])
    assert (tmp_path / "hyb" / "checkpoints" / "last" / "critic.safetensors").exists()


def test_group_selection_keeps_the_top_of_each_group(tmp_path):
    rows = _run(tmp_path, "top", "objective.filters.top_select=true", "objective.filters.top_fraction=0.3")
    # G = 8: ceil(0.3 * 8) = 3 of every 8 responses stay in the loss
    assert all(r["filters/top_kept_frac"] == 3 / 8 for r in rows)


def test_group_reward_correction_on_malformed_groups(tmp_path):
    rows = _run(tmp_path, "corr", "objective.filters.group_correction=true",
                "objective.filters.correction_share=0.0", "objective.filters.correction_factor=0.8")
    for r in rows:
        # share 0: every group with at least one malformed response is corrected
        assert 0 <= r["filters/corrected_frac"] <= 1 and 0 <= r["filters/malformed_frac"] <= 1
        assert (r["filters/corrected_frac"] > 0) == (r["filters/malformed_frac"] > 0)


def _collect_fixed_responses(share, factor=0.8):
    """One collect() of 2 prompts x G = 8 whose responses are fixed (the engine returns them), with
    task.format_reward 0.5, so every reward is known by hand: the answer 1.0, another number 0.5, garbage 0
    (malformed). Group 1: 2 garbage, 3 answers, 3 other numbers; group 2: 1 garbage, 3 answers, 4 other numbers.
    Returns (training batch, metrics)."""
    import torch

    from objbench.envs.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE, build_char_tokenizer
    from objbench.experiments.run.collect import collect
    from objbench.experiments.config import build_task, load_config
    from objbench.experiments.run.loop_state import LoopState
    from objbench.experiments.run.setup import make_setup
    from objbench.rollout.engine import Generation
    from objbench.rollout.models import build_policy

    cfg = load_config(None, ["objective=grpo", "rollout.completions_per_step=16", "task.format_reward=0.5",
                             "objective.filters.group_correction=true", f"objective.filters.correction_share={share}",
                             f"objective.filters.correction_factor={factor}"])
    assert cfg.objective.group_size == 8 and cfg.prompts_per_step == 2
    task, tok = build_task(cfg), build_char_tokenizer()
    s = make_setup(cfg, task, tok, build_policy("tiny", VOCAB_SIZE, seed=0))
    p1, p2 = s.prompts.take(0, 2)  # the prompts the step samples

    def other(p):  # a well-formed wrong answer
        return str(int(p.answer) + 1)

    texts = (["==", "=="] + [p1.answer] * 3 + [other(p1)] * 3
             + ["=="] + [p2.answer] * 3 + [other(p2)] * 4)
    rows = [tok.encode(t, add_special_tokens=False) + [EOS_ID] for t in texts]
    T = max(map(len, rows))
    ids = torch.tensor([r + [PAD_ID] * (T - len(r)) for r in rows])
    mask = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in rows])

    class FixedEngine:
        def generate(self, prompt_ids, prompt_mask, params, generator=None):
            assert prompt_ids.shape[0] == 16
            return Generation(ids, mask, torch.zeros(ids.shape), torch.zeros(16, dtype=torch.bool))

    s.engine = FixedEngine()
    train_b, _, m = collect(s, 1, LoopState())
    assert [p.uid for p in train_b.problems] == [p1.uid] * 8 + [p2.uid] * 8
    assert train_b.texts == texts and train_b.malformed.tolist() == [t == "==" for t in texts]
    return train_b, m


def test_group_reward_correction_multiplies_a_malformed_groups_rewards_by_the_factor():
    # correction_share 0.2: group 1's malformed share 2/8 = 0.25 exceeds it, group 2's 1/8 = 0.125 does not.
    # Group 1's rewards times 0.8: answers 1.0 -> 0.8, other numbers 0.5 -> 0.4, garbage 0 -> 0; group 2 as is
    b, m = _collect_fixed_responses(share=0.2)
    assert b.rewards.tolist() == pytest.approx([0.0, 0.0, 0.8, 0.8, 0.8, 0.4, 0.4, 0.4,
                                                0.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5], rel=1e-6, abs=0.0)
    assert m["filters/corrected_frac"] == 0.5 and m["filters/malformed_frac"] == 3 / 16
    # factor 0.5: the same group, halved
    b, _ = _collect_fixed_responses(share=0.2, factor=0.5)
    assert b.rewards.tolist()[:8] == [0.0, 0.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25]
    # correction_share 0.25: group 1's share 0.25 does not exceed it (the rule is share > correction_share)
    b, m = _collect_fixed_responses(share=0.25)
    assert b.rewards.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]
    assert m["filters/corrected_frac"] == 0.0

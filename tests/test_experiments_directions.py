"""Seed 003's directions end to end: one short `objbench train` per component trains and logs its keys (all of
them documented in experiments/metrics.py)."""

import json
import math

import pytest

from objbench.experiments.cli import main
from objbench.experiments.metrics import undocumented

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
    from objbench.experiments.train import build_setup

    over = [*FAST, f"out_dir={tmp_path}", "rollout.temperature=1.2", "rollout.temperature_schedule.kind=linear",
            "rollout.temperature_schedule.end=0.7"]
    s = build_setup(load_config(None, [*over, "train.eval_temperature=1.0"]), tmp_path / "cache")
    assert (s.sampling.temperature, s.eval_sampling.temperature) == (1.2, 1.0)
    s = build_setup(load_config(None, over), tmp_path / "cache")
    assert (s.sampling.temperature, s.eval_sampling.temperature) == (1.2, 1.2)
    with pytest.raises(ConfigError, match="train.eval_temperature"):
        load_config(None, [*over, "train.eval_temperature=0"])


def test_entropy_driven_temperature(tmp_path):
    rows = _run(tmp_path, "ent", "rollout.temperature=1.2", "rollout.temperature_control.target=1.5",
                "rollout.temperature_control.gain=0.2")
    # T_1 = 1.2; T_{t+1} = clamp(T_t + 0.2 (1.5 - H_t), 0.7, 1.2) with H_t the logged policy entropy of step t
    temps = [r["sched/rollout.temperature"] for r in rows]
    assert temps[0] == 1.2
    for prev, nxt in zip(rows, temps[1:]):
        want = min(1.2, max(0.7, prev["sched/rollout.temperature"] + 0.2 * (1.5 - prev["policy/entropy"])))
        assert nxt == pytest.approx(want, abs=1e-12)
    state = json.loads((tmp_path / "ent" / "checkpoints" / "last" / "state.json").read_text())
    assert "temperature" in state  # a resumed run continues the controlled temperature


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

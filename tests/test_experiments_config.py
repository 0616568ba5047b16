"""Config validation: bad input fails before any compute, with a message naming the key."""

import pytest

from experiments.config import ConfigError, load_config


def test_defaults_and_presets_resolve():
    cfg = load_config(None, [])
    assert cfg.objective.name == "grpo"
    for name in ("ppo", "grpo", "dr_grpo", "dapo", "gspo"):
        c = load_config(None, [f"objective={name}"])
        assert c.objective.name == name
        assert c.rollout.completions_per_step % c.objective.group_size == 0


def test_field_override_applies_after_preset_whatever_the_order():
    a = load_config(None, ["objective.loss.agg=token_mean", "objective=grpo"])
    b = load_config(None, ["objective=grpo", "objective.loss.agg=token_mean"])
    assert a == b and a.objective.loss.agg == "token_mean"
    assert a.objective.adv.scale == "group"  # the rest of the preset is kept


def test_yaml_file_with_preset_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("objective: {preset: dapo, kl: {beta: 0.0}}\ntrain: {steps: 7}\nseed: 3\n")
    cfg = load_config(p, ["train.eval_every=5"])
    assert cfg.objective.name == "dapo" and cfg.objective.ratio.eps_high == 0.28
    assert cfg.train.steps == 7 and cfg.train.eval_every == 5 and cfg.seed == 3


@pytest.mark.parametrize("override, needle", [
    ("trian.steps=3", "'trian'"),                     # typo in a section
    ("train.stpes=3", "train.stpes"),                   # typo in a field
    ("train.steps=abc", "train.steps"),                 # wrong type
    ("objective=grpoo", "grpoo"),                       # unknown preset lists the valid ones
    ("objective.loss.agg=mean", "agg"),                 # unknown mode
    ("objective.ratio.eps_low=-0.1", "eps_low"),        # out of range
    ("rollout.top_p=1.5", "top_p"),
    ("rollout.engine=tpu", "rollout.engine"),
    ("rollout.completions_per_step=60", "group_size"),  # 60 is not a multiple of G = 8
    ("train.steps=0", "train.steps"),
    ("noequals", "key=value"),
])
def test_bad_overrides_name_the_problem(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_unknown_preset_lists_choices():
    with pytest.raises(ConfigError, match="ppo, grpo, dr_grpo, dapo, gspo"):
        load_config(None, ["objective=nope"])


def test_typo_gets_a_suggestion():
    with pytest.raises(ConfigError, match="Did you mean: train.steps"):
        load_config(None, ["train.stpes=3"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_task_errors_surface_at_load_time():
    with pytest.raises(ConfigError, match="ops"):
        load_config(None, ["task.ops=+/"])
    with pytest.raises(ConfigError, match="difficulty"):
        load_config(None, ["task.max_digits=2", "task.difficulty_weights=[1,1,1]"])

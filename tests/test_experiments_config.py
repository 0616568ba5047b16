"""Config validation: bad input fails before any compute, with a message naming the key."""

import pytest

from objbench.experiments.config import ConfigError, load_config


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


# ------------------------------------------------------------------------------- seed 003 directions
def test_schedules_from_the_command_line_and_yaml(tmp_path):
    cli = load_config(None, ["objective.schedules.ratio.eps_high.kind=linear",
                             "objective.schedules.ratio.eps_high.end=0.05", "rollout.temperature=1.2",
                             "rollout.temperature_schedule.kind=cosine", "rollout.temperature_schedule.end=0.7"])
    sched = cli.objective.schedules["ratio"]["eps_high"]
    assert (sched.kind, sched.start, sched.end) == ("linear", None, 0.05)
    assert cli.rollout.temperature_schedule.end == 0.7
    p = tmp_path / "s.yaml"
    p.write_text("objective: {preset: grpo, schedules: {ratio: {eps_high: {kind: linear, start: 0.2, end: 0.05}}}}\n")
    assert load_config(p).objective.schedules["ratio"]["eps_high"].start == 0.2


@pytest.mark.parametrize("override, needle", [
    ("objective.schedules.ratio.eps_high.knd=linear", "Did you mean one of: 'kind'"),           # unknown setting
    ("objective.schedules.ratio.eps_high.kind=exp", "Schedule.kind must be one of"),             # bad kind
    ("objective.schedules.ratio.eps_high.start=nan", "finite"),                                   # NaN
    ("objective.schedules.ratio.eps_hi.kind=constant", "no field 'eps_hi'"),                     # unknown field
    ("objective.schedules.loss.agg.kind=constant", "not a float field"),                        # non-float field
    ("objective.schedules.kl.beta.end=0.1", "Schedule.end = 0.1 is not read by kind 'constant'"),
    ("rollout.temperature_schedule.end=nan", "finite"),
    ("rollout.temperature_control.gain=0.3", "not read while"),
])
def test_bad_schedules_fail_at_load(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_adaptive_group_sizes_at_load():
    # any budget works with a size per prompt (16 is no multiple of 3 or 5); group_size is then not read
    cfg = load_config(None, ["objective.groups.rule=difficulty", "objective.groups.thresholds=[2]",
                             "objective.groups.sizes=[3,5]", "rollout.completions_per_step=16"])
    assert cfg.objective.groups.sizes == [3, 5]
    with pytest.raises(ConfigError, match="group_size = 4 is not read by groups.rule = 'difficulty'"):
        load_config(None, ["objective.groups.rule=difficulty", "objective.groups.thresholds=[2]",
                           "objective.groups.sizes=[3,5]", "objective.group_size=4"])
    with pytest.raises(ConfigError, match="both set the temperature"):
        load_config(None, ["rollout.temperature_schedule.kind=linear", "rollout.temperature_schedule.end=0.7",
                           "rollout.temperature_control.target=1.0"])


def test_warm_start_resolution_competence_by_default_fixed_when_steps_are_given():
    sft = load_config(None).sft
    assert (sft.steps, sft.until_acc, sft.noise_steps, sft.grad_clip) == (6000, 0.9, 400, 1.0)
    sft = load_config(None, ["sft.steps=1000"]).sft  # an explicit step count is a fixed schedule
    assert (sft.steps, sft.until_acc) == (1000, 0.0)
    sft = load_config(None, ["sft.steps=1000", "sft.until_acc=0.8"]).sft
    assert (sft.steps, sft.until_acc) == (1000, 0.8)
    # the committed studies made before 2026-12-03 used this schedule: it stays reachable
    old = load_config(None, ["sft.until_acc=0", "sft.steps=1000", "sft.grad_clip=0"]).sft
    assert (old.steps, old.until_acc, old.grad_clip, old.noise_start) == (1000, 0.0, 0.0, 0.6)
    with pytest.raises(ConfigError, match="sft.until_acc must be in"):
        load_config(None, ["sft.until_acc=1.5"])

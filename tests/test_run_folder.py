"""The run folder across objbench versions (a config.yaml written before a setting existed) and default run names
that never let two different configurations share a folder."""

import json

import pytest
import yaml

import objbench.experiments.config as C
import objbench.experiments.config.identity as identity
import objbench.experiments.run.run_folder as RF
from objbench.experiments.config import ConfigError, load_config, to_yaml
from objbench.experiments.config.errors import RunFolderError
from objbench.experiments.run.run_folder import prepare_run_dir, run_status


def _finished_run(tmp_path, *overrides, drop=(), done=True):
    """A run folder as `objbench train` leaves it (config.yaml, done), with the dotted settings in ``drop``
    deleted from its config.yaml, as an objbench that did not know them would have written it."""
    cfg = load_config(None, [f"out_dir={tmp_path}", "name=r", *overrides])
    run_dir, status = prepare_run_dir(cfg)
    assert status == "new"
    old = yaml.safe_load((run_dir / "config.yaml").read_text())
    for key in drop:
        *path, last = key.split(".")
        node = old
        for part in path:
            node = node[part]
        del node[last]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    if done:
        (run_dir / "done").write_text("")
    return run_dir


@pytest.mark.parametrize("added", ["rollout.staleness", "train.eval_temperature", "rollout.temperature_control",
                                   "rollout.temperature_schedule", "task.verdict", "task.filler_position"])
def test_a_setting_added_later_at_its_neutral_value_is_no_difference(tmp_path, added):
    _finished_run(tmp_path, drop=[added])
    assert run_status(load_config(None, [f"out_dir={tmp_path}", "name=r"]))[1] == "done"


def test_an_unfinished_old_run_resumes(tmp_path):
    run_dir = _finished_run(tmp_path, drop=["rollout.staleness", "rollout.temperature_control"], done=False)
    (run_dir / "checkpoints" / "last").mkdir(parents=True)
    (run_dir / "checkpoints" / "last" / "state.json").write_text('{"step": 4}')
    assert run_status(load_config(None, [f"out_dir={tmp_path}", "name=r"]))[1] == "resume"


def test_a_setting_added_later_at_another_value_still_refuses(tmp_path):
    _finished_run(tmp_path, drop=["rollout.staleness", "rollout.temperature_control"])
    with pytest.raises(ConfigError, match=r"differs in: rollout\.staleness\)"):
        run_status(load_config(None, [f"out_dir={tmp_path}", "name=r", "rollout.staleness=2"]))
    with pytest.raises(ConfigError, match=r"rollout\.temperature_control\.target"):
        run_status(load_config(None, [f"out_dir={tmp_path}", "name=r", "rollout.temperature_control.target=1.0"]))


def test_a_setting_without_a_declared_old_value_is_named_as_absent(tmp_path):
    _finished_run(tmp_path, drop=["optim.lr"])
    with pytest.raises(ConfigError, match=r"optim\.lr \(absent\)"):
        run_status(load_config(None, [f"out_dir={tmp_path}", "name=r"]))


def test_a_whole_top_level_section_added_later(tmp_path, monkeypatch):
    _finished_run(tmp_path, drop=["log"])
    cfg = load_config(None, [f"out_dir={tmp_path}", "name=r"])
    with pytest.raises(RunFolderError, match="incomplete"):  # undeclared: a file cut off while it was written
        run_status(cfg)
    declared = RF.absent_values

    def with_log_section(root, task_name=None):  # as if every `log` setting had been declared added_later
        return {**declared(root, task_name), "log.ref_kl": True, "log.wandb": False, "log.wandb_project": "objbench"}

    monkeypatch.setattr(RF, "absent_values", with_log_section)
    monkeypatch.setattr(identity, "absent_values", with_log_section)
    assert run_status(cfg)[1] == "done"
    with pytest.raises(ConfigError, match=r"log\.ref_kl"):
        run_status(load_config(None, [f"out_dir={tmp_path}", "name=r", "log.ref_kl=false"]))


# ------------------------------------------------------------------------------------------ default run names
def test_default_names_tell_configurations_apart(tmp_path):
    def name(*o):
        return load_config(None, [f"out_dir={tmp_path}", *o]).run_name

    assert name() == "grpo__s0" and name("objective=dapo", "seed=2") == "dapo__s2"  # only preset and seed
    countdown, agg = name("task.name=countdown"), name("objective.loss.agg=token_mean")
    assert countdown.startswith("grpo__") and countdown.endswith("__s0") and len(countdown) == len("grpo__12345678__s0")
    assert len({countdown, agg, name("task.name=countdown", "train.steps=7")}) == 3
    assert name("task.name=countdown") == countdown  # the same command, the same folder
    assert name("name=mine", "task.name=countdown") == "mine"


def test_a_folder_made_under_the_old_default_name_is_found(tmp_path):
    over = [f"out_dir={tmp_path}", "task.name=countdown"]
    cfg = load_config(None, over)
    (tmp_path / "grpo__s0").mkdir()  # what `objbench train task.name=countdown` wrote before the hash
    (tmp_path / "grpo__s0" / "config.yaml").write_text(to_yaml(cfg))
    assert load_config(None, over).run_name == "grpo__s0"  # resumes it instead of starting a new folder
    # another configuration does not claim it
    assert load_config(None, [*over, "train.steps=7"]).run_name != "grpo__s0"


# ------------------------------------------------------------------------------------------ names are names
@pytest.mark.parametrize("name", ["../../escape", "/some/absolute/path", ".hidden", "a/b", "a b", "x\ny"])
def test_a_run_name_that_is_not_one_folder_name_is_refused_before_any_folder(tmp_path, name):
    with pytest.raises(ConfigError, match="not a valid name"):
        load_config(None, [f"out_dir={tmp_path / 'out'}", f"name={name}"])
    assert not any(tmp_path.iterdir())


def test_committed_style_names_stay_valid(tmp_path):
    for name in ("grpo-lr=0.0001", "k1_reward_0.04", "u8_stale4__s0", "a+b.c"):
        assert load_config(None, [f"out_dir={tmp_path}", f"name={name}"]).run_name == name


@pytest.mark.parametrize("arm", ["../escape", "/abs", ".x"])
def test_a_sweep_arm_or_sweep_name_that_is_not_a_folder_name_is_refused(tmp_path, arm):
    from objbench.experiments.sweeper.plan import load_sweep

    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "s", "seeds": 1, "arms": {arm: {"objective": "grpo"}}}))
    with pytest.raises(ConfigError, match="not a valid name"):
        load_sweep(tmp_path / "s.yaml", out_dir=str(tmp_path / "out"))
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"name": arm, "seeds": 1, "arms": ["grpo"]}))
    with pytest.raises(ConfigError, match="not a valid name"):
        load_sweep(tmp_path / "t.yaml", out_dir=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ damaged log lines
def test_a_resume_refuses_a_hand_damaged_log_line_and_says_when_it_drops_a_torn_last_line(tmp_path):
    from objbench.experiments.run.logs import JsonlWriter

    rows = [json.dumps({"step": i, "x": i}) for i in range(1, 5)]
    log = tmp_path / "metrics.jsonl"
    damaged = "\n".join([rows[0], '{"step": 2, "x": 2', *rows[2:]]) + "\n"  # line 2 broken, not the last
    log.write_text(damaged)
    with pytest.raises(RunFolderError, match="line 2 is not valid JSON"):
        JsonlWriter.truncate_after(log, 3)
    assert log.read_text() == damaged  # left as it was
    log.write_text("\n".join(rows) + '\n{"step": 5, "x"')  # a crash mid-write: the last line torn
    note = JsonlWriter.truncate_after(log, 3)
    assert "dropped its last line" in note
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2, 3]
    assert JsonlWriter.truncate_after(log, 3) is None  # nothing to say the second time

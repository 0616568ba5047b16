import json

import pytest
import yaml

from objbench import envs
from objbench.envs import make_task, register_task, task_names, task_spec
from objbench.envs.arithmetic import ArithmeticConfig, ArithmeticTask


def test_names():
    assert task_names() == ("arithmetic", "countdown", "dataset", "mixture", "reasoning_gym", "scratchpad")
    assert sorted(envs.TASKS) == ["arithmetic", "countdown", "dataset", "mixture", "reasoning_gym", "scratchpad"]


def test_unknown_task_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown task 'gsm8k'.*arithmetic, countdown"):
        make_task("gsm8k")


def test_unknown_setting_is_named():
    with pytest.raises(ValueError, match=r"unknown setting.*'max_digit'.*max_digits"):
        make_task("arithmetic", max_digit=3)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_digits": 0}, "max_digits"),
        ({"max_digits": 2.5}, "max_digits"),
        ({"max_digits": True}, "max_digits"),
        ({"ops": ["/"]}, "ops"),
        ({"ops": []}, "ops"),
        ({"ops": ["+", "+"]}, "ops"),
        ({"ops": "+/"}, "ops"),
        ({"ops": ""}, "ops"),
        ({"ops": 3}, "ops"),
        ({"difficulty_weights": [1, 1, 1, 1]}, "difficulty_weights"),
        ({"difficulty_weights": [[1, 1], 2]}, "difficulty_weights"),
        ({"difficulty_weights": {1: 0, 2: 0}}, "difficulty_weights"),
        ({"difficulty_weights": {1: -1, 2: 2}}, "difficulty_weights"),
        ({"difficulty_weights": {4: 1}}, "difficulty_weights"),
        ({"difficulty_weights": {1: float("nan")}}, "difficulty_weights"),
        ({"difficulty_weights": {"one": 1}}, "difficulty_weights"),
        ({"difficulty_weights": 3}, "difficulty_weights"),
        ({"reverse_answer": "yes"}, "reverse_answer"),
        ({"filler_max": -1}, "filler_max"),
        ({"format_reward": 1.0}, "format_reward"),
        ({"format_reward": -0.1}, "format_reward"),
        ({"holdout_modulus": 1}, "holdout_modulus"),
        ({"eval_per_difficulty": 0}, "eval_per_difficulty"),
        ({"max_completion_chars": 3}, "max_completion_chars"),
    ],
)
def test_invalid_arithmetic_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make_task("arithmetic", **kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_numbers": 1}, "max_numbers"),
        ({"ops": ["^"]}, "ops"),
        ({"difficulty_weights": {5: 1}}, "difficulty_weights"),
        ({"max_target": 0}, "max_target"),
    ],
)
def test_invalid_countdown_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make_task("countdown", **kwargs)


def test_yaml_and_json_values_are_accepted():
    task = make_task("arithmetic", ops=["+", "-"], difficulty_weights={"1": 1, "2": 1}, max_digits=2)
    assert task.config.ops == ("+", "-")
    assert task.config.difficulty_weights == ((1, 1.0), (2, 1.0))
    assert hash(task.config) == hash(ArithmeticConfig(ops=("+", "-"), difficulty_weights=((1, 1), (2, 1)), max_digits=2))
    # A string of op characters and a flat list of weights for difficulties 1, 2, ... (config-file forms).
    flat = make_task("arithmetic", ops="+-", difficulty_weights=[1, 1], max_digits=2)
    assert flat.config == task.config
    cd = make_task("countdown", difficulty_weights=[0, 1, 3])
    assert cd.config.difficulty_weights == ((2, 0.0), (3, 1.0), (4, 3.0))


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_task_spec_is_plain_data_and_round_trips(name):
    task = make_task(name)
    spec = task_spec(task)
    assert spec["name"] == name
    for text in (yaml.safe_dump(spec), json.dumps(spec)):
        loaded = yaml.safe_load(text)
        assert loaded == spec
        assert make_task(**loaded).config == task.config


def test_default_spec_is_the_documented_default():
    assert task_spec(make_task("arithmetic")) == {
        "name": "arithmetic",
        "max_digits": 3,
        "ops": ["+"],
        "difficulty_weights": [[1, 0.25], [2, 0.5], [3, 0.25]],
        "reverse_answer": True,
        "filler_max": 0,
        "filler_position": "before",
        "filler_demo_max": None,
        "format_reward": 0.0,
        "holdout_modulus": 4,
        "eval_per_difficulty": 24,
        "max_completion_chars": 256,
        "verdict": False,
    }


def test_duplicate_registration_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_task("arithmetic", ArithmeticConfig, ArithmeticTask)


def test_envs_imports_no_other_objbench_package():
    from import_graph import objbench_subpackages as _objbench_subpackages

    import ast
    from pathlib import Path

    for path in Path(envs.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            for n in _objbench_subpackages(node):
                assert n not in {"algos", "rollout", "experiments", "analysis"}, (path, n)

"""The Python API (objbench.train, sweep, load_runs, read_data, report) and the examples that use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import objbench
from objbench.experiments.cli.api import _nested

ROOT = Path(__file__).resolve().parent.parent
FAST = {"sft.steps": 20, "sft.batch_size": 16, "train.steps": 2, "rollout.completions_per_step": 16,
        "task.eval_per_difficulty": 2, "train.eval_samples": 2, "train.eval_every": 2}


def test_dotted_and_nested_settings_become_one_nested_mapping():
    assert _nested({"train.steps": 3, "train": {"eval_every": 2}, "objective": "dapo"}) == \
        {"train": {"steps": 3, "eval_every": 2}, "objective": "dapo"}
    with pytest.raises(ValueError, match="also given a value"):
        _nested({"train": 3, "train.steps": 2})


@pytest.mark.parametrize("order", ["preset first", "dotted key first"])
def test_a_preset_and_its_dotted_settings_in_one_dict_load_as_on_the_command_line(order):
    """{"objective": "grpo", "objective.loss.agg": "token_mean"} was refused (preset first) or lost its setting
    (dotted key first); either order now gives the command line's config."""
    from objbench.experiments.cli.api import _resolve
    from objbench.experiments.config import load_config, to_dict

    items = [("objective", "grpo"), ("objective.loss.agg", "token_mean"), ("task.reverse_answer", False),
             ("task", "arithmetic")]
    settings = dict(items if order == "preset first" else items[::-1])
    want = load_config(None, ["objective=grpo", "objective.loss.agg=token_mean", "task=arithmetic",
                              "task.reverse_answer=false"])
    got = _resolve(settings, [])
    assert got.objective.loss.agg == "token_mean" and got.objective.name == "grpo"
    assert to_dict(got) == to_dict(want)


def test_train_takes_a_dict_a_list_or_a_config_and_gives_the_same_run(tmp_path):
    as_dict = objbench.train({**FAST, "out_dir": str(tmp_path), "name": "a"}, progress=False)
    as_list = [f"{k}={v}" for k, v in FAST.items()] + [f"out_dir={tmp_path}", "name=b"]
    cfg = objbench.load_config(None, as_list)
    assert objbench.train(as_list, progress=False).name == "b"
    assert objbench.train(cfg, progress=False) == tmp_path / "b"  # finished: skipped, same folder
    a, b = ([{k: v for k, v in json.loads(line).items() if not k.startswith("time") and "rss" not in k}
             for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()] for n in "ab")
    assert as_dict == tmp_path / "a" and len(a) == 2 and json.dumps(a) == json.dumps(b)


def test_read_data_and_report_from_a_committed_study(tmp_path):
    runs = objbench.read_data(ROOT / "results" / "group_size")
    assert {"arm", "seed"} <= set(runs.configs.columns) and len(runs.seeds) >= 10
    report = objbench.report(data=ROOT / "results" / "group_size" / "runs.csv.gz", out_dir=tmp_path)
    assert report.is_file() and "group_size" in report.read_text()


def test_the_custom_objective_example_runs(tmp_path):
    """examples/custom_objective.py --quick: a plug-in surrogate (examples/gpg_plugin.py) beside GRPO in a 2-worker
    sweep through objbench.sweep and objbench.load_runs."""
    env = dict(os.environ)
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "custom_objective.py"), "--quick", "--out",
                          str(tmp_path)], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "grpo_gpg" in out.stdout and "held-out accuracy" in out.stdout
    folder = tmp_path / "custom_objective_quick"
    assert (folder / "report" / "report.md").is_file()
    assert sorted(objbench.load_runs(folder).present_arms) == ["grpo", "grpo_gpg"]


def test_the_custom_reward_example_runs(tmp_path):
    """examples/custom_reward.py --quick: a format reward (examples/format_reward.py) beside a data-set task's
    verifier on a model folder built in the example, through objbench.train."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "custom_reward.py"), "--quick", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    meta = json.loads((tmp_path / "runs" / "grpo_format" / "meta.json").read_text())
    assert meta["model"]["folder"].endswith("toy-qwen2")


def test_format_reward_scores_the_gsm8k_ending():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from format_reward import gsm8k_format
    finally:
        sys.path.remove(str(ROOT / "examples"))
    assert gsm8k_format(["p"] * 4, ["3 + 4 = 7\n#### 7", "7", "", "#### 1,000"]) == [1.0, 0.0, None, 1.0]


def test_the_notebook_runs_top_to_bottom(tmp_path):
    """examples/notebook.ipynb, executed as Jupyter would (every code cell in order, one namespace, from examples/)
    without a kernel: its figure is saved and its paired comparison printed."""
    nb = json.loads((ROOT / "examples" / "notebook.ipynb").read_text())
    code = "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    script = tmp_path / "notebook.py"
    script.write_text(code + f"\nplt.savefig({str(tmp_path / 'curves.png')!r})\n")
    env = dict(os.environ, MPLBACKEND="Agg")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                         cwd=ROOT / "examples")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "G8 - G2, final held-out pass@1:" in out.stdout and "(95% t, 10 seeds)" in out.stdout
    assert (tmp_path / "curves.png").stat().st_size > 10_000

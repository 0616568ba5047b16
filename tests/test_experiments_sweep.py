"""Sweep specs: expansion, validation, and resumption after a crash."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from objbench.experiments.config import ConfigError
from objbench.experiments.sweeper.plan import load_sweep

FAST = {"sft.steps": 30, "sft.batch_size": 32, "train.steps": 4, "rollout.completions_per_step": 16,
        "task.eval_per_difficulty": 2, "train.eval_samples": 2, "train.eval_every": 2,
        "train.checkpoint_every": 2}


def _spec(tmp_path, body: str, name="s.yaml"):
    p = tmp_path / name
    p.write_text(body)
    return p


def test_arms_grid_and_seeds_expand_to_every_combination(tmp_path):
    p = _spec(tmp_path, """
name: ab
seeds: [0, 1, 2]
set: {train.steps: 7}
arms:
  grpo: {objective: grpo}
  dapo: {objective: dapo, objective.ratio.eps_high: 0.3}
grid:
  objective.loss.agg: [token_mean, seq_mean_token_mean]
""")
    sw = load_sweep(p, out_dir=str(tmp_path / "out"))
    assert len(sw.runs) == 2 * 2 * 3 and len(sw.arms) == 4
    names = {r.cfg.run_name for r in sw.runs}
    assert "grpo-agg=token_mean__s0" in names and "dapo-agg=seq_mean_token_mean__s2" in names
    for r in sw.runs:
        assert r.cfg.train.steps == 7 and r.cfg.seed == r.seed
        assert r.cfg.out_dir == str(tmp_path / "out" / "ab")
        assert r.cfg.objective.loss.agg in ("token_mean", "seq_mean_token_mean")
        assert r.cfg.objective.name == r.arm.split("-")[0]
        if r.arm.startswith("dapo"):
            assert r.cfg.objective.ratio.eps_high == 0.3
    # arms of a seed differ only in what the spec names
    g0 = [r.cfg for r in sw.runs if r.seed == 0 and r.arm.startswith("grpo")]
    assert g0[0].sft == g0[1].sft and g0[0].task == g0[1].task and g0[0].rollout == g0[1].rollout


def test_out_dir_is_absolute_and_resources_are_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Ray workers run elsewhere: every run must name the folder sweep.json goes to
    sw = load_sweep(_spec(tmp_path, "arms: [grpo]\nout_dir: rel\nresources: {gpus_per_run: 0.5}\n"))
    assert sw.sweep_dir == tmp_path / "rel" / "s" and sw.runs[0].cfg.out_dir == str(tmp_path / "rel" / "s")
    assert sw.gpus_per_run == 0.5
    assert load_sweep(_spec(tmp_path, "arms: [grpo]\n"), out_dir="o").sweep_dir == tmp_path / "o" / "s"


def test_list_of_presets_and_seed_count(tmp_path):
    sw = load_sweep(_spec(tmp_path, "arms: [ppo, gspo]\nseeds: 2\n"))
    assert sw.arms == ["ppo", "gspo"] and sw.seeds == [0, 1] and len(sw.runs) == 4
    assert sw.name == "s"


@pytest.mark.parametrize("body, needle", [
    ("arms: [grpo]\nseedz: [0]\n", "seedz"),
    ("arms: [grpo]\nseeds: [0, 0]\n", "duplicates"),
    ("arms: [grpo]\nseeds: [-1]\n", "seeds"),
    ("arms: {a: {objective: nope}}\n", "arm 'a'"),
    ("arms: {a: {train.stepz: 3}}\n", "train.stepz"),
    ("arms: [grpo]\ngrid: {objective.loss.agg: []}\n", "grid.objective.loss.agg"),
    ("arms: [grpo]\nbase: missing.yaml\n", "missing.yaml"),
    ("arms: [grpo\n", "YAML"),
    ("arms: [grpo]\nresources: {gpus: 1}\n", "resources"),
    ("arms: [grpo]\nresources: {gpus_per_run: 1.5}\n", "whole number"),
    ("arms: [grpo]\nresources: {gpus_per_run: -1}\n", "gpus_per_run"),
    ("arms: {a: 3}\n", "arms.a must be a mapping"),
    ("arms: [grpo]\ngrid: [1]\n", "'grid' must be a mapping"),
    ("arms: [grpo]\ngrid: {log.wandb_project: [a b, ab]}\n", "arm names collide"),  # both wandb_project=ab
    ("arms: [grpo]\nreport: {nope: 1}\n", "nope"),
    ("name: 5\narms: [grpo]\n", "'name' must be a string"),
])
def test_bad_specs_fail_before_any_run(tmp_path, body, needle):
    with pytest.raises(ConfigError, match=None) as e:
        load_sweep(_spec(tmp_path, body), out_dir=str(tmp_path / "out"))
    assert needle in str(e.value)
    assert not (tmp_path / "out").exists()


def test_a_spec_is_a_frozen_dataclass_normalised_when_built(tmp_path):
    from dataclasses import FrozenInstanceError

    from objbench.experiments.sweeper.spec import SPEC_KEYS, SweepResources, SweepSpec, load_spec

    spec = load_spec(_spec(tmp_path, "arms: [ppo, gspo]\nseeds: 2\nresources: {gpus_per_run: 1}\n"))
    assert spec.name == "s" and spec.seeds == (0, 1) and spec.resources == SweepResources(1.0)
    assert spec.arms == {"ppo": {"objective": "ppo"}, "gspo": {"objective": "gspo"}} and spec.set == {}
    assert len(spec.spec_hash) == 12 and spec.base is None and spec.base_path is None
    with pytest.raises(FrozenInstanceError):
        spec.seeds = (3,)
    built = SweepSpec(tmp_path / "x.yaml", arms={"a": None}, grid={"train.steps": [3, 4]})
    assert built.name == "x" and built.arms == {"a": {}} and built.seeds == (0,)
    assert built.arm_labels == ["a-steps=3", "a-steps=4"]
    assert built.arm_points()[1] == ("a-steps=4", {}, {"train.steps": 4})
    assert "seedz" not in SPEC_KEYS and {"arms", "set", "grid", "resources", "report"} <= SPEC_KEYS


def test_quickstart_spec_is_valid():
    sw = load_sweep("experiments/sweeps/quickstart.yaml")
    assert set(sw.arms) == {"ppo", "grpo", "dr_grpo", "dapo", "gspo"} and len(sw.seeds) >= 3
    # identical conditions: same budget and start settings in every arm
    assert len({(r.cfg.rollout.completions_per_step, repr(r.cfg.sft), repr(r.cfg.task)) for r in sw.runs}) == 1


def _rows(path):
    return [json.loads(l) for l in open(path)]


@pytest.mark.robustness
def test_killed_sweep_resumes_without_redoing_or_duplicating(tmp_path):
    sets = "\n".join(f"  {k}: {v}" for k, v in FAST.items())
    spec = _spec(tmp_path, f"name: k\nseeds: [0]\narms: [grpo, dr_grpo]\nset:\n{sets}\n")
    out = tmp_path / "out"
    # the CLI, every run crashing hard after step 3 while OBJBENCH_TEST_CRASH_AT_STEP is set (tests/crash_run.py)
    cmd = [sys.executable, str(Path(__file__).with_name("crash_run.py")), "sweep", str(spec), "--out", str(out),
           "--workers", "1", "--no-report"]
    env = {**os.environ, "OBJBENCH_CACHE": str(tmp_path / "cache"), "OBJBENCH_TEST_CRASH_AT_STEP": "3"}
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode != 0  # the first run died after logging step 3 (checkpoint at step 2)
    first = out / "k" / "grpo__s0"
    assert not (first / "done").exists() and len(_rows(first / "metrics.jsonl")) == 3
    env.pop("OBJBENCH_TEST_CRASH_AT_STEP")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    for arm in ("grpo", "dr_grpo"):
        run = out / "k" / f"{arm}__s0"
        assert (run / "done").exists()
        assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2, 3, 4]
    done_mtime = (first / "done").stat().st_mtime
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "2 already finished" in p.stdout
    assert (first / "done").stat().st_mtime == done_mtime  # finished runs are not redone


@pytest.mark.parametrize("spec", sorted(__import__("glob").glob("experiments/sweeps/*.yaml")))
def test_every_shipped_sweep_spec_resolves(spec, tmp_path_factory):
    import yaml

    model = (yaml.safe_load(open(spec)).get("set") or {}).get("model.path")
    extra = []
    if model and not Path(model).exists():  # a model that `objbench models fetch` brings: the error says how
        with pytest.raises(ConfigError, match=f"objbench models fetch {Path(model).name} {model}"):
            load_sweep(spec)
        from objbench.rollout.toy_hf import write_toy_model

        extra = [f"model.path={write_toy_model(tmp_path_factory.mktemp('model') / 'toy')}"]
    sw = load_sweep(spec, extra_overrides=extra)
    pilot = re.search(r"_pilot\d*$", sw.name) is not None  # a pilot measures; it may use one seed
    assert sw.runs and (pilot or len(sw.seeds) >= 3)


def test_sweep_warns_when_its_code_is_not_in_a_git_checkout(tmp_path, monkeypatch, capsys):
    """A --target or non-editable install has no git: the runs record commit 'unknown'; the sweep says so."""
    from objbench.experiments.run import provenance
    from objbench.experiments.sweeper.sweep import write_sweep_files

    sw = load_sweep(_spec(tmp_path, "arms: [grpo]\n"), out_dir=str(tmp_path / "out"))
    write_sweep_files(sw, "objbench sweep s.yaml")
    assert json.loads((sw.sweep_dir / "sweep.json").read_text())["commit"] != "unknown"  # this checkout
    assert "not a git checkout" not in capsys.readouterr().err
    monkeypatch.setattr(provenance, "git_commit", lambda: "unknown")
    write_sweep_files(sw, "objbench sweep s.yaml")
    assert json.loads((sw.sweep_dir / "sweep.json").read_text())["commit"] == "unknown"
    err = capsys.readouterr().err
    assert "not a git checkout" in err and "commit 'unknown'" in err and "pip install -e" in err
    assert provenance.unknown_commit_warning("0c896ef") is None


def test_sweep_notes_when_its_seeds_cannot_resolve_any_declared_comparison(tmp_path, capsys):
    """Holm needs a raw p <= alpha/m, and the exact permutation test gives at least 2/2^n: with a family of 2 at
    alpha 0.05, 2/2^6 = 0.031 > 0.025 and 2/2^7 = 0.016 <= 0.025, so 6 seeds cannot resolve anything and 7 can; a
    family of 3 (alpha/m = 0.0167) needs 7 as well (0.0156). Both SmolLM2 studies (4 and 3 seeds) were such studies."""
    from objbench.analysis.prereg import parse_plan, unresolvable_warning
    from objbench.experiments.sweeper.sweep import write_sweep_files

    two = parse_plan({"endpoints": ["eval/pass@1", "eval/acc"], "comparisons": [["b", "a"]]}, ["a", "b"])
    assert two.family_size == 2
    assert "6 seeds" in unresolvable_warning(two, 6) and "(7 seeds reach it)" in unresolvable_warning(two, 6)
    assert "2/2^4 = 0.125, above alpha/m = 0.05/2 = 0.025" in unresolvable_warning(two, 4)
    assert unresolvable_warning(two, 7) is None
    three = parse_plan({"endpoints": ["x", "y", "z"], "comparisons": [["b", "a"]]}, ["a", "b"])
    assert "(7 seeds reach it)" in unresolvable_warning(three, 6) and unresolvable_warning(three, 7) is None
    assert unresolvable_warning(parse_plan({}, ["a", "b"]), 1) is None  # nothing declared (a pilot): no note
    body = "arms: [grpo, dr_grpo]\nseeds: {}\nreport: {{primary: eval/pass@1, comparisons: [[dr_grpo, grpo]]}}\n"
    for seeds, noted in ((5, True), (6, False)):  # one endpoint: alpha/m = 0.05; 2/2^5 = 0.0625, 2/2^6 = 0.031
        sw = load_sweep(_spec(tmp_path, body.format(seeds), f"s{seeds}.yaml"), out_dir=str(tmp_path / "out"))
        write_sweep_files(sw, "objbench sweep s.yaml")
        assert ("no declared comparison can be resolved" in capsys.readouterr().err) is noted

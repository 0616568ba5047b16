"""analysis.load on small hand-written run folders with known values."""

import json
import warnings

import numpy as np
import pytest

from objbench.analysis.load import LONG_COLUMNS, IncompleteRunWarning, load_runs, read_jsonl

ARMS = ["grpo", "dr_grpo"]
SEEDS = [0, 1, 2]
STEPS = [1, 2, 3, 4]


def value(arm, seed, step):
    """reward/acc of the fake runs: 0.1 * step for grpo, 0.2 * step for dr_grpo, 0.3 * step else; + 0.01 * seed."""
    return (ARMS.index(arm) + 1 if arm in ARMS else 3) * 0.1 * step + 0.01 * seed


def write_run(root, arm, seed, done=True, truncated=False, extra_lines=()):
    d = root / f"{arm}__s{seed}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(f"name: {arm}\nseed: {seed}\noptim:\n  lr: 0.001\n  betas: [0.9, 0.99]\n")
    (d / "meta.json").write_text(json.dumps({"run": d.name, "arm": arm, "seed": seed, "sweep": "tiny",
                                             "commit": "abc123", "versions": {"torch": "2.13.0"},
                                             "host": "h", "start": "t0", "end": "t1"}))
    lines = []
    for step in STEPS:
        rec = {"step": step, "tokens": 10 * step, "time": 1.5 * step, "reward/acc": value(arm, seed, step),
               "kl/k3": None}  # null = not logged
        if arm == "grpo":
            rec["adv/zero_var_frac"] = 0.5
        lines.append(json.dumps(rec))
    lines += list(extra_lines)
    text = "\n".join(lines) + "\n"
    if truncated:
        text += '{"step": 5, "tokens": 50, "reward/a'
    (d / "metrics.jsonl").write_text(text)
    evals = [{"step": s, "tokens": 10 * s, "eval/acc": value(arm, seed, s) / 2} for s in (0, 2, 4)]
    (d / "eval.jsonl").write_text("\n".join(json.dumps(e) for e in evals) + "\n")
    if done:
        (d / "done").write_text("")
    return d


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "tiny"
    root.mkdir()
    (root / "sweep.json").write_text(json.dumps({
        "name": "tiny", "spec_hash": "0123456789ab", "command": "objbench sweep experiments/sweeps/tiny.yaml",
        "arms": ARMS, "seeds": SEEDS, "commit": "abc123", "base_config": "experiments/configs/tiny.yaml"}))
    for arm in ARMS:
        for seed in SEEDS:
            write_run(root, arm, seed)
    return root


def test_load_sweep_long_format_shape_and_values(sweep):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean sweep loads without any warning
        runs = load_runs(sweep)
    m = runs.metrics
    assert list(m.columns) == LONG_COLUMNS
    # 6 runs x 4 steps x (time, reward/acc) + 3 grpo runs x 4 steps x adv/zero_var_frac; kl/k3 is null
    assert len(m) == 6 * 4 * 2 + 3 * 4
    assert set(m.metric) == {"time", "reward/acc", "adv/zero_var_frac"}
    acc = m[m.metric == "reward/acc"]
    for row in acc.itertuples():
        assert row.value == pytest.approx(value(row.arm, row.seed, row.step))
        assert row.tokens == 10 * row.step
        assert row.run == f"{row.arm}__s{row.seed}"
    assert m.seed.dtype == np.int64 and m.step.dtype == np.int64
    # runs in sweep arm order, then seed
    assert list(dict.fromkeys(m.run)) == [f"{a}__s{s}" for a in ARMS for s in SEEDS]

    e = runs.evals
    assert len(e) == 6 * 3 and set(e.step) == {0, 2, 4}
    row = e[(e.run == "dr_grpo__s2") & (e.step == 4)].iloc[0]
    assert row.value == pytest.approx(value("dr_grpo", 2, 4) / 2)


def test_load_configs_and_sweep_info(sweep):
    runs = load_runs(sweep)
    c = runs.configs
    assert len(c) == 6 and list(c.run) == [f"{a}__s{s}" for a in ARMS for s in SEEDS]
    assert (c["optim.lr"] == 0.001).all()
    assert c["optim.betas"].iloc[0] == [0.9, 0.99]
    assert (c["meta.commit"] == "abc123").all() and (c["meta.versions.torch"] == "2.13.0").all()
    assert c["complete"].all()
    assert runs.sweep["spec_hash"] == "0123456789ab"
    assert runs.arms == ARMS and runs.present_arms == ARMS and runs.seeds == SEEDS
    assert runs.metric_names == ["time", "reward/acc", "adv/zero_var_frac"]
    assert runs.eval_names == ["eval/acc"]
    assert runs.skipped == ()


def test_half_written_run_is_skipped_with_warning(sweep):
    write_run(sweep, "ppo", 0, done=False, truncated=True)
    with pytest.warns(IncompleteRunWarning, match="ppo__s0"):
        runs = load_runs(sweep)
    assert "ppo__s0" not in set(runs.metrics.run)
    assert [s.run for s in runs.skipped] == ["ppo__s0"]
    assert "done" in runs.skipped[0].reason
    assert "ppo" not in runs.present_arms


def test_half_written_run_loaded_on_request(sweep):
    write_run(sweep, "ppo", 0, done=False, truncated=True)
    with pytest.warns(IncompleteRunWarning, match="truncated"), pytest.warns(IncompleteRunWarning, match="loaded anyway"):
        runs = load_runs(sweep, include_incomplete=True)
    ppo = runs.metrics[(runs.metrics.run == "ppo__s0") & (runs.metrics.metric == "reward/acc")]
    assert list(ppo.step) == STEPS  # the truncated step-5 line is dropped, the rest kept
    assert not runs.configs.set_index("run").loc["ppo__s0", "complete"]
    assert runs.arms == ARMS + ["ppo"]  # arms not in sweep.json come after the listed ones


def test_repeated_steps_keep_last_line(sweep, tmp_path):
    d = tmp_path / "plain"
    d.mkdir()
    write_run(d, "grpo", 7, extra_lines=[json.dumps({"step": 2, "tokens": 20, "reward/acc": 9.0})])
    with pytest.warns(IncompleteRunWarning, match="repeated"):
        runs = load_runs(d)
    acc = runs.metrics[runs.metrics.metric == "reward/acc"].set_index("step")["value"]
    assert acc[2] == 9.0 and len(acc) == 4


def test_plain_runs_folder_without_sweep_json(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    d = write_run(root, "grpo", 0)
    (d / "meta.json").unlink()  # arm and seed then come from the folder name / config
    write_run(root, "dr_grpo", 1)
    runs = load_runs(root)
    assert runs.arms == ["dr_grpo", "grpo"]  # no sweep.json: sorted
    assert runs.sweep["spec_hash"] is None and runs.sweep["name"] == "runs"
    assert set(zip(runs.configs.arm, runs.configs.seed)) == {("grpo", 0), ("dr_grpo", 1)}
    # a single run folder works too
    single = load_runs(d)
    assert list(single.configs.run) == ["grpo__s0"]


def test_errors_name_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_runs(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no run folders"):
        load_runs(empty)
    only_half = tmp_path / "half"
    only_half.mkdir()
    write_run(only_half, "grpo", 0, done=False)
    with pytest.warns(IncompleteRunWarning), pytest.raises(ValueError, match="no loadable runs.*grpo__s0"):
        load_runs(only_half)


def test_read_jsonl_tolerates_garbage(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\nnot json\n\n[1, 2]\n{"step": 2}\n{"step": 3, "x"')
    recs, problems = read_jsonl(p)
    assert [r["step"] for r in recs] == [1, 2]
    assert len(problems) == 3 and "truncated" in problems[-1]
    assert read_jsonl(tmp_path / "missing.jsonl") == ([], [])

"""analysis.prereg: windows worked out by hand, the report section's keys and errors, and the committed sweep specs."""

import glob
import itertools
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from objbench.analysis.prereg import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_SEEDS,
    Endpoint,
    Window,
    check_report_spec,
    eval_window_problems,
    paired_differences,
    parse_plan,
    parse_window,
    per_run_values,
    points_note,
    schedule_ends,
)

REPO = Path(__file__).resolve().parent.parent


def curve_frame():
    """One metric 'm' of runs a__s0, a__s1, b__s0 at steps 0, 10, 20, 30, 40:
    a__s0: 0, 1, 2, 3, 4 ; a__s1: 0, 2, 2, 2, 10 ; b__s0: 1, 1, 1, 1, 1 (as floats)."""
    curves = {("a", 0): [0, 1, 2, 3, 4], ("a", 1): [0, 2, 2, 2, 10], ("b", 0): [1, 1, 1, 1, 1]}
    rows = [{"run": f"{arm}__s{seed}", "arm": arm, "seed": seed, "step": step, "tokens": 0.0, "metric": "m",
             "value": float(v)} for (arm, seed), vals in curves.items() for step, v in zip((0, 10, 20, 30, 40), vals)]
    return pd.DataFrame(rows)


def values(window):
    v = per_run_values(curve_frame(), "m", window)
    return dict(zip(v["run"], v["value"]))


def test_windows_by_hand():
    assert values("final") == {"a__s0": 4.0, "a__s1": 10.0, "b__s0": 1.0}
    # the last 20 steps (21-40) hold the points at 30 and 40: (3 + 4)/2, (2 + 10)/2; the last 2 steps only 40
    assert values({"last": 20}) == {"a__s0": 3.5, "a__s1": 6.0, "b__s0": 1.0}
    assert values("last:20") == values({"last": 20})
    assert values({"last": 2}) == values("final")
    # the start policy (step 0) is never part of "last K": the last 90 steps = the 4 training points
    assert values({"last": 90})["a__s0"] == pytest.approx(2.5)
    # steps 10-20: (1 + 2)/2, (2 + 2)/2
    assert values({"steps": [10, 20]}) == {"a__s0": 1.5, "a__s1": 2.0, "b__s0": 1.0}
    # AUC over steps 0..40 / 40: a__s0 is the line 0 -> 4, mean height 2; a__s1: trapezoids
    # 10 (0+2)/2 + 10 (2+2)/2 + 10 (2+2)/2 + 10 (2+10)/2 = 10 + 20 + 20 + 60 = 110 -> 110/40 = 2.75
    assert values("auc") == {"a__s0": 2.0, "a__s1": 2.75, "b__s0": 1.0}
    # std (ddof 1) of the training points: a__s0 1 2 3 4 -> sqrt(5/3)
    assert values("std")["a__s0"] == pytest.approx((5 / 3) ** 0.5) and values("std")["b__s0"] == 0.0
    # medians: the last 31 steps (10-40) of a__s1 are 2, 2, 2, 10 -> 2 (their mean is 4); a__s0 1, 2, 3, 4 -> 2.5
    assert values({"last": 31, "stat": "median"}) == {"a__s0": 2.5, "a__s1": 2.0, "b__s0": 1.0}
    assert values({"steps": [10, 40], "stat": "median"}) == values({"last": 31, "stat": "median"})
    assert values({"last": 31, "stat": "mean"}) == values({"last": 31}) == {"a__s0": 2.5, "a__s1": 4.0, "b__s0": 1.0}
    # change from steps 10-20 to the final point: 4 - 1.5, 10 - 2
    assert values({"from": {"steps": [10, 20]}, "to": "final"}) == {"a__s0": 2.5, "a__s1": 8.0, "b__s0": 0.0}
    # steps to a level (start included): a__s0 reaches 2 at step 20, a__s1 at step 10, b__s0 never -> censored at
    # 40 + 10 = 50 (one point period after its last point); level 0: every run at step 0
    assert values({"reach": 2}) == {"a__s0": 20.0, "a__s1": 10.0, "b__s0": 50.0}
    assert values({"reach": 0}) == {"a__s0": 0.0, "a__s1": 0.0, "b__s0": 0.0}
    assert values({"reach": 1}) == {"a__s0": 10.0, "a__s1": 10.0, "b__s0": 0.0}
    assert per_run_values(curve_frame(), "missing").empty
    assert per_run_values(curve_frame(), "m", {"steps": [100, 200]}).empty  # empty windows drop the run


def test_last_window_counts_steps_of_the_schedule_not_logged_points():
    """A run that stops logging a metric (issue 31: a collapsed run's metric is missing after step ~350): its
    ``last: K`` window is the last K steps of its schedule, it contributes the points it has there, and the note
    says how many; where it has none it drops out, instead of reaching back to older points."""
    rows = []
    for step in range(1, 11):  # schedule of 10 steps; a__s1 logs m at steps 1-6 and 9 only
        for run, v in (("a__s0", float(step)), ("a__s1", 100.0 + step)):
            if run == "a__s1" and step in (7, 8, 10):
                continue
            rows.append({"run": run, "arm": "a", "seed": int(run[-1]), "step": step, "metric": "m", "value": v})
    frame = pd.DataFrame(rows)
    configs = pd.DataFrame({"run": ["a__s0", "a__s1"], "train.steps": [10, 10]})
    ends = schedule_ends(configs)
    assert ends == {"a__s0": 10, "a__s1": 10}
    v = per_run_values(frame, "m", {"last": 4}, ends).set_index("run")
    # steps 7-10: a__s0 (7 + 8 + 9 + 10)/4 = 8.5 from 4 points; a__s1 only step 9: 109 from 1 point
    assert v.loc["a__s0", "value"] == 8.5 and v.loc["a__s0", "points"] == 4
    assert v.loc["a__s1", "value"] == 109.0 and v.loc["a__s1", "points"] == 1
    # counting points instead would have averaged a__s1's steps 4, 5, 6, 9: (104 + 105 + 106 + 109)/4 = 106
    # without a schedule the window ends at the run's last point (step 9 for a__s1: steps 6-9 -> (106 + 109)/2)
    assert per_run_values(frame, "m", {"last": 4}).set_index("run").loc["a__s1", "value"] == 107.5
    # the last step (10) holds no point of a__s1: it drops out
    assert list(per_run_values(frame, "m", {"last": 1}, ends)["run"]) == ["a__s0"]
    note = points_note(per_run_values(frame, "m", {"last": 4}, ends), "m (last 4)")
    assert note == "`m (last 4)`: points per run 4 (1 run); fewer than half: a__s1 1"


def test_window_forms_and_errors():
    assert parse_window(None) == Window("final")
    w = parse_window({"from": {"steps": [1, 20]}, "to": {"last": 50}})
    assert w.label() == "last 50 - steps 1-20" and parse_window(w.to_spec()) == w
    assert parse_window({"from": {"steps": [0, 0]}, "to": "final"}).label() == "final - step 0"
    assert "last 50 steps" in w.describe()
    m = parse_window({"last": 50, "stat": "median"})
    assert m.label() == "median of last 50" and parse_window(m.to_spec()) == m and "median over the last 50" in m.describe()
    for bad in ({"last": 5, "stat": "mode"}, {"stat": "median"}, {"final": 1, "stat": "median"}):
        with pytest.raises(ValueError, match="stat"):
            parse_window(bad)
    r = parse_window({"reach": 0.8})
    assert r.label() == "steps to 0.8" and parse_window(r.to_spec()) == r and "censored" in r.describe()
    for bad in ("mean", {"last": 0}, {"last": "x"}, {"steps": [5, 1]}, {"steps": [1]}, {"first": 3},
                {"from": "final", "to": {"from": "final", "to": "auc"}}, {"reach": "x"}, {"reach": float("nan")},
                {"reach": True}):
        with pytest.raises(ValueError, match="window"):
            parse_window(bad)


def test_paired_differences_pair_by_seed():
    v = per_run_values(curve_frame(), "m", "final")
    assert paired_differences(v, "a", "b") == ([0], [3.0])  # only seed 0 has both arms
    dup = pd.concat([v, v.assign(run="a__s0_again")[v["run"] == "a__s0"]])
    with pytest.raises(ValueError, match="more than one run"):
        paired_differences(dup, "a", "b")


def test_plan_keys_defaults_and_baseline():
    arms = ["grpo", "dapo", "gspo"]
    assert parse_plan({}, arms, primary="eval/acc").declared is False
    p = parse_plan({"primary": "eval/pass@1", "baseline": "grpo"}, arms)
    assert p.comparisons == (("dapo", "grpo"), ("gspo", "grpo"))
    assert p.endpoints == (Endpoint("eval/pass@1", Window("final")),)
    assert (p.alpha, p.min_seeds, p.family_size) == (DEFAULT_ALPHA, DEFAULT_MIN_SEEDS, 2) == (0.05, 10, 2)
    p = parse_plan({"window": "auc", "comparisons": [["gspo", "dapo"]], "baseline": "grpo", "alpha": 0.1,
                    "min_seeds": 5}, arms, primary="eval/acc")
    assert p.comparisons == (("gspo", "dapo"), ("dapo", "grpo"), ("gspo", "grpo"))
    assert p.endpoints[0] == Endpoint("eval/acc", Window("auc")) and p.alpha == 0.1 and p.min_seeds == 5
    p = parse_plan({"primary": "eval/acc", "endpoints": ["m1", {"metric": "m2", "window": {"last": 5}}],
                    "comparisons": [["dapo", "grpo"]]}, arms)
    assert [e.label() for e in p.endpoints] == ["m1 (final)", "m2 (last 5)"] and p.family_size == 2
    p = parse_plan({"primary": "m", "comparisons": [["dapo", "grpo"], ["gspo", "grpo"]],
                    "positive_control": ["gspo", "grpo"]}, arms)
    assert p.positive_control == ("gspo", "grpo") and p.to_spec()["positive_control"] == ["gspo", "grpo"]
    assert parse_plan(p.to_spec(), arms) == p


@pytest.mark.parametrize("section,needle", [
    ({"comparisons": [["grpo", "nope"]], "primary": "m"}, "unknown arm"),
    ({"baseline": "nope", "primary": "m"}, "unknown arm"),
    ({"comparisons": [["grpo", "grpo"]], "primary": "m"}, "two different arm names"),
    ({"comparisons": [["grpo", "dapo"], ["dapo", "grpo"]], "primary": "m"}, "declare one direction"),
    ({"comparisons": "grpo-dapo", "primary": "m"}, "list of"),
    ({"alpha": 1.5}, "alpha"),
    ({"min_seeds": 1}, "min_seeds"),
    ({"comparisons": [["grpo", "dapo"]]}, "no endpoint"),
    ({"endpoints": []}, "endpoints"),
    ({"endpoints": [{"metric": "m", "windw": "final"}]}, "endpoints"),
    ({"primary": "m", "window": "bogus"}, "window"),
    ({"comparison": [["grpo", "dapo"]]}, "unknown report key"),
    ({"comparisons": [["grpo", "dapo"]], "primary": "m", "positive_control": ["dapo", "grpo"]}, "positive_control"),
    ({"comparisons": [["grpo", "dapo"]], "primary": "m", "positive_control": "grpo"}, "positive_control"),
])
def test_plan_errors_name_the_key(section, needle):
    with pytest.raises(ValueError, match=needle):
        parse_plan(section, ["grpo", "dapo"])


def _arm_names(spec: dict) -> list[str]:
    """The arm labels experiments.sweep gives: <arm>[-<field>=<value>...] over the grid."""
    arms = spec["arms"]
    names = list(arms) if isinstance(arms, (list, dict)) else []
    grid = spec.get("grid") or {}
    if not grid:
        return names
    return [a + "-" + "-".join(f"{k.split('.')[-1]}={v}" for k, v in zip(grid, point))
            for a in names for point in itertools.product(*grid.values())]


@pytest.mark.parametrize("path", sorted(glob.glob(str(REPO / "experiments" / "sweeps" / "*.yaml"))))
def test_committed_sweep_specs_declare_their_comparisons(path):
    """Every committed study declares its comparisons before it runs. A pilot (a name ending in _pilot or _pilotN)
    may declare none: its report is then exploratory only (no verdicts), and its description must say it is one."""
    spec = yaml.safe_load(Path(path).read_text())
    arms = _arm_names(spec)
    check_report_spec(spec["report"], arms)
    plan = parse_plan(spec["report"], arms)
    pilot = re.search(r"_pilot\d*$", spec["name"]) is not None
    if pilot and not plan.declared:
        assert "pilot" in spec["description"], f"{path}: a pilot without comparisons must say it is a pilot"
    else:
        assert plan.declared, f"{path}: no declared comparison"
    assert plan.endpoints and plan.min_seeds == 10 and plan.alpha == 0.05


def test_check_report_spec_rejects_unknown_study():
    with pytest.raises(ValueError, match="report.study"):
        check_report_spec({"study": "nope"}, ["a"])
    check_report_spec(None, ["a"])
    check_report_spec({"primary": "eval/acc", "study": "length_bias"}, ["a"])


def test_an_eval_window_that_holds_no_evaluation_is_named():
    """Evaluations at step 0, every E steps and the last step: 100 steps with E = 40 evaluate at 0, 40, 80, 100."""
    plan = parse_plan({"endpoints": [{"metric": "eval/pass@1", "window": {"steps": [41, 79]}},
                                     {"metric": "eval/pass@1", "window": {"last": 10}},  # holds step 100
                                     {"metric": "eval/acc", "window": {"from": {"steps": [1, 39]}, "to": "final"}},
                                     {"metric": "reward/acc", "window": {"steps": [41, 79]}}],  # logged every step
                       "comparisons": [["a", "b"]]}, ["a", "b"])
    problems = eval_window_problems(plan, {"a": (100, 40), "b": (100, 20)})
    tail = "holds no evaluation in arm 'a': it evaluates at step 0, every 40 steps and at its last step 100"
    assert problems == [f"endpoint eval/pass@1 (steps 41-79) {tail}", f"endpoint eval/acc (final - steps 1-39) {tail}"]
    assert eval_window_problems(plan, {"b": (100, 20)}) == []  # 60, 20 lie inside both windows


def test_a_sweep_whose_eval_window_holds_no_evaluation_is_refused_before_any_run(tmp_path):
    from objbench.experiments.config import ConfigError
    from objbench.experiments.sweeper.plan import load_sweep

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "w", "seeds": 1, "set": {"train.steps": 30, "train.eval_every": 20},
        "arms": ["grpo", "dapo"],
        "report": {"endpoints": [{"metric": "eval/pass@1", "window": {"steps": [1, 10]}}],
                   "comparisons": [["dapo", "grpo"]]}}))
    with pytest.raises(ConfigError, match=r"eval/pass@1 \(steps 1-10\) holds no evaluation in arm 'grpo'"):
        load_sweep(spec, out_dir=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()

"""objbench card (issue 32): the measures' arithmetic by hand, the checks on the battery and the command line, and
one whole card on a small battery (marked ``card``: CI runs it beside the robustness step)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from objbench.experiments.card.measures import parse_measures, score_card, seed_values
from objbench.experiments.card.run import BATTERY_FILE, card_name, load_battery, user_settings
from objbench.experiments.config.errors import ConfigError


class FakeRuns:
    """analysis.load.Runs' three tables, written by hand."""

    def __init__(self, metrics: list[tuple], evals: list[tuple], steps: int):
        cols = ["run", "arm", "seed", "step", "metric", "value"]
        self.metrics = pd.DataFrame(metrics, columns=cols)
        self.evals = pd.DataFrame(evals, columns=cols)
        runs = sorted({(r, a, s) for r, a, s, *_ in metrics + evals})
        self.configs = pd.DataFrame([{"run": r, "arm": a, "seed": s, "train.steps": steps} for r, a, s in runs])


def _curve(run, arm, seed, metric, values):
    return [(run, arm, seed, step, metric, v) for step, v in values]


def test_paired_measure_and_its_t_interval_by_hand():
    # seed 0: on-policy AUC over steps 0..4 of pass@1 (0, 0.2, 0.4) at steps 0, 2, 4 = (0.1*2 + 0.3*2)/4 = 0.2;
    #         off-policy (0, 0, 0.2) -> (0 + 0.1*2)/4 = 0.05; difference 0.15
    # seed 1: on (0, 0.4, 0.4) -> (0.2*2 + 0.4*2)/4 = 0.3; off (0, 0.2, 0.2) -> (0.1*2 + 0.2*2)/4 = 0.15; diff 0.15
    # seed 2: on (0.2, 0.2, 0.6) -> (0.2*2 + 0.4*2)/4 = 0.3; off (0.2, 0.2, 0.2) -> 0.2; diff 0.1
    # mean 0.4/3 = 0.133333; sd of (0.15, 0.15, 0.1) = 0.028868; se = 0.016667; t_2(0.975) = 4.302653
    # half-width 0.071711 -> [0.061622, 0.205044]
    evals = []
    for seed, on, off in [(0, (0, .2, .4), (0, 0, .2)), (1, (0, .4, .4), (0, .2, .2)), (2, (.2, .2, .6), (.2, .2, .2))]:
        evals += _curve(f"standard__s{seed}", "standard", seed, "eval/pass@1", zip((0, 2, 4), on))
        evals += _curve(f"off__s{seed}", "off", seed, "eval/pass@1", zip((0, 2, 4), off))
    runs = FakeRuns([], evals, steps=4)
    [m] = parse_measures([{"name": "loss", "diagnostic": "off-policy", "arm": "standard", "metric": "eval/pass@1",
                           "window": "auc", "minus": {"arm": "off"}, "unit": "pass@1", "high": "loses"}],
                         ["standard", "off"])
    assert seed_values(runs, m).round(6).tolist() == [0.15, 0.15, 0.1]
    row = score_card(runs, [m]).iloc[0]
    assert row["score"] == pytest.approx(0.133333, abs=1e-6)
    assert (row["low"], row["high"]) == (pytest.approx(0.061622, abs=1e-6), pytest.approx(0.205044, abs=1e-6))
    assert row["seeds"] == 3 and row["signed"]


def test_last_window_counts_steps_and_a_missing_seed_is_left_out():
    # kl/exact logged at steps 1..10 for seed 0 (value = step / 10) and never for seed 1; last 3 steps of a
    # 10-step schedule = steps 8, 9, 10 -> mean 0.9; one seed: no interval
    metrics = _curve("standard__s0", "standard", 0, "kl/exact", [(s, s / 10) for s in range(1, 11)])
    metrics += _curve("standard__s1", "standard", 1, "policy/entropy", [(1, 0.5)])
    runs = FakeRuns(metrics, [], steps=10)
    [m] = parse_measures([{"name": "kl", "diagnostic": "drift", "arm": "standard", "metric": "kl/exact",
                           "window": {"last": 3}, "unit": "nats", "high": "drifts"}], ["standard"])
    assert seed_values(runs, m).to_dict() == {0: pytest.approx(0.9)}
    row = score_card(runs, [m]).iloc[0]
    assert row["seeds"] == 1 and np.isnan(row["low"]) and not row["signed"]


@pytest.mark.parametrize("item,problem", [
    ({"arm": "nope"}, "not one of the battery's arms"),
    ({"colour": "red"}, "unknown key"),
    ({"window": {"last": 0}}, "K >= 1"),
    ({"minus": {"arm": "standard"}}, "repeats the measure's own term"),
    ({"unit": ""}, "'unit' must be a non-empty string"),
])
def test_bad_measures_are_named(item, problem):
    base = {"name": "m", "diagnostic": "d", "arm": "standard", "metric": "eval/acc", "unit": "u", "high": "h"}
    with pytest.raises(ValueError, match=problem):
        parse_measures([{**base, **item}], ["standard"])


def test_the_battery_declares_at_least_six_diagnostics_over_its_arms():
    b = load_battery()
    assert b.path == BATTERY_FILE and b.seeds >= 2
    assert len({m.diagnostic for m in b.measures}) >= 6
    assert {m.term.arm for m in b.measures} | {m.minus.arm for m in b.measures if m.minus} == set(b.arms)


def test_card_settings_are_the_objective_only():
    b = load_battery()
    s = user_settings(["objective=dr_grpo", "objective.ratio.eps_high=0.3", "optim.lr=1e-4"], b)
    assert s == {"objective": "dr_grpo", "objective.ratio.eps_high": 0.3, "optim.lr": 1e-4}
    assert card_name(s) == "dr_grpo__objective.ratio.eps_high=0.3__optim.lr=0.0001"
    assert card_name({}) == "grpo"
    for bad, why in [("train.steps=10", "a card varies only"), ("task.name=countdown", "a card varies only"),
                     ("objectiveX=1", "a card varies only"), ("objective.kl.beta", "key=value")]:
        with pytest.raises(ConfigError, match=why):
            user_settings([bad], b)
    with pytest.raises(ConfigError, match="given twice"):
        user_settings(["optim.lr=1", "optim.lr=2"], b)


def small_battery(folder: Path) -> Path:
    """The real battery's arms and measures at a tiny budget (a few steps, short warm starts, 2 seeds)."""
    d = yaml.safe_load(BATTERY_FILE.read_text())
    d["sweep"]["base"] = str((BATTERY_FILE.parent / d["sweep"]["base"]).resolve())
    tiny = {"train.steps": 4, "train.eval_every": 2, "train.eval_samples": 4, "train.log_samples": 0,
            "train.checkpoint_every": 0, "sft.steps": 40, "sft.until_acc": 0, "sft.noise_steps": 0,
            "rollout.completions_per_step": 16}
    for arm in d["sweep"]["arms"].values():
        arm.update(tiny)
    d["seeds"] = 2
    path = folder / "battery_small.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def test_bad_card_input_fails_before_any_folder(tmp_path, capsys):
    from objbench.experiments.cli.main import main

    out = tmp_path / "out"
    assert main(["card", "task.name=countdown", "--out", str(out)]) == 2
    assert main(["card", "objective=no_such_preset", "--out", str(out)]) == 2
    assert main(["card", "--seeds", "1", "--out", str(out)]) == 2
    assert "a card varies only" in capsys.readouterr().err
    assert main(["card", "--from-data", str(tmp_path), "--out", str(out)]) == 2  # no runs.csv.gz there
    assert "runs.csv.gz does not exist" in capsys.readouterr().err
    assert main(["card", "--from-data", str(tmp_path), "objective=dapo", "--out", str(out)]) == 2
    assert "settings cannot be given with it" in capsys.readouterr().err
    study = Path(__file__).resolve().parents[1] / "results" / "temperature_control"  # a study's data, not a card's
    assert main(["card", "--from-data", str(study), "--out", str(out)]) == 2
    assert "holds no card's runs" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.card
def test_a_whole_card_with_a_reference_and_a_plugin(tmp_path, monkeypatch):
    from objbench.experiments.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    battery = small_battery(tmp_path)
    ref = Path("results/cards/grpo")
    assert main(["card", "--battery", str(battery), "--out", str(ref), "--runs", "runs/grpo", "--workers", "2"]) == 0
    table = pd.read_csv(ref / "card.csv")
    assert len(table) == 12 and (table["seeds"] <= 2).all()
    # every measure but the filler growth (filler needs a wrong and a right answer with filler in a step, which a
    # 40-step warm start rarely gives) has an interval from both seeds
    both = table[table["name"] != "filler_gap_growth"]
    assert (both["seeds"] == 2).all() and np.isfinite(both[["low", "high"]].to_numpy()).all()
    for f in ("card.md", "card.png", "card.pdf", "card_seeds.csv", "runs.csv.gz", "card_spec.yaml"):
        assert (ref / f).is_file(), f

    plugin = shutil.copy(Path(__file__).resolve().parents[1] / "examples" / "gpg_plugin.py", tmp_path / "gpg.py")
    out = tmp_path / "gpg_card"
    assert main(["card", "--battery", str(battery), "--out", str(out), "--workers", "2", "--import", str(plugin),
                 "objective.ratio.surrogate=gpg"]) == 0
    md = (out / "card.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| diagnostic"))
    assert header.endswith("| seeds | controls separated | grpo |")  # the reference card's column
    assert "Plug-in" in md and "sha256" in md
    seeds = pd.read_csv(out / "card_seeds.csv")
    assert set(seeds["measure"]) <= set(table["name"]) and set(seeds["seed"]) == {0, 1}

    # re-scored from its data alone (the run folders gone): the same numbers, the plug-in's hash kept
    shutil.rmtree(out / "runs")
    again = tmp_path / "gpg_again"
    assert main(["card", "--from-data", str(out), "--out", str(again), "--battery", str(battery)]) == 0
    for f in ("card.csv", "card_seeds.csv", "runs.csv.gz", "runs_meta.json"):
        assert (again / f).read_bytes() == (out / f).read_bytes(), f
    md = (again / "card.md").read_text()
    assert "re-scoring the runs made by `objbench card" in md and "sha256" in md and "Runs made at commit" in md


def test_a_control_pair_by_hand():
    # kl/exact final: config a gives (0.1, 0.2, 0.3), b gives (0.3, 0.5, 0.4) on seeds 0-2: b - a = (0.2, 0.3, 0.1),
    # mean 0.2, sd 0.1, se 0.057735, t_2(0.975) = 4.302653, half-width 0.248414 -> [-0.048414, 0.448414]: not
    # validated; permutation p: only the all-plus and all-minus sign patterns reach |0.6| -> 2/8 = 0.25; the first
    # 2 seeds: (0.2, 0.3), mean 0.25, se 0.05, t_1(0.975) = 12.706205 -> [-0.385310, 0.885310]
    from objbench.experiments.card.controls import control_row

    metrics = []
    for seed, (a, b) in enumerate([(0.1, 0.3), (0.2, 0.5), (0.3, 0.4)]):
        metrics += _curve(f"standard__a__s{seed}", "standard__a", seed, "kl/exact", [(1, 0.0), (2, a)])
        metrics += _curve(f"standard__b__s{seed}", "standard__b", seed, "kl/exact", [(1, 0.0), (2, b)])
    [m] = parse_measures([{"name": "kl", "diagnostic": "drift", "arm": "standard", "metric": "kl/exact",
                           "unit": "nats", "high": "drifts"}], ["standard"])
    row = control_row(FakeRuns(metrics, [], steps=2), m, "a", "b", card_seeds=2)
    assert row["difference"] == pytest.approx(0.2)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(-0.048414, abs=1e-6), pytest.approx(0.448414, abs=1e-6))
    assert row["p_permutation"] == pytest.approx(0.25) and not row["validated"] and row["seeds"] == 3
    assert (row["card_ci_low"], row["card_ci_high"]) == (pytest.approx(-0.385310, abs=1e-6),
                                                         pytest.approx(0.885310, abs=1e-6))
    assert row["low_mean"] == pytest.approx(0.2) and row["high_mean"] == pytest.approx(0.4)


def test_the_validation_file_covers_every_diagnostic_and_loads():
    from objbench.experiments.card.validation import load_validation, validation_spec

    b = load_battery()
    v = load_validation(None, b)
    assert v.seeds > v.card_seeds >= 2
    measures = {m.name: m for m in b.measures}
    assert {measures[c["measure"]].diagnostic for c in v.controls} == {m.diagnostic for m in b.measures}
    spec = validation_spec(b, v, v.seeds)
    assert spec["arms"]["updates8__no_clip"]["objective.n_epochs"] == 2  # the arm's setting and the config's
    assert spec["arms"]["updates8__no_clip"]["objective.ratio.eps_high"] == 1000.0


def test_validation_status_takes_any_round_that_separated(tmp_path):
    from objbench.experiments.card.report import validation_status

    cols = "measure,low,high,validated,card_separates,card_seeds\n"
    (tmp_path / "validation").mkdir()
    (tmp_path / "validation" / "validation.csv").write_text(
        cols + "kl,grpo,beta0,False,False,5\nauc,lr_low,grpo,True,True,5\nent,grpo,bonus,False,False,5\n")
    (tmp_path / "validation_v2").mkdir()
    (tmp_path / "validation_v2" / "validation.csv").write_text(cols + "kl,strong,beta0,True,False,5\n")
    assert validation_status(tmp_path) == {"kl": "yes (validation_v2: beta0 > strong; not at 5 seeds)",
                                           "auc": "yes (validation: grpo > lr_low; also at 5 seeds)", "ent": "no"}
    assert validation_status(tmp_path / "nothing_here") == {}


def test_the_second_validation_round_loads_and_names_its_own_sweep():
    from objbench.experiments.card.validation import VALIDATION_FILE, load_validation, validation_spec

    b = load_battery()
    v = load_validation(VALIDATION_FILE.parent / "validation_v2.yaml", b)
    spec = validation_spec(b, v, v.seeds)
    assert spec["name"] == "card_validation_v2"  # its runs never mix with the first round's
    assert set(spec["arms"]) == {"length__grpo", "length__hot", "standard__beta0", "standard__grpo",
                                 "standard__kl_strong", "standard__lr_low"}
    assert validation_spec(b, load_validation(None, b), 10)["name"] == "card_validation"


@pytest.mark.card
def test_a_whole_validation_on_a_small_battery(tmp_path, monkeypatch):
    from objbench.experiments.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    battery = small_battery(tmp_path)
    assert main(["card", "--validate", "--battery", str(battery), "--seeds", "2", "--out", "val", "--workers",
                 "2"]) == 0
    table = pd.read_csv("val/validation.csv")
    assert len(table) == 12 and set(table["seeds"]) <= {0, 2}
    assert "measures separate their controls" in Path("val/validation.md").read_text()
    assert main(["card", "--validate", "--from-data", "val", "--out", "val2", "--battery", str(battery)]) == 0
    assert Path("val2/validation.csv").read_text() == Path("val/validation.csv").read_text()

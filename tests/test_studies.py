"""Study sections (analysis/studies/): closed forms worked out by hand, the windows on a synthetic sweep, and whole
reports on run folders in the layout of each committed study, as they were made (no declared comparisons) and as
the updated specs declare them."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from objbench.analysis.plots import arm_colors
from objbench.analysis.report import write_report
from objbench.analysis.studies import closed_form_weight
from objbench.analysis.studies.difficulty_bias import bucket_curves
from objbench.analysis.synthetic import STUDY_ARMS, write_study_sweep

REPO = Path(__file__).resolve().parent.parent
SPEC_OF = {"length_bias": "length_bias", "difficulty_bias": "difficulty_bias", "kl_estimators": "kl_estimators",
           "off_policy": "off_policy"}


def test_closed_form_group_weight_by_hand():
    # G = 8, k = 4: |r - 1/2| = 1/2 for all 8 -> sum 4; std (ddof 1) = sqrt(8 * 1/4 / 7) = sqrt(2/7) = 0.53452
    assert closed_form_weight(4, 8, "group", eps=0.0) == pytest.approx(4 / math.sqrt(2 / 7))   # 7.4833
    assert closed_form_weight(4, 8, "none") == pytest.approx(4.0)
    # k = 1: sum |r - 1/8| = 7/8 + 7 * 1/8 = 1.75; std = sqrt((49/64 + 7/64) / 7) = sqrt(1/8) = 0.35355
    assert closed_form_weight(1, 8, "group", eps=0.0) == pytest.approx(1.75 / math.sqrt(1 / 8))  # 4.9497
    assert closed_form_weight(1, 8, "none") == pytest.approx(1.75)
    # the shapes: hard/easy vs balanced group = sqrt(7)/4 with std scaling, 7/16 without
    assert closed_form_weight(1, 8, "group", 0.0) / closed_form_weight(4, 8, "group", 0.0) == pytest.approx(math.sqrt(7) / 4)
    assert closed_form_weight(7, 8, "none") / closed_form_weight(4, 8, "none") == pytest.approx(7 / 16)
    # all-equal groups carry no weight
    assert closed_form_weight(0, 8, "group") == closed_form_weight(8, 8, "none") == 0.0
    assert math.isnan(closed_form_weight(3, 8, "batch"))


def _runs(values):
    """A Runs object from {(arm, seed): [value at step 1, 2, ...]} for metric 'm'."""
    import pandas as pd

    from objbench.analysis.load import Runs

    rows, cfg = [], []
    for (arm, seed), vals in values.items():
        run = f"{arm}__s{seed}"
        rows += [{"run": run, "arm": arm, "seed": seed, "step": i + 1, "tokens": 0, "metric": "m", "value": v}
                 for i, v in enumerate(vals)]
        cfg.append({"run": run, "arm": arm, "seed": seed, "complete": True, "path": "."})
    arms = list(dict.fromkeys(a for a, _ in values))
    return Runs(root=".", metrics=pd.DataFrame(rows), evals=pd.DataFrame(columns=["run"]),
                configs=pd.DataFrame(cfg), sweep={"arms": arms, "name": "t"})


def test_windows_and_paired_differences_by_hand():
    from objbench.analysis import studies

    # 100 steps: value 1.0 on steps 1-20, 0.5 on 21-50, then 3.0 (arm a) / 2.0 (arm b) + seed/10 on 51-100
    def vals(end, seed):
        return [1.0] * 20 + [0.5] * 30 + [end + seed / 10] * 50

    runs = _runs({("a", 0): vals(3.0, 0), ("a", 1): vals(3.0, 1), ("b", 0): vals(2.0, 0), ("b", 1): vals(2.0, 1)})
    wt = studies.window_table(runs, ["m"], n_resamples=200).set_index("arm")
    # start window = steps 1-20 -> 1.0; end window = last 50 steps -> 3.05 (a: 3.0 and 3.1), 2.05 (b)
    assert wt.loc["a", "start"] == 1.0 and abs(wt.loc["a", "end"] - 3.05) < 1e-12
    assert abs(wt.loc["a", "change"] - 2.05) < 1e-12 and abs(wt.loc["b", "change"] - 1.05) < 1e-12
    d = studies.paired_diff(runs, "m", "a", "b", n_resamples=200)
    # per seed: a - b = 1.0 exactly for both seeds, so the t interval collapses onto 1.0; sign test 2/2: p = 2/4
    assert d["n"] == 2 and abs(d["mean"] - 1.0) < 1e-12 and abs(d["lo"] - 1.0) < 1e-12 and d["wins"] == 2
    assert d["interval"] == "t" and d["sign_p"] == 0.5 and d["perm_p"] == 0.5
    dc = studies.paired_diff(runs, "m", "a", "b", change=True, n_resamples=200)
    assert abs(dc["mean"] - 1.0) < 1e-12  # both start at 1.0
    et = studies.end_table(runs, ["m"], n_resamples=200).set_index("arm")
    assert abs(et.loc["b", "mean"] - 2.05) < 1e-12
    with pytest.raises(ValueError, match="unknown study"):
        studies.study_section("nope", runs, ".")


# ------------------------------------------------------------------------------------------------ whole reports
@pytest.mark.parametrize("study", sorted(STUDY_ARMS))
def test_report_on_the_committed_layout(study, tmp_path):
    """Run folders as the committed studies were made (sweep.json report: {primary, study}, nothing declared)."""
    root = write_study_sweep(tmp_path / study, study, seeds=(0, 1, 2), steps=60, eval_every=30)
    md = write_report(root, dpi=30).read_text()
    assert "## Study: " in md and "**No comparisons were declared**" in md
    assert "percentile" not in md.split("## Study")[1]  # the study tables use t intervals on 3 seeds
    assert "*Exploratory: not pre-registered, no verdict, p-values not adjusted for multiplicity.*" in md
    assert "| interval |" in md.split("## Study")[1]


@pytest.mark.parametrize("study", sorted(STUDY_ARMS))
def test_report_with_the_updated_spec(study, tmp_path):
    """The committed spec's report section (declared endpoints and comparisons): verdicts for exactly those, the
    study section leaves them out of its exploratory tables, and a run made under another spec version is named."""
    section = yaml.safe_load((REPO / "experiments" / "sweeps" / f"{SPEC_OF[study]}.yaml").read_text())["report"]
    root = write_study_sweep(tmp_path / study, study, seeds=(0, 1, 2), steps=60, eval_every=30, report=section)
    first = sorted(p for p in root.iterdir() if p.is_dir())[0]
    meta = json.loads((first / "meta.json").read_text())
    (first / "meta.json").write_text(json.dumps({**meta, "spec_hash": "0ld0ld0ld0ld"}))
    out = write_report(root, dpi=30).parent
    md = (out / "report.md").read_text()
    cmp = pd.read_csv(out / "comparisons.csv")
    from objbench.analysis.prereg import parse_plan

    plan = parse_plan(section, list(STUDY_ARMS[study]))
    assert len(cmp) == plan.family_size and (cmp["n"] == 3).all()
    assert set(cmp["verdict"]) == {"not resolved"}  # 3 seeds: the permutation test cannot reach p < alpha/m
    assert cmp["underpowered"].str.startswith("underpowered: 3 seeds").all()
    assert "1 run(s) were made under another version of the sweep spec** (hash `0ld0ld0ld0ld`" in md
    study_md = md.split("## Study")[1]
    assert "are declared in the sweep spec: their verdicts are in 'Pre-registered comparisons' above" in study_md
    # each spec declares every paired comparison its study section used to show: none is left as exploratory
    assert "(Every comparison of this table is declared in the sweep spec.)" in study_md
    for a, b in plan.comparisons:
        assert f"| {a} - {b} |" not in study_md


def test_bucket_shares_by_hand(tmp_path):
    """The difficulty section's per-bucket table: the mean over steps of accuracy and weight share per run, then
    over seeds, with the mixture's subtasks named."""
    import matplotlib

    matplotlib.use("Agg")
    from objbench.analysis import studies
    from objbench.analysis.load import Runs

    rows, cfg = [], []
    comps = [{"name": "arithmetic", "ops": ["+"], "difficulty_weights": [[1, 1.0]]},
             {"name": "arithmetic", "ops": ["-"], "difficulty_weights": [[2, 1.0]]}]
    for arm, share1 in (("g", 0.25), ("n", 0.5)):
        for seed in (0, 1):
            run = f"{arm}__s{seed}"
            for step in (1, 2, 3):
                # share of bucket 1: share1 + seed/10 on every step -> means g 0.30, n 0.55; bucket 2 the rest
                s1 = share1 + seed / 10
                vals = {"reward/acc_d1": 0.9, "reward/acc_d2": 0.1 * step,
                        "adv/weight_share_d1": s1, "adv/weight_share_d2": 1 - s1}
                rows += [{"run": run, "arm": arm, "seed": seed, "step": step, "tokens": 0, "metric": k, "value": v}
                         for k, v in vals.items()]
            cfg.append({"run": run, "arm": arm, "seed": seed, "complete": True, "path": ".",
                        "task.name": "mixture", "task.components": comps})
    runs = Runs(root=".", metrics=pd.DataFrame(rows), evals=pd.DataFrame(columns=["run"]),
                configs=pd.DataFrame(cfg), sweep={"arms": ["g", "n"], "name": "t"})
    L = bucket_curves(runs, tmp_path, ["reward/acc_d1", "reward/acc_d2"], ["g", "n"],
                               arm_colors(["g", "n"]), 60)
    t = pd.read_csv(tmp_path / "bucket_shares.csv").set_index(["bucket", "arm"])
    assert t.loc[(1, "g"), "share"] == pytest.approx(0.30) and t.loc[(1, "n"), "share"] == pytest.approx(0.55)
    assert t.loc[(2, "g"), "share"] == pytest.approx(0.70)
    # accuracy of bucket 2 rises 0.1, 0.2, 0.3: area under the curve / span = mean height 0.2
    assert t.loc[(2, "n"), "acc"] == pytest.approx(0.2)
    assert any("| 2: arithmetic - 2-digit | n | 2 |" in line for line in L)
    assert (tmp_path / "buckets.png").stat().st_size > 0

"""analysis.tables: final scores, pairwise P(X > Y), aggregates, and provenance in every output format."""

import json

import numpy as np
import pandas as pd
import pytest

from objbench.analysis.tables import (
    Provenance,
    bucket_aggregate_table,
    format_aggregate_table,
    final_scores,
    final_table,
    format_final_table,
    format_improvement_table,
    improvement_table,
    pairwise_table,
    to_latex,
    to_markdown,
    write_table,
)


def long_frame():
    """Evals of 2 arms x 3 seeds at steps 0, 10, 20; final (step 20) values are hand-picked:
    good: 0.6, 0.7, 0.8 (mean 0.7); bad: 0.1, 0.2, 0.7 (mean 1/3). At step 10 every value is 0.5 and at step 0
    every value is 0.0. eval/acc_d1 = final + 0.1, eval/acc_d2 = final - 0.1."""
    finals = {"good": [0.6, 0.7, 0.8], "bad": [0.1, 0.2, 0.7]}
    rows = []
    for arm, vals in finals.items():
        for seed, v in enumerate(vals):
            for step, val in ((0, 0.0), (10, 0.5), (20, v)):
                for metric, off in (("eval/acc", 0.0), ("eval/acc_d1", 0.1), ("eval/acc_d2", -0.1)):
                    rows.append({"run": f"{arm}__s{seed}", "arm": arm, "seed": seed, "step": step,
                                 "tokens": 100.0 * step, "metric": metric, "value": val + (off if step else 0.0)})
    return pd.DataFrame(rows)


PROV = Provenance(sweep="tiny_sweep", spec_hash="0123456789ab", commit="deadbeefcafe", seeds=(0, 1, 2),
                  runs_command="objbench sweep experiments/sweeps/tiny.yaml",
                  report_command="objbench report results/runs/tiny_sweep", notes="final = the last evaluation")


def test_final_scores_last_k():
    fs = final_scores(long_frame(), "eval/acc")
    assert list(fs.columns) == ["run", "arm", "seed", "value", "first_step", "last_step"]
    assert fs.set_index("run").loc["bad__s2", "value"] == pytest.approx(0.7)
    assert (fs["last_step"] == 20).all()
    fs2 = final_scores(long_frame(), "eval/acc", last_k=2)
    assert fs2.set_index("run").loc["good__s0", "value"] == pytest.approx((0.5 + 0.6) / 2)
    # last_k larger than the points after step 0: the start policy (step 0) is still not averaged in
    fs3 = final_scores(long_frame(), "eval/acc", last_k=5)
    assert fs3.set_index("run").loc["good__s0", "value"] == pytest.approx((0.5 + 0.6) / 2)
    assert (fs3["first_step"] == 10).all()
    assert final_scores(long_frame(), "eval/missing").empty
    with pytest.raises(ValueError, match="missing column"):
        final_scores(long_frame().drop(columns="step"), "eval/acc")


def test_final_table_values():
    ft = final_table(long_frame(), ["eval/acc", "eval/missing"], arms=["good", "bad"], n_resamples=2000)
    assert list(ft["arm"]) == ["good", "bad"] and set(ft["metric"]) == {"eval/acc"}
    good, bad = ft.iloc[0], ft.iloc[1]
    assert good["n"] == 3 and good["mean"] == pytest.approx(0.7) and good["iqm"] == pytest.approx(0.7)
    assert bad["mean"] == pytest.approx(1 / 3) and bad["std"] == pytest.approx(np.std([0.1, 0.2, 0.7], ddof=1))
    # 3 seeds: t intervals, t_2(0.975) = 4.3026527. good: s = 0.1 -> half-width 4.3026527 * 0.1 / sqrt(3) = 0.248414
    assert (good["interval"], bad["interval"]) == ("t", "t")
    assert good["ci_high"] - good["mean"] == pytest.approx(0.2484138, abs=1e-6)
    # bad: 0.1 0.2 0.7, s^2 = (0.0544 + 0.0178 + 0.1344) / 2 = 0.103333 -> half-width 4.3026527 * 0.321455 / sqrt(3)
    # = 0.798529: wider than the [min, max] = [0.1, 0.7] a 3-seed percentile bootstrap would give
    assert bad["ci_low"] == pytest.approx(1 / 3 - 0.798529, abs=1e-5) and bad["ci_low"] < 0.1 < 0.7 < bad["ci_high"]
    assert good["steps"] == "20"
    # arm order given by the caller; reproducible
    again = final_table(long_frame(), ["eval/acc"], arms=["good", "bad"], n_resamples=2000)
    pd.testing.assert_frame_equal(ft, again)


def test_pairwise_table_hand_values():
    pw = pairwise_table(long_frame(), "eval/acc", arms=["good", "bad"], n_resamples=1000)
    assert list(zip(pw.x, pw.y)) == [("good", "bad"), ("bad", "good")]
    # good (0.6, 0.7, 0.8) vs bad (0.1, 0.2, 0.7): 0.6 beats 2, 0.7 beats 2 and ties 1, 0.8 beats 3
    # -> (2 + 2.5 + 3) / 9; the reverse is 1 - that
    assert pw.p.iloc[0] == pytest.approx(7.5 / 9)
    assert pw.p.iloc[1] == pytest.approx(1.5 / 9)
    assert (pw.n_x == 3).all()


def test_bucket_aggregate_table():
    agg = bucket_aggregate_table(long_frame(), ["eval/acc_d1", "eval/acc_d2"], arms=["good", "bad"], n_resamples=500)
    good = agg.set_index("arm").loc["good"]
    # 6 values: 0.7 0.8 0.9 (d1) and 0.5 0.6 0.7 (d2); mean 0.7; IQM drops one at each end -> mean(0.6 .. 0.8)
    assert good["mean"] == pytest.approx(0.7)
    assert good["iqm"] == pytest.approx(np.mean([0.6, 0.7, 0.7, 0.8]))
    assert good["n"] == 3 and good["buckets"] == "eval/acc_d1,eval/acc_d2"
    # 3 seeds: no bootstrap. The mean gets a t interval over the seeds' bucket means (0.6, 0.7, 0.8: s = 0.1), the
    # IQM no interval
    assert good["mean_interval"] == "t" and good["mean_high"] - good["mean"] == pytest.approx(0.2484138, abs=1e-6)
    assert good["iqm_interval"] == "none" and np.isnan(good["iqm_low"])
    shown = format_aggregate_table(agg)
    assert shown.iloc[0]["IQM 95% CI"] == "n/a (< 10 seeds)" and shown.iloc[0]["mean interval"] == "t"


def test_bucket_aggregate_table_bca_from_ten_seeds():
    rows = []
    for seed in range(10):
        for metric, v in (("eval/acc_d1", 0.5 + 0.03 * seed), ("eval/acc_d2", 0.2 + 0.01 * seed ** 1.5)):
            rows.append({"run": f"x__s{seed}", "arm": "x", "seed": seed, "step": 10, "tokens": 0.0, "metric": metric,
                         "value": v})
    agg = bucket_aggregate_table(pd.DataFrame(rows), ["eval/acc_d1", "eval/acc_d2"], n_resamples=500).iloc[0]
    assert (agg["iqm_interval"], agg["mean_interval"]) == ("BCa", "BCa")
    assert agg["iqm_low"] < agg["iqm"] < agg["iqm_high"] and agg["mean_low"] < agg["mean"] < agg["mean_high"]


def test_markdown_has_numbers_and_provenance():
    ft = final_table(long_frame(), ["eval/acc"], arms=["good", "bad"], n_resamples=500)
    md = to_markdown(format_final_table(ft), PROV)
    lines = md.strip().splitlines()
    assert lines[0].startswith("| metric | arm | n seeds | mean | 95% CI | interval | IQM")
    assert "| eval/acc | good | 3 | 0.700 | [0.452, 0.948] | t | 0.700 |" in md
    assert "| eval/acc | good | 3 | 0.700 |" in md and "0.333" in md
    stamp = lines[-1]
    assert stamp.startswith("Provenance:")
    for s in ("`0123456789ab`", "`deadbeefcafe`", "seeds 0,1,2", "`objbench sweep experiments/sweeps/tiny.yaml`",
              "`objbench report results/runs/tiny_sweep`", "final = the last evaluation"):
        assert s in stamp


def test_latex_escapes_and_stamps():
    df = pd.DataFrame({"arm": ["dr_grpo"], "acc %": [0.5]})
    tex = to_latex(df, PROV, caption="Final 50% & more")
    assert tex.startswith("% sweep tiny_sweep\n% spec 0123456789ab\n% commit deadbeefcafe")
    assert "dr\\_grpo & 0.500 \\\\" in tex and "acc \\%" in tex
    assert "\\caption{Final 50\\% \\& more {\\footnotesize sweep tiny\\_sweep; spec 0123456789ab" in tex
    assert "objbench report results/runs/tiny\\_sweep" in tex
    assert tex.count("\\begin{tabular}{ll}") == 1 and "\\bottomrule" in tex


def test_write_table_csv_roundtrip_and_sidecar(tmp_path):
    ft = final_table(long_frame(), ["eval/acc"], arms=["good", "bad"], n_resamples=500)
    paths = write_table(ft, tmp_path / "final", PROV, display=format_final_table(ft))
    assert sorted(p.name for p in paths.values()) == ["final.csv", "final.md", "final.provenance.json", "final.tex"]
    back = pd.read_csv(paths["csv"])  # plain CSV: no comment lines to skip
    np.testing.assert_allclose(back["mean"], ft["mean"])
    assert list(back["arm"]) == ["good", "bad"]
    prov = json.loads(paths["provenance"].read_text())
    assert prov["spec_hash"] == "0123456789ab" and prov["commit"] == "deadbeefcafe"
    assert prov["seeds"] == [0, 1, 2] and prov["table"] == "final.csv"
    assert prov["runs_command"] == "objbench sweep experiments/sweeps/tiny.yaml"
    assert prov["report_command"] == "objbench report results/runs/tiny_sweep"
    assert "0123456789ab" in paths["md"].read_text() and "deadbeefcafe" in paths["tex"].read_text()


def test_stamp_names_mixed_commits():
    p = Provenance("s", None, "aaa", (0,), None, "cmd", run_commits=("aaa", "bbb"))
    s = p.stamp()
    assert "spec n/a (no sweep.json)" in s and "runs also at bbb" in s and "runs: n/a" in s


def paired_frame():
    """eval/pass@1 of 2 arms x 3 seeds at steps 0, 50, 100. Step 0 (the shared start) is 0.2, 0.3, 0.4 for
    seeds 0, 1, 2 in both arms; step 50 is 0.9 everywhere (never final); finals (step 100):
    up: 0.5, 0.5, 0.6 -> differences 0.3, 0.2, 0.2 (mean 0.7/3), 3/3 improved;
    flat: 0.1, 0.3, 0.5 -> differences -0.1, 0.0, 0.1 (mean 0), 1/3 improved (a tie is not an improvement)."""
    starts = [0.2, 0.3, 0.4]
    finals = {"up": [0.5, 0.5, 0.6], "flat": [0.1, 0.3, 0.5]}
    rows = []
    for arm, vals in finals.items():
        for seed, (s0, f) in enumerate(zip(starts, vals)):
            for step, v in ((0, s0), (50, 0.9), (100, f)):
                rows.append({"run": f"{arm}__s{seed}", "arm": arm, "seed": seed, "step": step,
                             "tokens": 10.0 * step, "metric": "eval/pass@1", "value": v})
    return pd.DataFrame(rows)


def test_improvement_table_hand_values():
    imp = improvement_table(paired_frame(), "eval/pass@1", arms=["up", "flat"], n_resamples=2000)
    assert list(imp.columns) == ["metric", "arm", "n", "start_mean", "final_mean", "diff_mean", "diff_low",
                                 "diff_high", "interval", "n_improved", "steps"]
    up, flat = imp.set_index("arm").loc["up"], imp.set_index("arm").loc["flat"]
    assert up["n"] == 3 and up["start_mean"] == pytest.approx(0.3) and up["final_mean"] == pytest.approx(1.6 / 3)
    assert up["diff_mean"] == pytest.approx(0.7 / 3) and round(up["diff_mean"], 4) == 0.2333
    assert up["n_improved"] == 3 and up["steps"] == "100"
    # seed-paired t interval over the differences (0.3, 0.2, 0.2): s = sqrt(1/300) = 0.057735, half-width
    # 4.3026527 * 0.057735 / sqrt(3) = 0.143422 (an unpaired interval would be far wider)
    assert up["interval"] == "t"
    assert up["diff_high"] - up["diff_mean"] == pytest.approx(0.143422, abs=1e-6)
    assert flat["diff_mean"] == pytest.approx(0.0, abs=1e-12) and flat["n_improved"] == 1
    # flat: (-0.1, 0, 0.1), s = 0.1 -> half-width 0.248414
    assert flat["diff_high"] == pytest.approx(0.2484138, abs=1e-6) and flat["diff_low"] == pytest.approx(-0.2484138,
                                                                                                         abs=1e-6)
    shown = format_improvement_table(imp)
    assert list(shown.columns) == ["arm", "n seeds", "start (step 0)", "final", "final - start", "95% CI", "interval",
                                   "improved", "final steps"]
    assert shown.iloc[0].tolist()[:5] == ["up", "3", "0.300", "0.533", "+0.233"]
    assert shown.iloc[0]["improved"] == "3/3" and shown.iloc[1]["improved"] == "1/3"
    assert shown.iloc[1]["final - start"] in ("+0.000", "-0.000")
    assert shown.iloc[0]["95% CI"] == "[+0.090, +0.377]" and shown.iloc[0]["interval"] == "t"
    # reproducible, and last_k=2 averages steps 50 and 100 for the final value
    pd.testing.assert_frame_equal(imp, improvement_table(paired_frame(), "eval/pass@1", arms=["up", "flat"],
                                                         n_resamples=2000))
    k2 = improvement_table(paired_frame(), "eval/pass@1", arms=["up"], last_k=2, n_resamples=200).iloc[0]
    assert k2["final_mean"] == pytest.approx((0.9 + 1.6 / 3) / 2) and k2["steps"] == "50-100"


def test_improvement_table_pairs_only_complete_runs():
    f = paired_frame()
    f = f[~((f["run"] == "up__s0") & (f["step"] == 0))]          # no start: left out
    f = f[~((f["run"] == "up__s1") & (f["step"] > 0))]           # only the start: nothing to pair, left out
    imp = improvement_table(f, "eval/pass@1", arms=["up", "flat"], n_resamples=200)
    up = imp.iloc[0]
    assert up["arm"] == "up" and up["n"] == 1
    assert up["start_mean"] == pytest.approx(0.4) and up["final_mean"] == pytest.approx(0.6)
    assert np.isnan(up["diff_low"]) and np.isnan(up["diff_high"])  # one seed: no interval
    assert format_improvement_table(imp)["95% CI"].iloc[0] == "n/a (n<2)"
    assert imp.iloc[1]["n"] == 3
    assert improvement_table(f, "eval/missing").empty
    assert improvement_table(f[f["step"] > 0], "eval/pass@1").empty  # no step 0 at all

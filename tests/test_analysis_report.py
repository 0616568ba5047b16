"""write_report end to end on a synthetic sweep, and the figure helpers (colours, labels, missing metrics)."""

import inspect
import json
import re

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from objbench.analysis.load import IncompleteRunWarning, load_runs
from objbench.analysis.plots import TRAINING_PANELS, arm_colors, plot_final, plot_panels
from objbench.analysis.report import final_metrics, panel_curves, report_command, resolve_primary, write_report
from objbench.analysis.synthetic import write_synthetic_sweep

ARMS = ("grpo", "dr_grpo")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """2 complete arms x 3 seeds, plus a third arm (ppo) listed in sweep.json whose only run is half-written."""
    root = tmp_path_factory.mktemp("sweeps") / "synth"
    write_synthetic_sweep(root, arms=ARMS + ("ppo",), seeds=(0, 1, 2), steps=8, eval_every=4)
    for seed in (0, 1, 2):  # keep ppo__s0 only, and make it half-written
        d = root / f"ppo__s{seed}"
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    scratch = tmp_path_factory.mktemp("scratch")
    write_synthetic_sweep(scratch, arms=("ppo",), seeds=(0,), steps=8, eval_every=4, incomplete=["ppo__s0"])
    (scratch / "ppo__s0").rename(root / "ppo__s0")
    return root


@pytest.fixture(scope="module")
def report(sweep):
    with pytest.warns(IncompleteRunWarning, match="ppo__s0"):
        path = write_report(sweep)
    return path


def test_report_files(report):
    out = report.parent
    assert report.name == "report.md" and out.name == "report"
    names = {p.name for p in out.iterdir()}
    for stem in ("final", "pairwise", "difficulty"):
        assert {f"{stem}.md", f"{stem}.tex", f"{stem}.csv", f"{stem}.provenance.json"} <= names
    pngs = sorted(n for n in names if n.endswith(".png"))
    assert pngs == ["curves_step.png", "difficulty_step.png", "final_eval_acc.png"]
    for n in pngs:
        data = (out / n).read_bytes()
        assert data[:8] == PNG_MAGIC
        width = int.from_bytes(data[16:20], "big")
        assert width > 600  # rendered at dpi 120, not a stub


def test_report_markdown_content(report, sweep):
    md = report.read_text()
    info = json.loads((sweep / "sweep.json").read_text())
    assert md.startswith("# Report: synthetic")
    assert f"`{info['spec_hash']}`" in md and f"`{info['commit']}`" in md
    assert "- seeds (3): 0, 1, 2" in md
    assert "  - grpo: 3 run(s), seeds 0, 1, 2" in md and "  - dr_grpo: 3 run(s)" in md
    # the half-written run is listed as skipped, and its arm as having no runs
    assert "### Skipped runs" in md and "- `ppo__s0`: no 'done' file" in md
    assert "objbench report --include-incomplete" in md  # the way to load it from the command line, too
    assert "  - ppo: no runs loaded" in md
    # every embedded figure exists
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert sorted(images) == ["curves_step.png", "difficulty_step.png", "final_eval_acc.png"]
    # the main table holds the numbers of final.csv
    ft = pd.read_csv(report.parent / "final.csv")
    row = ft[(ft.metric == "eval/acc") & (ft.arm == "grpo")].iloc[0]
    assert f"| eval/acc | grpo | 3 | {row['mean']:.3f} | [{row['ci_low']:.3f}, {row['ci_high']:.3f}] |" in md
    assert "P(X > Y)" in md
    # ends with the regenerating commands: from the run folders, then from the data file alone
    tail = md.rstrip().splitlines()
    assert tail[-2] == f"objbench report --from-data {sweep}/report/runs.csv.gz" and tail[-1] == "```"
    assert f"This report from the run folders:\n\n```\nobjbench report {sweep}\n```" in md
    assert info["command"] in md
    # no comparisons were declared: no verdicts, only an exploratory table
    assert "**No comparisons were declared**" in md and "verdict" not in md.split("## Final performance")[0].split(
        "### Exploratory")[1].splitlines()[4]
    assert not (report.parent / "comparisons.csv").exists()
    ex = pd.read_csv(report.parent / "exploratory.csv")
    assert list(ex["comparison"]) == ["grpo - dr_grpo"] and "verdict" not in ex.columns


def test_report_is_deterministic(report, sweep):
    before = {p.name: p.read_bytes() for p in report.parent.iterdir()}
    with pytest.warns(IncompleteRunWarning):
        write_report(sweep)
    after = {p.name: p.read_bytes() for p in report.parent.iterdir()}
    assert before.keys() == after.keys()
    for name in before:
        assert before[name] == after[name], name


def test_report_rejects_bad_x(sweep):
    with pytest.raises(ValueError, match="x must be"):
        write_report(sweep, x="time")


def test_report_command_forms():
    assert report_command("runs/q") == "objbench report runs/q"
    assert report_command("runs/q", x="tokens") == "objbench report runs/q --x tokens"
    cmd = report_command("runs/q", out_dir="out", last_k=3, smooth=None)
    assert cmd == "python -c \"from objbench.analysis.report import write_report; write_report('runs/q', out_dir='out', last_k=3)\""
    # objbench report has --out and --primary
    assert (report_command("runs/q", out_dir="my out", x="tokens", primary="eval/pass@1")
            == "objbench report runs/q --x tokens --out 'my out' --primary eval/pass@1")
    cmd = report_command("runs/q", primary="eval/pass@1", seed=3)
    assert cmd.endswith("write_report('runs/q', primary='eval/pass@1', seed=3)\"")


def test_final_metrics_falls_back_to_training_accuracy(sweep):
    with pytest.warns(IncompleteRunWarning):
        runs = load_runs(sweep)
    source, keys, primary = final_metrics(runs)
    assert (source, primary) == ("evals", "eval/acc")
    assert keys[:4] == ["eval/acc", "eval/acc_d1", "eval/acc_d2", "eval/acc_d3"]
    assert keys[4:6] == ["eval/pass@1", "eval/pass@4"]
    no_evals = type(runs)(runs.root, runs.metrics, runs.evals.iloc[0:0], runs.configs, runs.sweep)
    assert final_metrics(no_evals) == ("metrics", ["reward/acc", "reward/acc_d1", "reward/acc_d2", "reward/acc_d3"],
                                       "reward/acc")


# ------------------------------------------------------------------------------------------------ figures
def test_arm_colors_fixed_by_sweep_order():
    c = arm_colors(["ppo", "grpo", "dr_grpo"])
    assert list(c) == ["ppo", "grpo", "dr_grpo"]
    assert len({tuple(v) for v in c.values()}) == 3
    assert arm_colors(["ppo", "grpo"])["grpo"] == c["grpo"]  # position decides, not the set of arms
    assert len(set(arm_colors([f"a{i}" for i in range(15)]).values())) == 15  # tab20 beyond 10 arms


def test_panels_colours_labels_and_missing_metric(sweep):
    with pytest.warns(IncompleteRunWarning):
        runs = load_runs(sweep)
    colors = arm_colors(runs.arms)
    curves = panel_curves(runs, TRAINING_PANELS[:2], x="tokens", n_resamples=200)
    curves.append(("value loss\n(value/loss)", "loss", None))  # not logged by these arms
    fig, axes = plot_panels(curves, colors, x="tokens", ncols=3, title="t")
    ax_train, ax_eval, ax_missing = axes.flat
    assert ax_train.get_xlabel() == "generated tokens" and ax_train.get_ylabel() == "accuracy (fraction)"
    assert "(reward/acc)" in ax_train.get_title() and "(eval/acc)" in ax_eval.get_title()
    for ax in (ax_train, ax_eval):
        lines = {ln.get_label().split(" (n=")[0]: ln.get_color() for ln in ax.get_lines()}
        assert set(lines) == set(ARMS)
        for arm, col in lines.items():
            assert to_rgba(col) == to_rgba(colors[arm])  # same colour per arm in every panel
        assert len(ax.collections) == len(ARMS)  # one CI band per arm
    assert [t.get_text() for t in ax_missing.texts] == ["not logged"]
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["grpo (n=3)", "dr_grpo (n=3)"]


def test_plot_final_draws_ci_and_seeds():
    colors = arm_colors(["a", "b"])
    per_run = pd.DataFrame({"arm": ["a", "a", "b"], "value": [0.1, 0.3, 0.5]})
    summary = pd.DataFrame({"arm": ["a", "b"], "mean": [0.2, 0.5], "ci_low": [0.1, np.nan],
                            "ci_high": [0.3, np.nan]})
    fig, ax = plot_final(per_run, summary, colors, xlabel="final acc (fraction)")
    assert ax.get_xlabel() == "final acc (fraction)"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b (n=1)", "a (n=2)"]
    assert len(ax.collections) == 2  # one scatter of seeds per arm


# ------------------------------------------------------------------------------------------------ primary metric
@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """2 arms x 3 seeds, complete, with per-difficulty sampled accuracy eval/pass@1_d{1,2,3}."""
    root = tmp_path_factory.mktemp("sampled") / "synth"
    return write_synthetic_sweep(root, arms=ARMS, seeds=(0, 1, 2), steps=6, eval_every=3, sampled_buckets=True)


def _set_sweep_report(root, report):
    info = json.loads((root / "sweep.json").read_text())
    info["report"] = report
    (root / "sweep.json").write_text(json.dumps(info))


def test_primary_resolution_order(sampled, tmp_path):
    runs = load_runs(sampled)
    assert resolve_primary(runs) == ("eval/acc", "default")
    assert resolve_primary(runs, "eval/pass@4") == ("eval/pass@4", "argument")
    assert resolve_primary(runs, "reward/acc") == ("reward/acc", "argument")  # a training key is allowed
    root = tmp_path / "s"
    write_synthetic_sweep(root, arms=ARMS, seeds=(0,), steps=4, eval_every=2)
    _set_sweep_report(root, {})  # what the sweep runner writes for a spec without report:
    assert resolve_primary(load_runs(root)) == ("eval/acc", "default")
    _set_sweep_report(root, {"primary": "eval/pass@1"})
    with_spec = load_runs(root)
    assert resolve_primary(with_spec) == ("eval/pass@1", "sweep.json")
    assert resolve_primary(with_spec, "eval/pass@4") == ("eval/pass@4", "argument")  # the argument wins
    _set_sweep_report(root, {"primary": "eval/pass@2"})
    with pytest.raises(ValueError, match=r"'eval/pass@2' \(from sweep.json report.primary\).*eval keys: .*eval/pass@1"):
        resolve_primary(load_runs(root))
    _set_sweep_report(root, "eval/pass@1")
    with pytest.raises(ValueError, match="sweep.json 'report' must be a mapping"):
        resolve_primary(load_runs(root))


def test_primary_unknown_key_fails_before_writing(sampled, tmp_path):
    out = tmp_path / "never"
    with pytest.raises(ValueError) as e:
        write_report(sampled, out_dir=out, primary="eval/pass@2")
    msg = str(e.value)
    assert "'eval/pass@2'" in msg and "primary argument" in msg
    assert "eval/acc, eval/acc_d1" in msg and "eval/pass@1_d3" in msg  # lists the eval keys
    assert not out.exists()


def test_final_metrics_with_primary(sampled):
    runs = load_runs(sampled)
    source, keys, primary = final_metrics(runs, "eval/pass@1")
    assert (source, primary) == ("evals", "eval/pass@1")
    assert keys[4:9] == ["eval/pass@1", "eval/pass@1_d1", "eval/pass@1_d2", "eval/pass@1_d3", "eval/pass@4"]
    assert final_metrics(runs, "reward/acc")[:1] == ("metrics",)
    source, keys, primary = final_metrics(runs, "policy/entropy")
    assert source == "metrics" and keys[-1] == "policy/entropy" and keys[0] == "reward/acc"


@pytest.fixture(scope="module")
def pass1_report(sampled, tmp_path_factory):
    out = tmp_path_factory.mktemp("pass1")
    return write_report(sampled, out_dir=out, primary="eval/pass@1")


def test_report_leads_with_primary(pass1_report, sampled):
    out = pass1_report.parent
    md = pass1_report.read_text()
    runs_cmd = f"objbench report {sampled} --out {out} --primary eval/pass@1"
    cmd = f"objbench report --from-data {out}/runs.csv.gz"  # the stamp: the data file stores primary=eval/pass@1
    assert "- primary metric: `eval/pass@1` (chosen for this report)" in md
    # order: main table, start -> final, P(X > Y), difficulty aggregate
    main, imp = md.index("| eval/pass@1 | grpo | 3 |"), md.index("### Start -> final")
    assert main < imp < md.index("## Probability of improvement") < md.index("## Aggregate over difficulty buckets")
    assert "final `eval/pass@1` (ties count 1/2)" in md
    assert (pd.read_csv(out / "pairwise.csv")["metric"] == "eval/pass@1").all()
    agg = pd.read_csv(out / "difficulty.csv")
    assert (agg["buckets"] == "eval/pass@1_d1,eval/pass@1_d2,eval/pass@1_d3").all()
    assert "final_eval_pass_1.png" in md and (out / "final_eval_pass_1.png").read_bytes()[:8] == PNG_MAGIC
    # the improvement table: written in every format, numbers = paired step-0 / final values, command stamped
    imp_csv = pd.read_csv(out / "improvement.csv")
    ev = load_runs(sampled).evals
    ev = ev[ev["metric"] == "eval/pass@1"]
    for arm in ARMS:
        a = ev[ev["arm"] == arm]
        start = a[a["step"] == 0].groupby("seed")["value"].first()
        final = a[a["step"] == a["step"].max()].groupby("seed")["value"].first()
        row = imp_csv[imp_csv["arm"] == arm].iloc[0]
        assert row["start_mean"] == pytest.approx(start.mean())
        assert row["diff_mean"] == pytest.approx((final - start).mean())
        assert row["n_improved"] == int((final > start).sum())
        assert f"| {arm} | 3 | {row['start_mean']:.3f} | {row['final_mean']:.3f} | {row['diff_mean']:+.3f} |" in md
    for f in ("improvement.md", "improvement.tex", "improvement.provenance.json"):
        assert (out / f).exists()
    prov = json.loads((out / "improvement.provenance.json").read_text())
    assert prov["report_command"] == cmd and "start = step 0" in prov["notes"]
    assert md.count(f"table: `{cmd}`") >= 4  # final (x2), improvement, pairwise, difficulty
    # synthetic arms draw their own step-0 noise: the report says the starts differ
    assert "step-0 values differ between arms of the same seed" in md
    assert md.rstrip().splitlines()[-2] == cmd and f"```\n{runs_cmd}\n```" in md
    assert json.loads((out / "runs_meta.json").read_text())["report_options"]["primary"] == "eval/pass@1"


def test_primary_from_sweep_json_and_no_buckets(tmp_path):
    """A spec's report.primary (copied to sweep.json) without <primary>_d<k> keys: no aggregate, and a difficulty
    table left in the folder by an earlier report (another primary) is removed rather than left to be misread."""
    out = tmp_path / "out"
    out.mkdir()
    for e in ("md", "tex", "csv", "provenance.json"):
        (out / f"difficulty.{e}").write_text("stale")
    root = write_synthetic_sweep(tmp_path / "s", arms=ARMS, seeds=(0, 1), steps=4, eval_every=2)
    _set_sweep_report(root, {"primary": "eval/pass@4"})
    md = write_report(root, out_dir=out).read_text()
    assert "- primary metric: `eval/pass@4` (from the sweep spec (sweep.json report.primary))" in md
    # stamped explicitly: the command reproduces the report even if sweep.json changes
    assert f"```\nobjbench report {root} --out {out} --primary eval/pass@4\n```" in md
    assert md.rstrip().splitlines()[-2] == f"objbench report --from-data {out}/runs.csv.gz"  # sweep.json is in the data
    assert "sweep.json's report section differs from the spec the sweep was started with" in md
    assert "| eval/pass@4 | grpo | 2 |" in md
    assert "Not computed: no per-difficulty keys `eval/pass@4_d<k>` were logged." in md
    assert not any((out / f"difficulty.{e}").exists() for e in ("md", "tex", "csv", "provenance.json"))
    assert (pd.read_csv(out / "improvement.csv")["metric"] == "eval/pass@4").all()
    assert (out / "difficulty_step.png").exists()  # the figure still shows the accuracy buckets


def test_plot_panels_blank_cell():
    colors = arm_colors(["a"])
    c = pd.DataFrame({"arm": ["a", "a"], "step": [0, 1], "mean": [0.1, 0.2], "low": [0.0, 0.1], "high": [0.2, 0.3],
                      "n": [2, 2]})
    fig, axes = plot_panels([("p1", "y", c), None, ("p3", "y", c)], colors, ncols=2)
    assert axes.shape == (2, 2)
    assert [ax.get_visible() for ax in axes.flat] == [True, False, True, False]
    assert axes[1, 0].get_title() == "p3"


def test_plot_final_reference_line():
    colors = arm_colors(["a"])
    per_run = pd.DataFrame({"arm": ["a", "a"], "value": [0.5, 0.6]})
    summary = pd.DataFrame({"arm": ["a"], "mean": [0.55], "ci_low": [0.5], "ci_high": [0.6]})
    fig, ax = plot_final(per_run, summary, colors, xlabel="x", reference=(0.3, "start"))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["start"]
    assert any(list(ln.get_xdata()) == [0.3, 0.3] for ln in ax.get_lines())


# ------------------------------------------------------------------------------------------------ pre-registration
def test_declared_comparisons_get_verdicts_and_others_do_not(tmp_path):
    root = write_synthetic_sweep(tmp_path / "s", arms=("ppo", "grpo", "dapo"), seeds=(0, 1, 2), steps=4, eval_every=2)
    spec = {"primary": "eval/acc", "baseline": "grpo", "min_seeds": 10}
    _set_sweep_report(root, spec)
    (root / "sweep.yaml").unlink()  # sweep.json alone: what a spec-less runs folder has
    out = write_report(root, dpi=30).parent
    md = (out / "report.md").read_text()
    cmp = pd.read_csv(out / "comparisons.csv")
    assert list(cmp["comparison"]) == ["ppo - grpo", "dapo - grpo"] and set(cmp["verdict"]) == {"not resolved"}
    assert (cmp["adj_confidence"] == 1 - 0.05 / 2).all() and (cmp["perm_p"] >= 0.25).all()  # 3 seeds: p >= 2/8
    assert cmp["bca_low"].isna().all()  # 3 seeds: no bootstrap
    # the per-seed differences are in the CSV, and the mean is theirs
    d = [float(v) for v in cmp["d"].iloc[0].split()]
    assert len(d) == 3 and cmp["mean"].iloc[0] == pytest.approx(np.mean(d))
    assert "- With 3 seeds the smallest attainable exact permutation p is 2/2^3 = 0.25" in md
    assert "- ppo - grpo on `eval/acc (final)`: **not resolved** (" in md
    assert "Underpowered: 3 seeds (fewer than min_seeds = 10); differences below" in md
    assert "80%-power MDD" in md and np.isfinite(cmp["mdd80"]).all()
    assert "detected with less than 80% power" in md and "adjusted 97.5% CI (t)" in md
    # the pair nobody declared is exploratory, labelled, without a verdict
    ex = pd.read_csv(out / "exploratory.csv")
    assert list(ex["comparison"]) == ["ppo - dapo"] and "verdict" not in ex.columns and "holm_p" not in ex.columns
    assert "### Exploratory (not pre-registered)" in md and "No verdicts; p-values are not adjusted" in md
    # no argument of write_report can add a comparison
    assert not {"comparisons", "baseline", "endpoints"} & set(inspect.signature(write_report).parameters)


def test_ten_seeds_resolve_a_large_difference_with_bca(tmp_path):
    # at step 30 dapo's synthetic accuracy is ~0.16 above grpo's, with noise sd ~0.06 per seed difference
    root = write_synthetic_sweep(tmp_path / "s", arms=("grpo", "dapo"), seeds=tuple(range(10)), steps=30,
                                 eval_every=30)
    _set_sweep_report(root, {"primary": "eval/acc", "comparisons": [["dapo", "grpo"]]})
    (root / "sweep.yaml").unlink()
    out = write_report(root, dpi=30).parent
    row = pd.read_csv(out / "comparisons.csv").iloc[0]
    assert row["n"] == 10 and row["verdict"] == "dapo > grpo" and row["underpowered"] != row["underpowered"]  # NaN
    assert row["perm_p"] == pytest.approx(2 / 1024) and row["holm_p"] == pytest.approx(2 / 1024)
    assert row["bca_adj_low"] > 0 and row["t_adj_low"] > 0
    md = (out / "report.md").read_text()
    assert "adjusted 95% CI (BCa)" in md and "**resolved, dapo > grpo**" in md
    assert "| eval/acc | grpo | 10 |" in md and "BCa bootstrap" in md  # the final table switched to BCa


def test_report_needs_one_source(sampled):
    with pytest.raises(ValueError, match="exactly one"):
        write_report()
    with pytest.raises(ValueError, match="exactly one"):
        write_report(sampled, data=sampled / "report" / "runs.csv.gz")


def test_legend_rows_fit_the_figure_width():
    """Entries a row: width // (0.6 in + 0.085 in per character of "<arm> (n=10)"), at most 6. Six 18-character
    arm names on a 2-panel figure (~9.8 in) once overflowed both edges with 6 a row."""
    from objbench.analysis.plots import legend_per_row

    assert legend_per_row(["grpo", "ppo"], 20.0) == 6          # 11 chars: 1.535 in an entry, 13 fit, capped at 6
    long = ["verdict_seq_mean", "verdict_token_mean", "after_seq_mean", "after_token_mean", "before_seq_mean",
            "before_token_mean"]
    assert legend_per_row(long, 9.8) == 3                       # 25 chars: 2.725 in an entry
    assert legend_per_row(long, 1.0) == 1 and legend_per_row([], 5.0) == 4  # 7 chars: 1.195 in, 4 fit in 5 in


def test_bands_are_clipped_to_the_metrics_range():
    """A t band over 3 seeds can reach past what the metric can be (accuracy 0.9 +- 0.3); the drawn band stops at
    its bounds, the line is the mean as computed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    from objbench.analysis.plots import draw_curves

    curves = pd.DataFrame({"arm": ["a"] * 3, "step": [0, 1, 2], "mean": [0.9, 0.1, 0.5],
                           "low": [0.6, -0.2, 0.3], "high": [1.2, 0.4, 0.7], "n": [3, 3, 3]})
    fig, ax = plt.subplots()
    draw_curves(ax, curves, {"a": (0, 0, 1, 1)}, bounds=(0.0, 1.0))
    ys = np.concatenate([p.get_paths()[0].vertices[:, 1] for p in ax.collections])
    assert ys.min() == 0.0 and ys.max() == 1.0
    assert list(ax.lines[0].get_ydata()) == [0.9, 0.1, 0.5]
    fig2, ax2 = plt.subplots()
    draw_curves(ax2, curves, {"a": (0, 0, 1, 1)})  # no bounds: the band as computed
    ys2 = np.concatenate([p.get_paths()[0].vertices[:, 1] for p in ax2.collections])
    assert ys2.min() == pytest.approx(-0.2) and ys2.max() == pytest.approx(1.2)
    plt.close(fig)
    plt.close(fig2)


def test_metric_bounds_and_the_final_bar_are_clipped():
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from objbench.analysis.plots import metric_bounds, plot_final

    assert metric_bounds("eval/pass@1") == metric_bounds("reward/acc_d3") == metric_bounds("rollout/zero_var_frac") \
        == (0.0, 1.0)
    assert metric_bounds("length/incorrect") == (0.0, None) and metric_bounds("kl/k1") is None
    assert metric_bounds("kl/exact") == metric_bounds("kl/k3") == (0.0, None)  # the quickstart's KL panel
    per_run = pd.DataFrame({"arm": ["a", "a", "a"], "value": [0.6, 0.95, 0.96]})
    summ = pd.DataFrame({"arm": ["a"], "mean": [0.84], "ci_low": [0.36], "ci_high": [1.33]})
    fig, ax = plot_final(per_run, summ, {"a": (0, 0, 1, 1)}, xlabel="x", bounds=(0.0, 1.0))
    assert list(ax.lines[0].get_xdata()) == [0.36, 1.0]

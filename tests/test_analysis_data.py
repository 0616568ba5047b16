"""analysis.data: the committed per-study data file is lossless, small and deterministic, and a report remade from it
alone has the same tables as the report made from the run folders."""

import filecmp
import gzip
import json

import numpy as np
import pandas as pd
import pytest

from objbench.analysis.data import DATA_FILE, META_FILE, SAMPLES_FILE, read_data, read_samples_jsonl, write_data
from objbench.analysis.load import load_runs
from objbench.analysis.report import write_report
from objbench.analysis.synthetic import write_study_sweep, write_synthetic_sweep


def _sorted(df):
    return df.sort_values(["run", "step", "metric"], kind="stable").reset_index(drop=True)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = write_synthetic_sweep(tmp_path_factory.mktemp("data") / "s", arms=("grpo", "dapo"), seeds=(0, 1, 2),
                                 steps=10, eval_every=5)
    # float32-exact and float64 values side by side, a bool, a value only some steps log, a timing key, and an
    # eval key that metrics.jsonl also logs (its column gets the file's name)
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        for r in recs:
            r["f32"] = float(np.float32(r["reward/acc"] / 3))
            r["flag"] = r["step"] % 2 == 0
            if r["step"] == 3:
                r["rare"] = 1e-300
            r["time/step"] = 0.5
            r["clash"] = 1.0
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        ev = [json.loads(x) for x in (d / "eval.jsonl").read_text().splitlines()]
        for r in ev:
            r["clash"] = 2.0
        (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ev))
    return root


def test_round_trip_is_lossless(sweep, tmp_path):
    runs = load_runs(sweep)
    paths = write_data(runs, tmp_path)
    assert set(paths) == {"data", "meta"} and not (tmp_path / SAMPLES_FILE).exists()
    back = read_data(tmp_path)
    kept = runs.metrics[~runs.metrics["metric"].isin(["time", "time/step"])]
    pd.testing.assert_frame_equal(_sorted(back.metrics), _sorted(kept))          # bit for bit
    assert back.metric_names == [k for k in runs.metric_names if k not in ("time", "time/step")]  # order kept
    pd.testing.assert_frame_equal(_sorted(back.evals), _sorted(runs.evals))
    assert back.eval_names == runs.eval_names and back.arms == runs.arms and back.seeds == runs.seeds
    meta = back.meta
    assert meta["dropped_keys"] == ["time", "time/step"]
    assert meta["eval_columns"]["eval.jsonl:clash"] == "clash"
    assert "f32" in meta["float32_columns"] and "reward/mean" not in meta["float32_columns"]
    # per run: config hash, commit, versions, times; config keys that differ from the shared ones
    rec = meta["runs"][0]
    assert rec["run"] == "grpo__s0" and len(rec["config_hash"]) == 64 and rec["commit"] == runs.sweep["commit"]
    assert rec["versions"]["torch"] == "2.13.0" and rec["wall_s"] == 600.0
    assert rec["config"] == {"name": "grpo", "algo.preset": "grpo"} and meta["config_common"]["optim.lr"] == 1e-4
    assert back.configs.set_index("run").loc["dapo__s1", "algo.preset"] == "dapo"
    # the wide file is readable alone, one row per (run, step)
    wide = pd.read_csv(tmp_path / DATA_FILE)
    assert list(wide.columns[:6]) == ["run", "arm", "seed", "step", "tokens", "eval_tokens"]
    assert not wide.duplicated(["run", "step"]).any() and len(wide) == 6 * 11  # steps 0..10
    assert "time/step" not in wide.columns


def test_data_files_are_deterministic(sweep, tmp_path):
    runs = load_runs(sweep)
    write_data(runs, tmp_path / "a")
    write_data(runs, tmp_path / "b")
    for name in (DATA_FILE, META_FILE):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    raw = (tmp_path / "a" / DATA_FILE).read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # gzip mtime 0: no time stamp
    assert gzip.decompress(raw).startswith(b"run,arm,seed,step,tokens,eval_tokens,")


def test_read_data_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=DATA_FILE):
        read_data(tmp_path)
    (tmp_path / DATA_FILE).write_bytes(gzip.compress(b"run\n"))
    (tmp_path / META_FILE).write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(ValueError, match="format"):
        read_data(tmp_path / DATA_FILE)


def test_samples_are_counted(tmp_path):
    root = write_study_sweep(tmp_path / "lb", "length_bias", seeds=(0,), steps=6, eval_every=3)
    runs = load_runs(root)
    smp = read_samples_jsonl(runs.configs)
    assert list(smp.columns) == ["run", "step", "length", "correct", "count"]
    assert int(smp["count"].sum()) == 3 * 6 * 4  # 3 arms x 6 steps x 4 samples
    write_data(runs, tmp_path / "out", samples=smp)
    back = read_data(tmp_path / "out")
    pd.testing.assert_frame_equal(back.samples, smp.astype({"run": back.samples["run"].dtype}))


TABLE_SUFFIXES = (".csv", ".md", ".tex", ".provenance.json")


def test_report_from_data_alone_has_the_same_tables(tmp_path):
    """The acceptance test: write a report from run folders, remake it from its data file into another folder (the
    run folders deleted first), and every table is byte-identical."""
    import shutil

    report = {"primary": "eval/pass@1", "endpoints": [{"metric": "length/incorrect", "window": {"last": 5}}],
              "comparisons": [["seq_mean_token_mean", "token_mean"]], "study": "length_bias"}
    root = write_study_sweep(tmp_path / "runs" / "length_bias", "length_bias", seeds=(0, 1, 2), steps=12,
                             eval_every=6, report=report)
    first = write_report(root, out_dir=tmp_path / "committed", dpi=30).parent
    shutil.rmtree(tmp_path / "runs")
    second = write_report(data=first / DATA_FILE, out_dir=tmp_path / "again").parent
    tables = sorted(p.name for p in first.iterdir() if p.name.endswith(TABLE_SUFFIXES)
                    and p.name not in ("report.md", "report.provenance.json"))
    assert {"comparisons.csv", "final.csv", "pairwise.md", "length_bias.csv", "improvement.tex"} <= set(tables)
    figures = sorted(p.name for p in first.iterdir() if p.suffix == ".png")
    assert {"acc_vs_length.png", "curves_step.png", "length_by_correctness.png"} <= set(figures)
    for name in tables + figures:
        assert filecmp.cmp(first / name, second / name, shallow=False), name
    for name in (DATA_FILE, META_FILE, SAMPLES_FILE):  # the new folder carries the data too
        assert (first / name).read_bytes() == (second / name).read_bytes()
    md = (second / "report.md").read_text()
    assert f"made from the data file `{first / DATA_FILE}`" in md
    assert md.count("acc_vs_length.png") == 1 and (second / "acc_vs_length.png").exists()  # samples from the data
    # the stamp names the data file, so the regenerated table says how to remake itself
    prov = json.loads((second / "final.provenance.json").read_text())
    assert prov["report_command"] == f"objbench report --from-data {first / DATA_FILE}"
    # options stored with the data are reused; a changed option shows in the stamp
    third = write_report(data=first, out_dir=tmp_path / "pass4", primary="eval/pass@4", dpi=30).parent
    prov = json.loads((third / "final.provenance.json").read_text())
    assert prov["report_command"] == f"objbench report --from-data {first / DATA_FILE} --primary eval/pass@4"

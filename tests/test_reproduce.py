"""A fresh clone regenerates a committed run (issue: reproducible on any machine).

``-m repro`` (deselected by default; CI runs it after the default suite, ~5 min on 2 cores): the quickstart's
GRPO seed-0 run is trained again from an empty warm-start cache and every logged value is compared with
results/quickstart/runs.csv.gz. Float32 CPU training is bit-identical only on the same CPU kind (model and the
kernel set torch dispatches to, experiments.train.cpu_signature, recorded in every run's meta.json): on the kind
that made the data a difference fails the test, on another it is reported (xfail) with the first difference. The fast tests below check the comparison itself and run by default.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from objbench.experiments.sweeper import reproduce as R

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "results" / "quickstart"


def _long(rows):
    return pd.DataFrame(rows, columns=["step", "metric", "value"])


def test_compare_values_equal_and_first_difference():
    a = _long([(0, "x", 1.0), (0, "y", 2.0), (1, "x", 3.0)])
    assert R.compare_values(a, a.copy()) == {"n": 3, "mismatches": 0}
    b = _long([(0, "x", 1.0), (0, "y", 2.5), (1, "x", 3.25)])
    c = R.compare_values(a, b)
    assert (c["mismatches"], c["first_step"], c["first_metric"], c["max_abs_diff"]) == (2, 0, "y", 0.5)
    c = R.compare_values(a, a.iloc[:2])  # a value the regenerated run did not log
    assert c["mismatches"] == 1 and c["missing"] == ["x@1"]
    c = R.compare_values(a, pd.concat([a, _long([(0, "new/metric", 5.0)])]))  # a metric added to the code since
    assert c == {"n": 3, "mismatches": 0, "added": ["new/metric"]}


def test_fields_added_since_the_data_was_committed():
    """A field the committed config lacks is no difference at its declared neutral value (config.added_later), any other value
    is; a field neither side knows of is named as a difference."""
    old = {"optim.lr": 0.0003}
    assert R.config_differences(old, {"optim.lr": 0.0003, "train.eval_temperature": None}) == []
    assert R.config_differences(old, {"optim.lr": 0.0003, "train.eval_temperature": 1.0}) == [
        "train.eval_temperature: committed <absent: None>, now 1.0"]
    assert R.config_differences(old, {"optim.lr": 0.0003, "x.y": None}) == ["x.y: committed '<absent>', now None"]


def test_committed_config_matches_the_spec_at_this_commit(monkeypatch):
    """The committed quickstart's configs are what the spec resolves to now: a default changed since the
    results were made shows here, naming the keys, instead of as an unexplained difference."""
    from objbench.analysis.data import read_data
    from objbench.experiments.sweeper.plan import load_sweep

    monkeypatch.chdir(ROOT)
    meta = read_data(QUICKSTART / "runs.csv.gz").meta
    sw = load_sweep(meta["sweep"]["spec_path"], out_dir="/nonexistent/out")
    for r in sw.runs:
        assert R.config_differences(R.committed_config(meta, r.cfg.run_name), R.flat_config(r.cfg)) == []


def test_config_difference_is_refused_before_training(tmp_path, monkeypatch):
    import json
    import shutil

    monkeypatch.chdir(ROOT)
    data = tmp_path / "qs"
    shutil.copytree(QUICKSTART, data)
    meta = json.loads((data / "runs_meta.json").read_text())
    meta["config_common"]["optim.lr"] = 0.5
    (data / "runs_meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"optim.lr: committed 0.5"):
        R.reproduce(data, "grpo__s0", workdir=tmp_path / "w")
    assert not (tmp_path / "w" / "runs").exists()  # nothing trained, nothing written
    with pytest.raises(ValueError, match="not in the committed data"):
        R.reproduce(data, "nope__s0", workdir=tmp_path / "w")


@pytest.mark.repro
def test_quickstart_grpo_seed0_regenerates_from_a_cold_cache(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    res = R.reproduce(QUICKSTART, "grpo__s0", workdir=tmp_path)
    print(R.describe(res))
    if not res["ok"] and not res["cpu"]["same"]:
        # Measured 2026-12-05: the data committed on one CPU kind did not regenerate on an AVX512/AMX Xeon (warm
        # start sha 3c2f0d3 vs 9247f72, and 703a717 with torch and MKL pinned to AVX2), at this commit and at the
        # one before the change under test alike. Bit-identity holds on the kernel path the data was made with,
        # so on another CPU kind the difference is reported, not failed; on the same kind the test fails.
        pytest.xfail("regenerated on another CPU kind than the committed data's:\n" + R.describe(res))
    assert res["warm_start"]["equal"], R.describe(res)
    assert res["metrics"]["n"] > 1000 and res["evals"]["n"] > 50
    assert res["ok"], R.describe(res)


STUDIES = sorted(p.parent.name for p in (ROOT / "results").glob("*/runs.csv.gz"))


@pytest.mark.repro
@pytest.mark.parametrize("study", STUDIES)
def test_committed_study_tables_regenerate_from_its_data(study, tmp_path, monkeypatch):
    """Every committed study's tables come back from its committed per-run data with one command (`objbench report
    --from-data results/<study>/runs.csv.gz`), value for value: every CSV table the report wrote equal to the
    committed one (figures are not compared: PNG bytes depend on the matplotlib build)."""
    from objbench.experiments.cli.main import main

    monkeypatch.chdir(ROOT)
    committed = ROOT / "results" / study
    assert main(["report", "--from-data", f"results/{study}/runs.csv.gz", "--out", str(tmp_path)]) == 0
    tables = sorted(p.name for p in committed.glob("*.csv"))
    assert tables, f"results/{study} has no CSV tables"
    for name in tables:
        new = tmp_path / name
        assert new.is_file(), f"{study}: the regenerated report has no {name}"
        assert new.read_text() == (committed / name).read_text(), f"{study}: {name} differs from the committed one"


CARDS = sorted(p.parent.name for p in (ROOT / "results" / "cards").glob("*/runs.csv.gz"))


@pytest.mark.repro
@pytest.mark.parametrize("card", CARDS)
def test_committed_card_regenerates_from_its_data(card, tmp_path, monkeypatch):
    """Every committed score card (and the committed validation of the battery) comes back from its per-run data
    with `objbench card [--validate] --from-data results/cards/<name>`, table for table."""
    from objbench.experiments.cli.main import main

    monkeypatch.chdir(ROOT)
    committed = ROOT / "results" / "cards" / card
    validation = (committed / "validation.csv").is_file()
    args = ["card", *(["--validate"] if validation else []), "--from-data", f"results/cards/{card}", "--out",
            str(tmp_path)]
    assert main(args) == 0
    tables = sorted(p.name for p in committed.glob("*.csv"))
    assert tables, f"results/cards/{card} has no CSV tables"
    for name in tables:
        assert (tmp_path / name).read_text() == (committed / name).read_text(), f"{card}: {name} differs"


def test_every_committed_study_keeps_its_data():
    """A study folder (one with a report.md made by `objbench report`) holds the data it was computed from."""
    for report in (ROOT / "results").glob("*/report.md"):
        d = report.parent
        assert (d / "runs.csv.gz").is_file() and (d / "runs_meta.json").is_file(), f"{d.name} lacks its data"

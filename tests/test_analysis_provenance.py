"""analysis.provenance: git state, the dirty-tree refusal for results/, library versions, wall time; and what the
report records of them."""

import json
import subprocess

import pytest

import objbench.analysis.provenance as prov
from objbench.analysis.provenance import (
    DirtyTreeError,
    check_clean,
    committed_results_path,
    format_seconds,
    git_state,
    library_versions,
    wall_time,
)
from objbench.analysis.report import write_report
from objbench.analysis.synthetic import write_synthetic_sweep


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(root)})


@pytest.fixture()
def repo(tmp_path):
    """A git repository with code.py, results/old/report.md and an ignored results/runs/, all committed."""
    root = tmp_path / "repo"
    (root / "results" / "old").mkdir(parents=True)
    (root / "code.py").write_text("x = 1\n")
    (root / "results" / "old" / "report.md").write_text("old\n")
    (root / ".gitignore").write_text("results/runs/\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "init")
    return root


def test_git_state_dirty_ignores_results_and_untracked(repo):
    s = git_state(repo)
    assert s["dirty"] is False and len(s["commit"]) == 40 and s["changed"] == []
    (repo / "results" / "old" / "report.md").write_text("regenerated\n")  # an output, not code
    (repo / "new_untracked.py").write_text("")
    assert git_state(repo)["dirty"] is False
    (repo / "code.py").write_text("x = 2\n")
    s = git_state(repo)
    assert s["dirty"] is True and s["changed"] == ["code.py"]
    assert git_state(repo.parent / "nowhere")["commit"] is None


def test_committed_results_path(repo):
    assert committed_results_path(repo / "results" / "new_study", root=repo)
    assert committed_results_path(repo / "results", root=repo)
    assert not committed_results_path(repo / "results" / "runs" / "x" / "report", root=repo)  # git-ignored
    assert not committed_results_path(repo / "elsewhere", root=repo)
    assert not committed_results_path(repo.parent / "results", root=repo)


def test_check_clean_refuses_dirty_results_unless_forced(repo):
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(DirtyTreeError, match="code.py"):
        check_clean(repo / "results" / "study", root=repo)
    assert check_clean(repo / "results" / "study", force=True, root=repo)["dirty"] is True
    assert check_clean(repo / "results" / "runs" / "s" / "report", root=repo)["dirty"] is True  # ignored: allowed
    assert check_clean(repo.parent / "tmp_report", root=repo)["dirty"] is True


def test_wall_time_and_versions_by_hand():
    runs = [{"start": "2026-01-01T00:00:00+00:00", "end": "2026-01-01T00:10:00+00:00"},
            {"start": "2026-01-01T00:05:00+00:00", "end": "2026-01-01T01:05:30+00:00", "resumed_from_step": 50},
            {"start": "2026-01-01T00:00:00+00:00", "end": None}]
    w = wall_time(runs)
    assert (w["runs_timed"], w["runs_untimed"], w["runs_resumed"]) == (2, 1, 1)
    assert w["total_s"] == 600 + 3630 and w["longest_s"] == 3630 and w["span_s"] == 3930
    assert format_seconds(3930) == "1h 5m 30s" and format_seconds(59.6) == "1m 0s" and format_seconds(None) == "n/a"
    v = library_versions()
    assert list(v)[:2] == ["python", "torch"] and {"scipy", "pandas", "datasets", "math-verify"} <= set(v)
    assert library_versions(["surely-not-a-package-xyz"])["surely-not-a-package-xyz"] == "not installed"


def test_report_refuses_dirty_results_and_a_forced_one_says_so(repo, tmp_path, monkeypatch):
    original = prov.repo_root
    monkeypatch.setattr(prov, "repo_root", lambda path=None: repo if path is None else original(path))
    sweep = write_synthetic_sweep(tmp_path / "s", arms=("grpo", "dapo"), seeds=(0, 1), steps=4, eval_every=2)
    (repo / "code.py").write_text("x = 2\n")
    target = repo / "results" / "synthetic"
    with pytest.raises(DirtyTreeError, match="force=True"):
        write_report(sweep, out_dir=target, dpi=30)
    assert not target.exists()  # refused before anything was written
    md = write_report(sweep, out_dir=target, dpi=30, force=True, command="objbench report s --force").read_text()
    lines = md.splitlines()
    assert lines[0] == "# Report: synthetic" and lines[2].startswith("> **Made from a dirty tree** (forced)")
    assert "`code.py`" in lines[2]
    assert "(**dirty tree**) by `objbench report s --force`" in md
    rp = json.loads((target / "report.provenance.json").read_text())
    assert rp["dirty"] is True and rp["forced"] is True and rp["changed"] == ["code.py"]
    assert rp["command"] == "objbench report s --force" and rp["versions"]["scipy"]
    assert rp["wall_time"]["total_s"] == 4 * 600.0  # synthetic runs: 10 minutes each
    # committed: clean again, no banner, and the commit recorded
    _git(repo, "commit", "-qam", "change")
    md = write_report(sweep, out_dir=target, dpi=30).read_text()
    assert "Made from a dirty tree" not in md
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert f"- this report: made at commit `{head}` (clean tree)" in md
    assert "- libraries of this report: python " in md and "scipy " in md and "math-verify " in md
    assert "- libraries of the runs (4 run(s), meta.json): python 3.11, torch 2.13.0" in md
    assert "- wall time of the runs (meta.json start/end): 40m 0s summed over 4 run(s), longest 10m 0s" in md

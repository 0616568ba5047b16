"""Plug-ins: loading (--import, a sweep's imports:, entry points), the registries' contract, members' own settings,
the conformance check, and what a failing plug-in does (one clear line, no run folder)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from objbench import algos
from objbench.algos import registry as reg
from objbench.experiments.config import plugins
from objbench.experiments.cli.main import main
from objbench.experiments.config import ConfigError, load_config

FAST = ["sft.steps=20", "sft.batch_size=16", "train.steps=3", "rollout.completions_per_step=16",
        "task.eval_per_difficulty=2", "train.eval_samples=2", "train.eval_every=3", "train.checkpoint_every=2"]
REGISTRIES = [algos.SURROGATES, algos.ADVANTAGE_ESTIMATORS, algos.AGGREGATION_MODES, algos.KL_ESTIMATORS,
              algos.RATIO_LEVELS, algos.SCHEDULE_KINDS, algos.GROUP_SIZE_RULES]

ROOT = Path(__file__).resolve().parent.parent
GPG = (ROOT / "examples" / "gpg_plugin.py").read_text()  # registers the surrogate "gpg" with a setting "scale"


@pytest.fixture(autouse=True)
def _clean_registries():
    """Each test's plug-ins leave the process as it was: registries, loaded plug-ins, checked members."""
    saved = [(r, dict(r._items), dict(r._origins)) for r in REGISTRIES]
    loaded, checked = dict(plugins._LOADED), dict(plugins._CHECKED)
    yield
    for r, items, origins in saved:
        r._items.clear(), r._items.update(items)
        r._origins.clear(), r._origins.update(origins)
    plugins._LOADED.clear(), plugins._LOADED.update(loaded)
    plugins._CHECKED.clear(), plugins._CHECKED.update(checked)


def _plugin(tmp_path: Path, body: str, name: str = "plug.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


# ------------------------------------------------------------------------------------------------ the contract
def test_the_extension_api_is_public_and_its_member_types_are_stable():
    """The registries and member types plug-ins use, with the fields a plug-in passes: changing them breaks users."""
    fields = {cls.__name__: [f.name for f in dataclasses.fields(cls)]
              for cls in (algos.Surrogate, algos.AdvantageEstimator, algos.RatioLevel, algos.ScheduleKind,
                          algos.GroupSizeRule)}
    assert fields == {
        "Surrogate": ["loss", "reads", "levels", "settings"],
        "AdvantageEstimator": ["compute", "min_group_size", "needs_values", "reads", "all_equal_zero",
                               "reads_token_rewards", "settings"],
        "RatioLevel": ["log_ratio", "per_sequence"],
        "ScheduleKind": ["value", "reads"],
        "GroupSizeRule": ["wanted", "reads", "adaptive", "settings"],
    }
    assert algos.SURROGATES is reg.SURROGATES and algos.KL_ESTIMATORS is reg.KL_ESTIMATORS
    assert "opts: dict" in reg.SURROGATES.signature and "(B,T)" in reg.KL_ESTIMATORS.signature
    from objbench.envs import TASKS, register_task  # noqa: F401  (tasks and engines: the same idea)
    from objbench.rollout.engine import ENGINES, register_engine  # noqa: F401


def test_every_built_in_member_passes_the_conformance_check():
    from objbench.algos.conformance import FAMILIES

    failures = {(fam, n): algos.check_member(fam, n) for fam, (r, _) in FAMILIES.items() for n in r.names()}
    assert {k: v for k, v in failures.items() if v} == {}
    assert len(failures) >= 25


# ------------------------------------------------------------------------------------- loading and training
def test_a_plugin_surrogate_with_its_own_setting_trains_from_the_command_line(tmp_path):
    plug = _plugin(tmp_path, GPG)
    out = tmp_path / "runs"
    assert main(["train", "--quiet", "--import", str(plug), *FAST, f"out_dir={out}", "name=g",
                 "objective.ratio.surrogate=gpg", "objective.options.gpg.scale=0.5"]) == 0
    run = out / "g"
    assert (run / "done").exists()
    meta = json.loads((run / "meta.json").read_text())
    (rec,) = [p for p in meta["plugins"] if p["kind"] == "file"]
    assert rec["path"] == str(plug.resolve()) and len(rec["sha256"]) == 64
    assert "gpg:\n      scale: 0.5" in (run / "config.yaml").read_text()
    assert algos.SURROGATES.origin("gpg") == str(plug) and algos.SURROGATES.origin("ppo_clip") is None


def test_one_plugin_file_brings_a_surrogate_and_a_reward_function(tmp_path):
    plug = _plugin(tmp_path, GPG + "\n\ndef brevity(prompts, completions, **columns):\n"
                                   "    return [1.0 / (1 + len(c)) for c in completions]\n")
    out = tmp_path / "runs"
    assert main(["train", "--quiet", "--import", str(plug), *FAST, f"out_dir={out}", "name=b",
                 "objective.ratio.surrogate=gpg", f"reward.fns=[{plug}:brevity]", "reward.weights=[0.5]"]) == 0
    rows = [json.loads(line) for line in (out / "b" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(0 < r["reward/brevity"] <= 1 for r in rows)
    assert rows[0]["reward/mean"] == pytest.approx(rows[0]["reward/task"] + 0.5 * rows[0]["reward/brevity"])


def test_settings_are_validated_like_built_in_fields(tmp_path):
    plugins.load_plugins([str(_plugin(tmp_path, GPG))])
    base = [*FAST, f"out_dir={tmp_path}", "objective.ratio.surrogate=gpg"]
    assert load_config(None, base).objective.options == {"gpg": {"scale": 1.0}}  # defaults filled in
    for bad, says in [("objective.options.gpg.scal=2", "GPGSettings has no setting 'scal'"),
                      ("objective.options.gpg.scale=abc", "must be a float"),
                      ("objective.options.gpg.a.b=1", "GPGSettings has no setting 'a'")]:
        with pytest.raises(ConfigError, match=says):
            load_config(None, [*base, bad])
    with pytest.raises(ConfigError, match="no chosen component named 'gpg' declares settings"):
        load_config(None, [*FAST, "objective.options.gpg.scale=2"])  # gpg not chosen: nothing reads it


BROKEN = {
    "missing": (None, "plug-in file not found"),
    "syntax": ("def f(:\n", "SyntaxError"),
    "raises": ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
    "exits": ("import sys\nsys.exit(3)\n", "SystemExit: 3"),
    "hangs": ("import time\ntime.sleep(60)\n", "did not finish within 1 s"),
    "duplicate": ("from objbench.algos import SURROGATES, Surrogate\n"
                  "SURROGATES.register('ppo_clip', Surrogate(None, (), ('token',)))\n", "already registered"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_plugin_stops_the_command_before_any_run_folder(tmp_path, capsys, monkeypatch, case):
    monkeypatch.setattr(plugins, "IMPORT_TIMEOUT_S", 1.0)
    body, says = BROKEN[case]
    plug = tmp_path / "bad.py" if body is None else _plugin(tmp_path, body, "bad.py")
    out = tmp_path / "runs"
    assert main(["train", "--quiet", "--import", str(plug), *FAST, f"out_dir={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.py" in err[0] and says in err[0], err
    assert not out.exists()


CHEATS = {
    "batch_normalised": ("def loss2(*, ratio, logp, adv, mask, opts):\n"
                         "    return -(adv * ratio) / mask.sum(), {}\n",
                         "changes with the other responses in the batch"),
    "batch_coupled": ("def loss2(*, ratio, logp, adv, mask, opts):\n"
                      "    return -(adv * ratio) / ratio.sum().detach() * ratio.sum() / ratio.sum().detach(), {}\n",
                      "depends on other responses' tokens"),
    "scalar": ("def loss2(*, ratio, logp, adv, mask, opts):\n    return -(adv * ratio).mean(), {}\n",
               "per-token tensor"),
}


@pytest.mark.parametrize("case", sorted(CHEATS))
def test_a_surrogate_that_breaks_the_contract_is_refused_with_the_reason(tmp_path, capsys, case):
    body, says = CHEATS[case]
    plug = _plugin(tmp_path, "from objbench.algos import SURROGATES, Surrogate\n" + body +
                   "SURROGATES.register('cheat', Surrogate(loss2, reads=(), levels=('token',)))\n")
    out = tmp_path / "runs"
    assert main(["train", "--quiet", "--import", str(plug), *FAST, f"out_dir={out}",
                 "objective.ratio.surrogate=cheat"]) == 2
    err = capsys.readouterr().err
    assert "fails the conformance check" in err and says in err and not out.exists()
    assert main(["plugins", "check", str(plug)]) == 1
    assert says in capsys.readouterr().out


def test_conformance_catches_garbage_reading_aggregation_and_kl(tmp_path, capsys):
    plug = _plugin(tmp_path, '''
        from objbench.algos import AGGREGATION_MODES, KL_ESTIMATORS

        @AGGREGATION_MODES.register("unmasked_mean")
        def unmasked_mean(loss_mat, mask, max_len):
            return loss_mat.mean()  # reads the padding

        @KL_ESTIMATORS.register("offset_kl")
        def offset_kl(logp, ref_logp, old_logp):
            return (logp - ref_logp) ** 2 + 0.1  # not 0 for pi = pi_ref
    ''')
    assert main(["plugins", "check", str(plug)]) == 1
    out = capsys.readouterr().out
    assert "aggregation mode 'unmasked_mean': FAILED" in out and "changed the loss" in out
    assert "kl estimator 'offset_kl': FAILED" in out and "KL of a policy to itself" in out
    with pytest.raises(ConfigError, match="objective.kl.estimator='offset_kl'"):
        load_config(None, [*FAST, "objective.kl.placement=loss", "objective.kl.beta=0.1",
                           "objective.kl.estimator=offset_kl"])


# ------------------------------------------------------------------------------------- sweeps and workers
def test_a_sweep_with_imports_runs_plugin_arms_in_two_workers(tmp_path):
    from objbench.experiments.sweeper.plan import load_sweep
    from objbench.experiments.sweeper.sweep import run_sweep

    (tmp_path / "objectives").mkdir()
    _plugin(tmp_path / "objectives", GPG, "gpg.py")
    spec = tmp_path / "spec.yaml"
    overrides = "\n".join(f"  {k}: {v}" for k, v in (a.split("=", 1) for a in FAST))
    spec.write_text(f"name: plug\nseeds: 1\nimports: [objectives/gpg.py]\nset:\n{overrides}\n"
                    "arms:\n  grpo: {objective: grpo}\n"
                    "  gpg: {objective: grpo, objective.ratio.surrogate: gpg, objective.options.gpg.scale: 2.0}\n")
    sw = load_sweep(spec, out_dir=str(tmp_path / "out"))
    assert [p.spec for p in sw.plugins] == ["objectives/gpg.py"]
    run_sweep(sw, workers=2, report=True)  # spawned workers: they load the plug-in themselves
    for arm in ("grpo", "gpg"):
        run = sw.sweep_dir / f"{arm}__s0"
        assert (run / "done").exists()
        assert any(p["kind"] == "file" for p in json.loads((run / "meta.json").read_text())["plugins"])
    assert json.loads((sw.sweep_dir / "sweep.json").read_text())["plugins"][0]["spec"] == "objectives/gpg.py"
    assert (sw.sweep_dir / "report" / "report.md").is_file()


def test_a_ray_node_without_the_file_runs_the_source_that_travelled(tmp_path):
    plug = _plugin(tmp_path, GPG)
    (p,) = plugins.load_plugins([str(plug)])
    moved = dataclasses.replace(p, path=str(tmp_path / "elsewhere" / "gpg.py"))
    del algos.SURROGATES._items["gpg"]  # a fresh process on another node: nothing registered yet
    plugins.ensure_loaded([moved])  # no such file there: the source that travelled with the task is executed
    assert "gpg" in algos.SURROGATES and algos.SURROGATES.origin("gpg") == str(plug)
    assert plugins.loaded()[-1].sha256 == p.sha256


def test_a_spec_with_a_missing_import_names_the_spec_and_file(tmp_path):
    from objbench.experiments.sweeper.plan import load_sweep

    spec = tmp_path / "s.yaml"
    spec.write_text("arms: [grpo]\nimports: [nowhere.py]\n")
    with pytest.raises(ConfigError, match=r"s\.yaml: plug-in file not found: nowhere\.py"):
        load_sweep(spec, out_dir=str(tmp_path / "out"))
    spec.write_text("arms: [grpo]\nimports: 3\n")
    with pytest.raises(ConfigError, match="'imports' must be a list"):
        load_sweep(spec, out_dir=str(tmp_path / "out"))


def test_resuming_with_a_changed_plugin_warns_and_keeps_the_old_record(tmp_path, capsys):
    from objbench.experiments.run.train import train

    plug = _plugin(tmp_path, GPG)
    (p,) = plugins.load_plugins([str(plug)])
    assert plugins.resume_warning([p.record()]) is None
    cfg = load_config(None, [*FAST, f"out_dir={tmp_path / 'runs'}", "name=r", "train.checkpoint_every=1",
                             "objective.ratio.surrogate=gpg"])

    def stop(step):
        if step == 1:
            raise KeyboardInterrupt  # as Ctrl-C would, after step 1's checkpoint

    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False, after_step=stop)
    plug.write_text(plug.read_text() + "\n# edited after the run started\n")
    del algos.SURROGATES._items["gpg"]  # a new process loads the new version
    del plugins._LOADED[str(plug.resolve())]
    plugins.load_plugins([str(plug)])
    run = train(cfg, progress=False)
    assert "in another version" in capsys.readouterr().err
    meta = json.loads((run / "meta.json").read_text())
    now = [r for r in meta["plugins"] if r["kind"] == "file"][0]["sha256"]
    before = [r for r in meta["plugins_before_resume"] if r["kind"] == "file"][0]["sha256"]
    assert meta["resumed_from_step"] == 1 and before == p.sha256 != now and (run / "done").exists()


def test_an_installed_package_entry_point_is_loaded_by_every_command(tmp_path):
    site = tmp_path / "site"
    (site / "myobj").mkdir(parents=True)
    (site / "myobj" / "__init__.py").write_text(GPG.replace('"gpg"', '"ep_gpg"'))
    dist = site / "myobj-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myobj\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[objbench.plugins]\nmyobj = myobj\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "objbench", "plugins", "list"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "ep_gpg [entry point myobj = myobj]" in out.stdout

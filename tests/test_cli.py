"""The command line and config explain themselves, and every bad input fails at load with one line.

Each bad configuration below used to fail only after compute (after the warm start or mid-training) or to be
accepted silently; each now stops in load_config, before any run folder exists."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from objbench.experiments.cli.main import main
from objbench.experiments.config import ConfigError, TrainConfig, load_config, to_dict
from objbench.experiments.config.errors import RunFolderError
from objbench.experiments.config.fields import field_rows
from objbench.experiments.run.train import train

ROOT = Path(__file__).resolve().parent.parent
FAST = ["sft.steps=20", "sft.batch_size=16", "train.steps=4", "rollout.completions_per_step=16",
        "train.eval_size=6", "train.eval_samples=2", "train.eval_every=2", "train.checkpoint_every=2",
        "train.threads=1"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def test_help_lists_every_field_without_importing_torch():
    code = ("import sys\nfrom objbench.experiments.cli.main import main\ntry:\n    main(['train', '--help'])\n"
            "except SystemExit:\n    pass\nassert 'torch' not in sys.modules, 'torch imported'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for key in ("model.path", "optim.lr", "objective.ratio.surrogate", "rollout.chat_template", "sft.steps"):
        assert f"  {key} (" in out.stdout, key
    assert "field(" not in out.stdout and "added_later" not in out.stdout  # defaults as values, not source


def test_field_listing_matches_the_dataclasses():
    def leaves(obj, prefix=""):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if dataclasses.is_dataclass(v):
                yield from leaves(v, f"{prefix}{f.name}.")
            else:
                yield f"{prefix}{f.name}"

    assert [r[0] for r in field_rows()] == list(leaves(TrainConfig()))


def test_config_command_prints_the_resolved_config(capsys):
    assert main(["config", "objective=dapo", "task.name=countdown", "seed=3"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == to_dict(load_config(None, ["objective=dapo", "task.name=countdown", "seed=3"]))
    assert printed["task"]["max_numbers"] == 4 and printed["objective"]["name"] == "dapo"


def test_sweep_help_lists_the_fields_and_print_config_gives_one_runs_config(tmp_path, capsys):
    from objbench.experiments.sweeper.plan import load_sweep

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "  optim.lr (float, default 3e-4)" in capsys.readouterr().out
    spec = str(ROOT / "experiments" / "sweeps" / "quickstart.yaml")
    out = tmp_path / "runs"
    runs = {r.cfg.run_name: r.cfg for r in load_sweep(spec, out_dir=str(out), extra_overrides=["train.steps=7"]).runs}
    for which, run in [("gspo__s1", "gspo__s1"), ("dapo", "dapo__s0")]:
        assert main(["sweep", spec, "--out", str(out), "--print-config", which, "train.steps=7"]) == 0
        text = capsys.readouterr().out
        assert text.startswith(f"# sweep quickstart (spec ") and f"run {run}\n" in text
        (tmp_path / "printed.yaml").write_text(text)
        assert load_config(tmp_path / "printed.yaml") == runs[run]  # runnable: objbench train --config printed.yaml
        assert yaml.safe_load(text)["train"]["steps"] == 7
    assert main(["sweep", spec, "--out", str(out), "--print-config", "nope"]) == 2
    assert "no such run or arm; arms: ppo, grpo, dr_grpo, dapo, gspo" in capsys.readouterr().err
    assert not out.exists()  # nothing written


def test_overrides_may_come_before_and_after_options(tmp_path, capsys):
    """`objbench sweep SPEC --workers 2 train.steps=7` (the README's order): argparse alone stops at the override."""
    f = tmp_path / "c.yaml"
    f.write_text("seed: 4\n")
    assert main(["config", "objective=dapo", "--config", str(f), "optim.lr=0.01"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["seed"], printed["optim"]["lr"], printed["objective"]["name"]) == (4, 0.01, "dapo")
    spec = str(ROOT / "experiments" / "sweeps" / "quickstart.yaml")
    assert main(["sweep", spec, "seed=1", "--print-config", "grpo", "--out", str(tmp_path), "train.steps=7"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["steps"] == 7
    assert main(["config", "seed=1", "--config", str(f), "seed=2"]) == 2  # still one key, given twice
    for bad in (["config", "seed=1", "--nope"], ["config", "--config", str(f), "--nope", "seed=1"],
                ["report", str(tmp_path), "seed=1"]):  # report takes no overrides
        with pytest.raises(SystemExit):
            main(bad)
        assert "unrecognized arguments" in capsys.readouterr().err
    assert main(["config", "--config", str(f), "seed=1", "stray"]) == 2  # not key=value: the config's own error


@pytest.mark.parametrize("override, expect", [
    ("optim.lr=nan", "optim.lr=nan is not a finite number"),
    ("optim.lr=inf", "optim.lr=inf is not a finite number"),
    ("rollout.temperature=nan", "rollout.temperature=nan"),
    ("optim.grad_clip=nan", "optim.grad_clip=nan"),
    ("objective.loss.entropy_coef=nan", "objective.loss.entropy_coef=nan"),
    ("optim.weight_decay=nan", "optim.weight_decay=nan"),
    ("optim.beta1=2", r"optim.beta1 must be in \[0, 1\)"),
    ("optim.beta2=-1", r"optim.beta2 must be in \[0, 1\)"),
    ("seed=-1", "seed and data_seed must be >= 0"),
    ("data_seed=-5", "seed and data_seed must be >= 0"),
    ("rollout.completions_per_step=1000000000", "would never finish"),
    ("model.arch=nonexistent", "not a built-in architecture"),
    ("sft.grad_clip=nan", "sft.grad_clip must be a finite number >= 0"),
    ("sft.grad_clip=-1", "sft.grad_clip must be a finite number >= 0"),
])
def test_bad_values_fail_at_load(override, expect, tmp_path):
    with pytest.raises(ConfigError, match=expect):
        load_config(None, [override])
    assert main(["train", override, f"out_dir={tmp_path / 'runs'}"]) == 2
    assert not (tmp_path / "runs").exists()


def test_wandb_without_wandb_fails_at_load(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    with pytest.raises(ConfigError, match="needs wandb"):
        load_config(None, ["log.wandb=true"])


def test_duplicate_keys_are_errors(tmp_path):
    assert main(["train", "seed=1", "seed=2"]) == 2
    assert main(["config", "optim.lr=0.1", "optim.lr=0.2"]) == 2
    assert load_config(None, ["seed=1", "seed=2"]).seed == 2  # composed layers (sweeps) may repeat a key
    f = tmp_path / "c.yaml"
    f.write_text("seed: 1\noptim:\n  lr: 0.1\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match="'lr' appears twice"):
        load_config(f)


def test_one_line_errors_for_presets_and_report(tmp_path, capsys):
    assert main(["presets", "nope"]) == 2
    assert main(["report", str(tmp_path / "missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'nope'" in err and "does not exist" in err and "Traceback" not in err
    (tmp_path / "unfinished" / "x").mkdir(parents=True)
    (tmp_path / "unfinished" / "x" / "metrics.jsonl").write_text("")
    assert main(["report", str(tmp_path / "unfinished")]) == 2  # its only run has no 'done' file
    err = capsys.readouterr().err
    assert "no 'done' file" in err and "pass --include-incomplete to load it" in err
    assert "include_incomplete=True" not in err  # the CLI names its flag, not the Python argument
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["train", f"out_dir={blocker}/runs"]) == 2
    assert "cannot write to out_dir" in capsys.readouterr().err


def test_a_second_process_cannot_enter_a_running_run(tmp_path):
    cfg = load_config(None, FAST + [f"out_dir={tmp_path}", "name=busy"])
    with open(tmp_path / ".busy.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(RunFolderError, match="another objbench process is running"):
            train(cfg, progress=False)
    assert not (tmp_path / "busy").exists()


def test_a_run_that_failed_before_its_first_checkpoint_does_not_block_the_corrected_command(tmp_path):
    bad = load_config(None, FAST + [f"out_dir={tmp_path}", "name=r", "optim.lr=0.5"])
    d = tmp_path / "r"
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump(to_dict(bad)))
    (d / "metrics.jsonl").write_text('{"step": 1}\n')  # what a run that crashed at step 1 leaves
    good = load_config(None, FAST + [f"out_dir={tmp_path}", "name=r"])
    train(good, progress=False)
    assert (d / "done").exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("r.failed-")]
    assert len(aside) == 1 and (aside[0] / "metrics.jsonl").read_text() == '{"step": 1}\n'  # kept, not deleted


@pytest.mark.parametrize("content", ["", "seed: 0\nmodel: {arch: tin", "seed: 0\n"])
def test_unreadable_or_cut_config_names_the_file(content, tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "config.yaml").write_text(content)
    cfg = load_config(None, FAST + [f"out_dir={tmp_path}", "name=r"])
    with pytest.raises(RunFolderError, match=r"r/config.yaml (cannot be read|is incomplete)"):
        train(cfg, progress=False)


def test_corrupt_checkpoint_names_the_file_and_what_to_do(tmp_path):
    cfg = load_config(None, FAST + [f"out_dir={tmp_path}", "name=c"])
    run = train(cfg, progress=False)
    (run / "done").unlink()
    opt = run / "checkpoints" / "last" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:100])  # truncated
    with pytest.raises(RunFolderError, match=r"no checkpoint of it can be loaded \(step-\d+: .*\); delete .*checkpoints to restart"):
        train(cfg, progress=False)


def test_a_cold_warm_start_says_so_and_shows_progress_in_a_log_file_too(tmp_path, monkeypatch, capfd):
    """stderr is not a terminal here (as in a log file or a job scheduler): the warm start still announces
    itself at once and prints a line per tenth of its steps; a cached one is silent; OBJBENCH_QUIET=1 silences."""
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("OBJBENCH_QUIET", raising=False)
    args = ["train", "--quiet", *FAST, "sft.until_acc=0", f"out_dir={tmp_path}"]
    assert main([*args, "name=a"]) == 0
    err = capfd.readouterr().err.splitlines()
    assert err[0] == ("warm start of seed 0: not in the cache, training it once: 20 steps; a line every 2 steps")
    steps = [int(l.split()[6]) for l in err if l.startswith("warm start of seed 0: step ")]
    assert steps == list(range(2, 21, 2))
    assert main([*args, "name=b"]) == 0  # cached
    assert "warm start" not in capfd.readouterr().err
    monkeypatch.setenv("OBJBENCH_QUIET", "1")
    assert main([*args, "name=c", "seed=1"]) == 0
    assert "warm start" not in capfd.readouterr().err


def test_wandb_mode_is_offline_only_when_nothing_is_configured(tmp_path, monkeypatch):
    """WANDB_MODE, an API key and a `wandb login` (~/.netrc for the wandb host) are left to wandb; with none of
    them the run goes offline instead of blocking on a login prompt. Needs no wandb installed."""
    from objbench.experiments.run.logs import wandb_mode

    for k in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wandb_mode() == "offline"
    for key, value in (("WANDB_MODE", "online"), ("WANDB_MODE", "disabled"), ("WANDB_API_KEY", "x" * 40)):
        monkeypatch.setenv(key, value)
        assert wandb_mode() is None, key
        monkeypatch.delenv(key)
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    assert wandb_mode() is None  # logged in
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert wandb_mode() == "offline"  # logged in to another host only
    netrc.write_text(netrc.read_text() + "machine wandb.example.org\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_mode() is None
    netrc.write_text("machine\n")  # unreadable: as if there were none
    assert wandb_mode() == "offline"


@pytest.mark.robustness
def test_wandb_resumed_run_continues_the_same_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for k in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login: offline
    args = ["train", "--quiet", *FAST, "log.wandb=true", f"out_dir={tmp_path}", "name=w"]
    env = {**os.environ, "OBJBENCH_TEST_CRASH_AT_STEP": "2", "WANDB_SILENT": "true"}
    first = subprocess.run([sys.executable, str(ROOT / "tests" / "crash_run.py"), *args], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 3, first.stderr[-2000:]  # hard crash after step 2 (checkpointed)
    env.pop("OBJBENCH_TEST_CRASH_AT_STEP")
    second = subprocess.run([sys.executable, "-m", "objbench", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    run = tmp_path / "w"
    run_id = (run / "wandb_id").read_text()
    dirs = list((run / "wandb").glob("offline-run-*"))
    assert len(dirs) == 2 and all(d.name.endswith(run_id) for d in dirs)  # two sessions, one wandb run id
    assert [json.loads(l)["step"] for l in open(run / "metrics.jsonl")] == [1, 2, 3, 4]


def test_a_run_logged_to_a_file_prints_a_line_per_evaluation_and_no_bar(tmp_path, capsys):
    """stderr is not a terminal here (as in a log file): no progress bar (tqdm redraws it with carriage returns),
    one line per evaluation instead."""
    train(load_config(None, FAST + [f"out_dir={tmp_path}", "name=logged"]), progress=True)
    out, err = capsys.readouterr()
    assert "\r" not in out + err and "step/s" not in err and "s/step" not in err
    lines = [line for line in out.splitlines() if line.startswith("logged step ")]
    assert [line.split()[2].rstrip(":") for line in lines] == ["2/4", "4/4"], out
    assert all("eval/acc" in line for line in lines)

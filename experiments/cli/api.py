"""The Python API: what the command line does, from a script or a notebook (``objbench.train``, ``objbench.sweep``,
``objbench.load_runs``, ``objbench.read_data``, ``objbench.report``). Each call loads the plug-ins it is given
(and the installed entry points) first, exactly as ``--import`` does."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

import yaml

from objbench.experiments.config import TrainConfig, check_unique_keys, load_config
from objbench.experiments.config.plugins import load_plugins

__all__ = ["train", "sweep", "load_runs", "read_data", "report"]

ConfigLike = Union[TrainConfig, str, Path, Mapping[str, Any], Sequence[str], None]


def _resolve(config: ConfigLike, overrides: Iterable[str]) -> TrainConfig:
    overrides = list(overrides)
    if isinstance(config, TrainConfig):
        if overrides:
            raise ValueError("objbench.train: overrides need a config file, a dict or a list, not a TrainConfig")
        return config
    if config is None or isinstance(config, (str, Path)):
        if isinstance(config, str) and "=" in config:  # a single "key=value"
            config, overrides = None, [config, *overrides]
        check_unique_keys(overrides)
        return load_config(config, overrides)
    if isinstance(config, Mapping):
        check_unique_keys(overrides)
        return load_config(None, overrides, extra=_nested(config))
    check_unique_keys([*config, *overrides])
    return load_config(None, [*config, *overrides])


SECTION_NAMES = {"objective": "preset", "task": "name"}  # a section chosen by name: objective=grpo, task=countdown


def _nested(settings: Mapping[str, Any]) -> dict:
    """``{"train.steps": 20, "optim": {"lr": 1e-5}}`` -> nested mappings, as a YAML config file holds them. A section
    given both by name and by settings (``{"objective": "grpo", "objective.loss.agg": "token_mean"}``, in either
    order) is the named preset (task) with those settings over it, as on the command line."""
    out: dict = {}
    for key, value in settings.items():
        *heads, last = str(key).split(".")
        node = out
        for depth, h in enumerate(heads):
            if h in node and not isinstance(node[h], dict):
                node[h] = _section(heads[:depth + 1], node[h], key)
            node = node.setdefault(h, {})
        if isinstance(value, Mapping) or isinstance(node.get(last), dict):
            given = _nested(value) if isinstance(value, Mapping) else _section([*heads, last], value, key)
            before = node.get(last, {})
            before = before if isinstance(before, dict) else _section([*heads, last], before, key)
            node[last] = {**given, **before} if not isinstance(value, Mapping) else {**before, **given}
        else:
            node[last] = value
    return out


def _section(path: list, value, key: str) -> dict:
    """A value given where a section of settings also is: a top-level section's name, else an error."""
    if len(path) == 1 and path[0] in SECTION_NAMES and not isinstance(value, Mapping):
        return {SECTION_NAMES[path[0]]: value}
    raise ValueError(f"objbench.train: setting {key!r} goes inside {'.'.join(path)!r}, which is also given a value")


def train(config: ConfigLike = None, *, overrides: Iterable[str] = (), imports: Iterable[str] = (),
          progress: bool = True) -> Path:
    """Train one run (or resume it, or skip it when finished); returns its folder.

    ``config``: a list of ``key=value`` overrides (as on the command line), a dict of settings (nested or dotted
    keys), a YAML config file, a resolved ``TrainConfig``, or None (the defaults). ``imports``: plug-in files or
    modules to load first. Example (the toy task, about a minute on a laptop core)::

        import objbench
        run = objbench.train(["objective=dr_grpo", "train.steps=20", "sft.steps=200", "out_dir=/tmp/ob"])
        print((run / "metrics.jsonl").read_text().splitlines()[-1])
    """
    from objbench.experiments.run.train import train as train_one

    load_plugins(imports)
    return train_one(_resolve(config, overrides), progress=progress)


def _spec_file(spec: Mapping[str, Any], folder: Path) -> Path:
    """A spec given as a dict, written as YAML (its relative base and imports resolved against the working
    directory, where a script's relative paths point)."""
    spec = dict(spec)
    if not spec.get("name"):
        raise ValueError("objbench.sweep: a spec given as a dict needs a 'name' (its folder under out_dir)")
    if spec.get("base"):
        spec["base"] = str(Path(spec["base"]).resolve())
    if spec.get("imports"):
        spec["imports"] = [str(Path(i).resolve()) if i.endswith(".py") or "/" in i else i for i in spec["imports"]]
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def sweep(spec: Union[str, Path, Mapping[str, Any]], *, workers: int | None = None, out_dir: str | None = None,
          overrides: Iterable[str] = (), imports: Iterable[str] = (), report: bool = True) -> Path:
    """Run a sweep spec (a YAML file, or the same as a dict) and write its report; returns the sweep folder.
    Resumable like ``objbench sweep``: finished runs are kept, unfinished ones resume. Raises ``SweepFailed`` when
    runs failed (after the report of the others). Example::

        import objbench
        folder = objbench.sweep({"name": "two_arms", "seeds": 2, "arms": ["grpo", "dr_grpo"],
                                 "set": {"train.steps": 20, "sft.steps": 200}}, workers=2, out_dir="/tmp/ob")
        print((folder / "report" / "report.md").read_text()[:500])
    """
    from objbench.experiments.sweeper.plan import load_sweep
    from objbench.experiments.sweeper.sweep import run_sweep

    with tempfile.TemporaryDirectory() as tmp:
        path = _spec_file(spec, Path(tmp)) if isinstance(spec, Mapping) else Path(spec)
        sw = load_sweep(path, out_dir=out_dir, extra_overrides=list(overrides), imports=list(imports))
        command = f"objbench.sweep({str(path)!r})" if not isinstance(spec, Mapping) else "objbench.sweep(<dict>)"
        return run_sweep(sw, workers=workers, command=command, report=report)


def load_runs(folder: Union[str, Path], include_incomplete: bool = False):
    """Every run under ``folder`` (a sweep folder, a folder of runs, or one run) as ``analysis.load.Runs``:
    ``.metrics`` (one row per run, step and metric), ``.configs`` (one row per run: arm, seed, every setting),
    ``.evals``. Example::

        runs = objbench.load_runs("/tmp/ob/two_arms")
        runs.metrics.query("metric == 'reward/mean'").groupby("arm")["value"].mean()
    """
    from objbench.analysis.load import load_runs as load

    return load(folder, include_incomplete=include_incomplete)


def read_data(path: Union[str, Path]):
    """A committed study's data (its ``runs.csv.gz``, or the folder holding it) as the same ``Runs`` that
    ``load_runs`` gives. Example::

        runs = objbench.read_data("results/group_size")
        runs.configs[["run", "arm", "seed"]].head()
    """
    from objbench.analysis.data import read_data as read

    return read(path)


def report(folder: Union[str, Path, None] = None, *, data: Union[str, Path, None] = None, **options) -> Path:
    """Write report.md with its tables and figures for a folder of runs (or remake them from a ``runs.csv.gz``
    with ``data=``); returns the path of report.md. ``options`` are ``analysis.report.write_report``'s
    (out_dir, x, primary, include_incomplete, force, ...). Example::

        objbench.report("/tmp/ob/two_arms")
    """
    from objbench.analysis.report import write_report

    return write_report(folder, data=data, **options)

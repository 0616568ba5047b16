"""``objbench card --validate``: run the card's control pairs (experiments/cards/validation.yaml) and write which
measures separate them (experiments/card/controls.py) into validation.md / validation.csv, with the runs' data.

The controls' configurations are applied on top of the grpo preset and of the battery arm each measure reads, in a
single sweep whose arms are ``<battery arm>__<config label>`` (each needed pair once, shared by the measures that
read it), so one resumable command validates the whole battery.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import yaml

from objbench.experiments.card.run import (
    Battery,
    check_clean_out,
    check_seeds,
    checked_sweep,
    load_battery,
    read_card_data,
    run_kept,
)
from objbench.experiments.config.errors import ConfigError

VALIDATION_FILE = Path(__file__).resolve().parents[1] / "cards" / "validation.yaml"


@dataclasses.dataclass(frozen=True)
class Validation:
    path: Path
    seeds: int
    card_seeds: int
    configs: dict
    controls: list


def load_validation(path: str | Path | None, battery: Battery) -> Validation:
    path = Path(path or VALIDATION_FILE).resolve()
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    if not isinstance(data, dict) or not {"seeds", "card_seeds", "configs", "controls"} <= set(data):
        raise ConfigError(f"{path}: a validation file has seeds, card_seeds, configs and controls")
    names = {m.name for m in battery.measures}
    for i, c in enumerate(data["controls"]):
        if not isinstance(c, dict) or set(c) != {"measure", "low", "high"}:
            raise ConfigError(f"{path}: controls[{i}] needs exactly measure, low and high, got {c!r}")
        if c["measure"] not in names:
            raise ConfigError(f"{path}: controls[{i}]: measure {c['measure']!r} is not in the battery {sorted(names)}")
        for side in ("low", "high"):
            if c[side] not in data["configs"]:
                raise ConfigError(f"{path}: controls[{i}]: {side} config {c[side]!r} is not one of "
                                  f"{sorted(data['configs'])}")
    if not 2 <= int(data["card_seeds"]) <= int(data["seeds"]):
        raise ConfigError(f"{path}: need 2 <= card_seeds <= seeds")
    return Validation(path, int(data["seeds"]), int(data["card_seeds"]), dict(data["configs"]), list(data["controls"]))


def validation_spec(battery: Battery, v: Validation, seeds: int) -> dict:
    """The sweep: for each control, the battery arms its measure reads, under both of its configurations."""
    from objbench.experiments.card.controls import arm_name

    measures = {m.name: m for m in battery.measures}
    arms: dict = {}
    for c in v.controls:
        m = measures[c["measure"]]
        for arm in {m.term.arm} | ({m.minus.arm} if m.minus else set()):
            for label in (c["low"], c["high"]):
                arms[arm_name(arm, label)] = {**battery.arms[arm], **v.configs[label]}
    return {"name": f"card_{v.path.stem}",
            "description": f"card battery controls {v.path.name} ({battery.description})",
            "base": str(battery.base), "seeds": seeds, "set": {"objective": "grpo"}, "arms": arms}


@dataclasses.dataclass
class ValidationJob:
    battery: Battery
    validation: Validation
    seeds: int
    sweep: object
    out: Path
    spec_text: str


def prepare_validation(out: str | None, *, seeds: int | None = None, battery: str | None = None,
                       validation: str | None = None, runs: str | None = None, force: bool = False) -> ValidationJob:
    """Everything checked (files, every run's config, a clean tree for results/) before any folder is written."""
    b = load_battery(battery)
    v = load_validation(validation, b)
    n = check_seeds(v.seeds if seeds is None else seeds)
    out_dir = Path(out or Path("results/runs/cards") / v.path.stem).resolve()
    sw, text = checked_sweep(validation_spec(b, v, n), out_dir, runs, force=force)
    return ValidationJob(b, v, n, sw, out_dir, text)


def run_validation(job: ValidationJob, *, workers: int | None = None) -> Path:
    """Run (or resume) the controls' sweep and write validation.md/.csv and the data; returns validation.md."""
    from objbench.analysis.load import load_runs

    t0 = time.time()
    folder = run_kept(job.sweep, job.spec_text, job.out, "validation_spec.yaml", workers=workers,
                      command="objbench card --validate")
    return write_validation(load_runs(folder), job.battery, job.validation, job.out,
                            command="objbench card --validate", seconds=time.time() - t0)


def write_validation(runs, battery: Battery, v: Validation, out_dir: Path, *, command: str, seconds: float,
                     data_from: str | Path | None = None) -> Path:
    """Score the control pairs of ``runs`` and write validation.md/.csv and the runs' data into ``out_dir``
    (``data_from``: the folder of the data file ``runs`` were read from, copied rather than rewritten)."""
    from objbench.analysis.provenance import format_seconds, git_state
    from objbench.experiments.card.controls import render_validation, score_controls
    from objbench.experiments.card.report import place_data, runs_line

    out_dir.mkdir(parents=True, exist_ok=True)
    runs = place_data(runs, out_dir, {"card_validation": v.path.name}, data_from)
    seeds = sorted({int(s) for s in runs.configs["seed"]})
    card_seeds = min(v.card_seeds, len(seeds))
    table = score_controls(runs, battery.measures, v.controls, card_seeds)
    table.to_csv(out_dir / "validation.csv", index=False, lineterminator="\n")
    git = git_state()
    prov = [f"- Battery `{battery.path.name}`, controls `{v.path.name}`, {len(seeds)} seeds, {len(runs.configs)} runs",
            runs_line(runs),
            (f"- Written at commit {git['commit']}{' (dirty tree)' if git['dirty'] else ''} by `{command}` "
             f"({format_seconds(seconds)} for this invocation)")]
    (out_dir / "validation.md").write_text(render_validation(table, prov, card_seeds))
    return out_dir / "validation.md"


def validation_from_data(data_dir: str | Path, out: str | None = None, *, battery: str | None = None,
                         validation: str | None = None, force: bool = False) -> Path:
    """Re-score a committed validation from its stored data (no training) into ``out`` (default ``data_dir``)."""
    t0 = time.time()
    b = load_battery(battery)
    runs = read_card_data(data_dir, "card_validation")
    # the controls file the data names, looked up beside the battery (data written before 9c8a24f stored its full
    # path on the machine that made it, which another clone does not have)
    named = Path(runs.meta["source"]["card_validation"]).name
    v = load_validation(validation or VALIDATION_FILE.parent / named, b)
    out_dir = Path(out or data_dir).resolve()
    check_clean_out(out_dir, force)
    return write_validation(runs, b, v, out_dir, command=f"objbench card --validate --from-data {data_dir}",
                            seconds=time.time() - t0, data_from=data_dir)

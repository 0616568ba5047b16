"""``objbench card --validate``: run the card's control pairs (experiments/cards/validation.yaml) and write which
measures separate them (analysis/card_validation.py) into validation.md / validation.csv, with the runs' data.

The controls' configurations are applied on top of the grpo preset and of the battery arm each measure reads, in a
single sweep whose arms are ``<battery arm>__<config label>`` (each needed pair once, shared by the measures that
read it), so one resumable command validates the whole battery.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import yaml

from objbench.experiments.card import Battery, check_seeds, checked_sweep, load_battery, run_kept
from objbench.experiments.errors import ConfigError

VALIDATION_FILE = Path(__file__).resolve().parent / "cards" / "validation.yaml"


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
    from objbench.analysis.card_validation import arm_name

    measures = {m.name: m for m in battery.measures}
    arms: dict = {}
    for c in v.controls:
        m = measures[c["measure"]]
        for arm in {m.term.arm} | ({m.minus.arm} if m.minus else set()):
            for label in (c["low"], c["high"]):
                arms[arm_name(arm, label)] = {**battery.arms[arm], **v.configs[label]}
    return {"name": "card_validation", "description": f"card battery controls ({battery.description})",
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
    out_dir = Path(out or "results/runs/cards/validation").resolve()
    sw, text = checked_sweep(validation_spec(b, v, n), out_dir, runs, force=force)
    return ValidationJob(b, v, n, sw, out_dir, text)


def run_validation(job: ValidationJob, *, workers: int | None = None) -> Path:
    """Run (or resume) the controls' sweep and write validation.md/.csv and the data; returns validation.md."""
    from objbench.analysis.card_validation import render_validation, score_controls
    from objbench.analysis.data import write_data
    from objbench.analysis.load import load_runs
    from objbench.analysis.provenance import git_state

    t0 = time.time()
    out_dir, v, n = job.out, job.validation, job.seeds
    folder = run_kept(job.sweep, job.spec_text, out_dir, "validation_spec.yaml", workers=workers,
                      command="objbench card --validate")
    loaded = load_runs(folder)
    card_seeds = min(v.card_seeds, n)
    table = score_controls(loaded, job.battery.measures, v.controls, card_seeds)
    table.to_csv(out_dir / "validation.csv", index=False, lineterminator="\n")
    write_data(loaded, out_dir, source={"card_validation": str(v.path)})
    git = git_state()
    prov = [f"- Battery `{job.battery.path.name}`, controls `{v.path.name}`, {n} seeds, {len(job.sweep.runs)} runs; "
            f"commit {git['commit']}{' (dirty tree)' if git['dirty'] else ''}; wall time of this invocation "
            f"{time.time() - t0:.0f} s"]
    (out_dir / "validation.md").write_text(render_validation(table, prov, card_seeds))
    return out_dir / "validation.md"

"""``objbench card``: one objective scored on a fixed battery of diagnostics, beside the reference objectives
(issue 32).

    objbench card objective=dr_grpo objective.ratio.eps_high=0.3 [--import FILE] [--out DIR] [--workers N]

The battery (experiments/cards/battery.yaml) is a sweep of a few small configurations (arms) and the measures read
from them, declared before any card was made. The command applies the objective's settings to every arm, runs the
sweep through the sweep machinery (resumable after a kill, progress shown, warm starts cached and shared with every
other card), scores each measure per seed with a 95% t interval over seeds (experiments/card/measures.py) and writes into DIR:
card.md, card.png (and card.pdf), card.csv (one row per measure), card_seeds.csv (every measure's value per seed),
the runs' data (runs.csv.gz, runs_meta.json) and the sweep spec it ran (card_spec.yaml). Runs go to DIR/runs unless
``--runs`` names another folder. Reference cards (results/cards/<objective>/card.csv) are drawn beside it, read
from disk, never rerun.

Only the objective, its optimiser and its sampling settings come from the command line (``user_keys`` in the
battery): task, budget, evaluation, warm start and seeds are the battery's, so cards differ in the objective only.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from objbench.experiments.card.measures import Measure, parse_measures
from objbench.experiments.config.errors import ConfigError

BATTERY_FILE = Path(__file__).resolve().parents[1] / "cards" / "battery.yaml"
"""The battery every card and reference card is made with."""


@dataclass(frozen=True)
class Battery:
    path: Path
    description: str
    seeds: int
    base: Path
    arms: dict
    user_keys: tuple[str, ...]
    measures: list[Measure]


def load_battery(path: str | Path | None = None) -> Battery:
    """The battery file (default BATTERY_FILE) checked: ConfigError naming what is wrong."""
    path = Path(path or BATTERY_FILE).resolve()
    if not path.is_file():
        raise ConfigError(f"card battery not found: {path}")
    data = yaml.safe_load(path.read_text())
    known = {"description", "seeds", "sweep", "user_keys", "measures"}
    if not isinstance(data, dict) or set(data) != known:
        raise ConfigError(f"{path}: a battery is a mapping with exactly the keys {sorted(known)}")
    sweep = data["sweep"]
    if not isinstance(sweep, dict) or set(sweep) != {"base", "arms"} or not isinstance(sweep["arms"], dict):
        raise ConfigError(f"{path}: sweep: needs base (a config file) and arms (a mapping of arm -> settings)")
    seeds = check_seeds(data["seeds"], f"{path}: seeds")
    try:
        measures = parse_measures(data["measures"], list(sweep["arms"]), f"{path}: measures")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return Battery(path, str(data["description"]), seeds, (path.parent / sweep["base"]).resolve(),
                   dict(sweep["arms"]), tuple(data["user_keys"]), measures)


def _allowed(key: str, user_keys: tuple[str, ...]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in user_keys)


def user_settings(overrides: list[str], battery: Battery) -> dict:
    """The command line's ``key=value`` items as the card's settings (values read as YAML, in order); ConfigError
    for a malformed item or a key the battery fixes."""
    settings: dict = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"card setting {item!r} is not of the form key=value")
        if not _allowed(key, battery.user_keys):
            raise ConfigError(f"card setting {key!r}: a card varies only {', '.join(battery.user_keys)} (the task, "
                              "budget, evaluation, warm start and seeds are the battery's, so that cards compare "
                              f"objectives and nothing else; {battery.path.name})")
        if key in settings:
            raise ConfigError(f"card setting {key!r} given twice")
        settings[key] = _value(value)
    return settings


def _value(text: str):
    """A command-line value as the config reads it (OmegaConf's dotlist: YAML 1.2 numbers, so 1e-4 is a float)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={text}"]))["v"]


def card_name(settings: dict) -> str:
    """A folder-safe name: the preset (grpo when none is given) and the other settings, e.g.
    ``dr_grpo__objective.ratio.eps_high=0.3``."""
    parts = [str(settings.get("objective", "grpo"))]
    parts += [f"{k}={v}" for k, v in settings.items() if k != "objective"]
    return re.sub(r"[^A-Za-z0-9_.=@+-]", "-", "__".join(parts))[:120]


def card_spec(battery: Battery, settings: dict, name: str, seeds: int) -> dict:
    """The sweep spec the card runs: the battery's arms, the objective's settings applied to every arm (before the
    arm's own, so an off-policy arm's update count wins)."""
    return {"name": name, "description": f"score card of {name} ({battery.description})", "base": str(battery.base),
            "seeds": seeds, "set": dict(settings), "arms": battery.arms}


def check_seeds(seeds, what: str = "--seeds") -> int:
    """A seed count of at least 2 (an interval needs two); ConfigError otherwise."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 2:
        raise ConfigError(f"{what} must be an integer >= 2 (an interval needs two), got {seeds!r}")
    return seeds


def check_clean_out(out_dir: Path, force: bool = False) -> None:
    """Writing into the committed results/ needs a clean tree (or ``force``): ConfigError naming the changes."""
    from objbench.analysis.provenance import DirtyTreeError, check_clean

    try:
        check_clean(out_dir, force=force)
    except DirtyTreeError as e:
        raise ConfigError(str(e)) from None


def invoked_command(default: str) -> str:
    """The ``objbench card ...`` command line this process was started with (``default`` when not started so)."""
    return "objbench card " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["card"] else default


def checked_sweep(spec: dict, out_dir: Path, runs: str | None, imports=(), force: bool = False):
    """(sweep, spec text) of a generated spec, checked before any folder: a clean tree when ``out_dir`` is in the
    committed results/, every run's config (the sweep loader); the runs go to ``runs`` or ``out_dir``/runs."""
    import tempfile

    from objbench.experiments.sweeper.plan import load_sweep

    check_clean_out(out_dir, force)
    text = yaml.safe_dump(spec, sort_keys=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(text)
        sw = load_sweep(path, out_dir=str(Path(runs).resolve() if runs else out_dir / "runs"), imports=list(imports))
    return sw, text


def run_kept(sw, text: str, out_dir: Path, spec_name: str, *, workers: int | None, command: str) -> Path:
    """Keep the checked spec in ``out_dir`` (the sweep folder's sweep.yaml copies it from there), then run (or
    resume) the sweep without a report; returns the sweep folder."""
    from objbench.experiments.sweeper.sweep import run_sweep

    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = out_dir / spec_name
    spec_path.write_text(text)
    sw.spec = dataclasses.replace(sw.spec, path=spec_path)
    return run_sweep(sw, workers=workers, command=command, report=False)


@dataclass
class CardJob:
    """A card, checked and ready to run: its sweep (every run config resolved), where it writes, how it was asked."""

    battery: Battery
    settings: dict
    name: str
    sweep: object
    out: Path
    spec_text: str
    command: str


def prepare_card(overrides: list[str], *, imports: list[str] = (), out: str | None = None, runs: str | None = None,
                 seeds: int | None = None, battery: str | None = None, force: bool = False) -> CardJob:
    """Everything checked before any compute or folder: the battery, the settings, every run's config (the
    sweep loader), and (into the committed results/) a clean tree. ConfigError names the problem."""
    b = load_battery(battery)
    settings = user_settings(list(overrides), b)
    name = card_name(settings)
    n_seeds = check_seeds(b.seeds if seeds is None else seeds)
    out_dir = Path(out or Path("results/runs/cards") / name).resolve()
    sw, spec_text = checked_sweep(card_spec(b, settings, name, n_seeds), out_dir, runs, imports, force)
    return CardJob(b, settings, name, sw, out_dir, spec_text, invoked_command(""))


def run_card(job: CardJob, *, workers: int | None = None) -> Path:
    """Run (or resume) the card's sweep, then score it and write the card into ``job.out``; returns card.md."""
    from objbench.analysis.load import load_runs
    from objbench.experiments.card.report import card_source, write_card

    t0 = time.time()
    command = job.command or f"objbench card {job.name}"
    folder = run_kept(job.sweep, job.spec_text, job.out, "card_spec.yaml", workers=workers, command=command)
    runs = load_runs(folder)
    source = card_source(job.name, job.settings, command, job.sweep.plugins)
    return write_card(runs, job.battery.measures, job.out, source=source, command=command,
                      seconds=time.time() - t0, battery=job.battery.path)


def read_card_data(data_dir: str | Path, what: str = "card"):
    """The runs stored with a committed card (or validation, ``what``) in ``data_dir``: ConfigError naming the
    problem when the folder holds no such data."""
    from objbench.analysis.data import DATA_FILE, read_data

    path = Path(data_dir) / DATA_FILE
    try:
        runs = read_data(path)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"--from-data {data_dir}: {e}") from None
    if what not in (runs.meta.get("source") or {}):
        raise ConfigError(f"--from-data {data_dir}: {path} holds no {what}'s runs (its source is "
                          f"{runs.meta.get('source')!r})")
    return runs


def check_arms(runs, battery: Battery, data_dir) -> None:
    """The stored runs were made with this battery's arms (else its measures would read other configurations)."""
    stored = (runs.meta.get("sweep") or {}).get("arms")
    if stored is not None and set(stored) != set(battery.arms):
        raise ConfigError(f"--from-data {data_dir}: its runs have arms {sorted(stored)}, the battery "
                          f"{battery.path.name} has {sorted(battery.arms)}")


def card_from_data(data_dir: str | Path, out: str | None = None, *, battery: str | None = None,
                   force: bool = False) -> Path:
    """Re-score a card from its stored data (no training) and write it into ``out`` (default ``data_dir``), drawn
    beside the reference cards as they are now; returns card.md."""
    from objbench.experiments.card.report import write_card

    t0 = time.time()
    b = load_battery(battery)
    runs = read_card_data(data_dir)
    check_arms(runs, b, data_dir)
    out_dir = Path(out or data_dir).resolve()
    check_clean_out(out_dir, force)
    command = invoked_command(f"objbench card --from-data {data_dir}")
    return write_card(runs, b.measures, out_dir, source=dict(runs.meta["source"]), command=command,
                      seconds=time.time() - t0, battery=b.path, data_from=data_dir)

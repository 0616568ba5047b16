"""What a sweep folder already holds, against what the spec asks for: runs finished, in progress, or made with other
settings (conflicts, set aside on request), and the dry-run listing (``describe``)."""


from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from objbench.experiments.config import ConfigError, config_differences, to_dict
from objbench.experiments.sweeper.plan import RUN_FILES, RunSpec, Sweep


@dataclass
class Conflict:
    """A run folder in the sweep folder that this spec would not produce."""

    run_dir: Path
    why: str  # "train.steps: 30 -> 40", or "not a run of this spec"
    finished: bool


def _short(v) -> str:
    s = json.dumps(v, default=str) if v is not None else "(absent)"
    return s if len(s) <= 40 else s[:37] + "..."


def _key(difference: str) -> str:
    return difference.removesuffix(" (absent)")


def _get(d, key: str):
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _compare(sw: Sweep, r: RunSpec) -> tuple[str, str, RunSpec]:
    """(state, why, run) of one run of the spec against its folder: state new | resume | done | changed.

    out_dir is where a run lives, not what it is (experiments.config.LOCATION_KEYS): a moved sweep folder, or one
    begun when sweeps wrote out_dir relative to the working directory, resumes or is kept as it is. Any other
    difference is "changed", also for a run that failed before its first checkpoint (which a single
    ``objbench train`` would move aside): a sweep never mixes old and new configs silently.
    """
    from objbench.experiments.run.run_folder import run_status

    try:
        state = run_status(r.cfg)[1]
        if state != "replace":
            return state, "", r
    except ConfigError:
        pass
    run_dir = sw.sweep_dir / r.cfg.run_name
    old = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    new = to_dict(r.cfg)
    keys = config_differences(old, r.cfg)  # a setting added to objbench later reads as its declared old value
    why = "; ".join(f"{k}: {_short(_get(old, _key(k)))} -> {_short(_get(new, _key(k)))}" for k in keys[:6])
    if len(keys) > 6:
        why += f"; and {len(keys) - 6} more key(s)"
    return "changed", why, r


def check_existing(sw: Sweep) -> list[Conflict]:
    """Compare every run of the spec with what its folder holds, before anything is written or computed.

    Returns the run folders that do not belong to this spec: a folder whose config.yaml differs from the run's
    resolved config (experiments.run_folder.run_status would refuse it; the differing keys are named with old -> new
    values), and run folders the spec does not name. Changes nothing on disk; may give a RunSpec back the
    relative out_dir its folder was begun with (see _compare).
    """
    conflicts, names = [], set()
    for i, r in enumerate(sw.runs):
        names.add(r.cfg.run_name)
        state, why, sw.runs[i] = _compare(sw, r)
        if state == "changed":
            run_dir = sw.sweep_dir / r.cfg.run_name
            conflicts.append(Conflict(run_dir, why, (run_dir / "done").exists()))
    if sw.sweep_dir.is_dir():
        for d in sorted(sw.sweep_dir.iterdir()):
            if d.is_dir() and d.name not in names and not d.name.startswith(".") and \
                    any((d / f).exists() for f in RUN_FILES):
                conflicts.append(Conflict(d, "not a run of this spec", (d / "done").exists()))
    return conflicts


def conflict_message(sw: Sweep, conflicts: list[Conflict]) -> str:
    lines = [f"sweep {sw.name}: {len(conflicts)} folder(s) in {sw.sweep_dir} hold runs this spec would not "
             "produce (it was edited since they ran); nothing was run, nothing changed:"]
    for c in conflicts[:20]:
        lines.append(f"  {c.run_dir.name} ({'finished' if c.finished else 'unfinished'}): {c.why}")
    if len(conflicts) > 20:
        lines.append(f"  ... and {len(conflicts) - 20} more")
    lines.append("Either keep them and write the new runs elsewhere (another `name:` in the spec, or --out DIR), "
                 f"or add --rerun-changed to move them to {sw.sweep_dir / '.replaced'}/<timestamp>/ (nothing is "
                 "deleted) and run the new spec there.")
    return "\n".join(lines)


def set_aside(sw: Sweep, conflicts: list[Conflict]) -> Path:
    """Move conflicting run folders, with the old sweep.yaml, sweep.json, failures.json and report, into
    ``<sweep>/.replaced/<timestamp>/``. Returns that folder."""
    root = sw.sweep_dir / ".replaced"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, k = root / stamp, 1
    while dest.exists():
        k += 1
        dest = root / f"{stamp}-{k}"
    dest.mkdir(parents=True)
    for c in conflicts:
        os.replace(c.run_dir, dest / c.run_dir.name)
    for name in ("sweep.yaml", "sweep.json", "failures.json", "report"):
        if (sw.sweep_dir / name).exists():
            os.replace(sw.sweep_dir / name, dest / name)
    return dest


def run_state(sw: Sweep, r: RunSpec) -> str:
    """new | resume | done | changed, for --dry-run."""
    return _compare(sw, r)[0]


def describe(sw: Sweep) -> str:
    """The runs of a sweep and what the sweep folder holds for each (new, resume, done, changed), for --dry-run."""
    lines = [f"sweep {sw.name} (spec {sw.spec_hash}) -> {sw.sweep_dir}"]
    conflicts = {c.run_dir.name: c for c in check_existing(sw)}
    for r in sw.runs:
        c = conflicts.pop(r.cfg.run_name, None)
        state = f"changed: {c.why}" if c else run_state(sw, r)
        lines.append(f"  {r.cfg.run_name:40s} objective={r.cfg.objective.name} seed={r.seed} [{state}]")
    for name, c in conflicts.items():
        lines.append(f"  {name:40s} [{c.why}]")
    if any(" [changed" in line or "not a run" in line for line in lines):
        lines.append("a sweep would stop before any compute: see --rerun-changed")
    return "\n".join(lines)


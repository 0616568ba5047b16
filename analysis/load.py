"""Read run folders from disk into tidy long-format DataFrames.

This module imports nothing from objbench: it only knows the on-disk format that experiments/ writes, so it
works on a results folder copied from another machine.

On-disk contract (one sweep folder)::

    <sweep_dir>/sweep.json            {"name", "spec_hash", "command", "arms", "seeds", "commit", "base_config"}
    <sweep_dir>/sweep.yaml            the spec as given (not read here)
    <sweep_dir>/<arm>__s<seed>/       one folder per run:
        config.yaml                   resolved config (nested; has at least seed and name)
        meta.json                     {"run", "arm", "seed", "sweep", "commit", "versions", "host", "start", "end"}
        metrics.jsonl                 one object per training step: {"step", "tokens", "time", "<ns>/<key>": ...}
        eval.jsonl                    one object per evaluation: {"step", "tokens", "eval/<key>": ...}; step 0 = start
        done                          empty, written last; a folder without it is half-written
        failed                        JSON (step, quantity, cause): a non-finite value stopped the run; never loaded

A plain runs folder without sweep.json works too; ``path`` may also be a single run folder.

Reading rules (each one a decision, stated here once):

- A run folder is any direct subfolder holding metrics.jsonl, eval.jsonl, meta.json, config.yaml or done.
- A run without ``done`` is skipped with an :class:`IncompleteRunWarning` naming it, unless
  ``include_incomplete=True`` (then it is loaded and ``configs["complete"]`` is False).
- A line of a .jsonl file that does not parse is dropped with a warning (the last line of a killed run is often
  truncated). A record without an integer ``step`` is dropped the same way.
- If a step appears more than once (a run resumed from a checkpoint re-logs steps), the last line wins, with a
  warning.
- ``null``, NaN and non-numeric values are dropped from the long tables: a missing row means "not logged".
  Booleans become 0/1. ``time`` (cumulative seconds) is kept as an ordinary metric named ``"time"``.
- arm: meta.json ``arm``, else the ``<arm>__s<seed>`` folder pattern, else config ``name``, else the folder
  name. seed: meta.json ``seed``, else config ``seed``, else the folder pattern; a run without a seed is skipped
  with a warning.
- Arm order (which fixes colours in every figure): sweep.json ``arms``, then arms found on disk but not listed
  there, in sorted order.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

__all__ = ["Runs", "SkippedRun", "IncompleteRunWarning", "load_runs", "read_jsonl", "RUN_FILES", "LONG_COLUMNS"]

RUN_FILES = ("metrics.jsonl", "eval.jsonl", "meta.json", "config.yaml", "done")
"""Files whose presence marks a folder as a run folder."""
LONG_COLUMNS = ["run", "arm", "seed", "step", "tokens", "metric", "value"]
"""Columns of ``Runs.metrics`` and ``Runs.evals``."""

_RUN_DIR_RE = re.compile(r"^(?P<arm>.+)__s(?P<seed>-?\d+)$")


class IncompleteRunWarning(UserWarning):
    """A run folder was skipped (half-written, unreadable, or without a seed)."""


@dataclass(frozen=True)
class SkippedRun:
    """A run folder that was not loaded, and why."""

    run: str
    path: str
    reason: str


@dataclass(frozen=True)
class Runs:
    """Everything read from one runs folder.

    Attributes:
        root: the folder that was read.
        metrics: long DataFrame, columns ``LONG_COLUMNS`` = (run, arm, seed, step, tokens, metric, value), one row
            per (run, step, metric) with a numeric value; from metrics.jsonl.
        evals: the same for eval.jsonl (step 0 = the start policy).
        configs: one row per loaded run: run, arm, seed, complete, path, ``meta.<key>`` columns from meta.json and
            the config flattened to dotted keys (``optim.lr``).
        sweep: sweep.json as a dict, or one synthesised from the runs (``spec_hash``/``command`` None); ``arms`` is
            the full arm order, ``seeds`` the sorted seeds, ``run_commits`` the distinct commits in meta.json.
        skipped: runs that were not loaded, with reasons.
        samples: sample counts (run, step, length, correct, count) when read from a data file that has them
            (``analysis.data``); None otherwise (studies then read samples.jsonl from the run folders).
        meta: runs_meta.json when read from a data file (``analysis.data.read_data``); {} for run folders.
    """

    root: Path
    metrics: pd.DataFrame
    evals: pd.DataFrame
    configs: pd.DataFrame
    sweep: dict[str, Any]
    skipped: tuple[SkippedRun, ...] = field(default_factory=tuple)
    samples: pd.DataFrame | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def arms(self) -> list[str]:
        """All arms in their fixed order (sweep order first), including arms listed in sweep.json without runs."""
        return list(self.sweep["arms"])

    @property
    def present_arms(self) -> list[str]:
        """Arms that have at least one loaded run, in arm order."""
        have = set(self.configs["arm"])
        return [a for a in self.arms if a in have]

    @property
    def seeds(self) -> list[int]:
        """Sorted seeds of the loaded runs."""
        return sorted(int(s) for s in self.configs["seed"].unique())

    @property
    def metric_names(self) -> list[str]:
        """Metric keys found in metrics.jsonl, in order of first appearance."""
        return list(pd.unique(self.metrics["metric"])) if "metric" in self.metrics.columns else []

    @property
    def eval_names(self) -> list[str]:
        """Metric keys found in eval.jsonl, in order of first appearance."""
        return list(pd.unique(self.evals["metric"])) if "metric" in self.evals.columns else []


# ---------------------------------------------------------------------------------------------- low level


def read_jsonl(path: str | Path) -> tuple[list[dict], list[str]]:
    """Parse a JSON-lines file, tolerating broken lines.

    Returns:
        (records, problems): the objects that parsed (in file order) and one message per dropped line. Blank
        lines are ignored silently. A missing file gives ``([], [])``.
    """
    path = Path(path)
    if not path.exists():
        return [], []
    records, problems = [], []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            where = "last line (truncated write?)" if i == last else f"line {i + 1}"
            problems.append(f"{path.name}: dropped unparsable {where}: {e.msg}")
            continue
        if not isinstance(obj, dict):
            problems.append(f"{path.name}: dropped line {i + 1}: not a JSON object")
            continue
        records.append(obj)
    return records, problems


def _numeric(v) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = float(v)
        return None if math.isnan(f) else f
    return None


def _long_from_records(records: list[dict], source: str) -> tuple[pd.DataFrame, list[str]]:
    """Records -> long DataFrame (step, tokens, metric, value); last line wins for a repeated step."""
    problems = []
    by_step: dict[int, dict] = {}
    dup = 0
    for rec in records:
        step = rec.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step != step or int(step) != step:
            problems.append(f"{source}: dropped a record without an integer 'step': {str(rec)[:80]}")
            continue
        step = int(step)
        dup += step in by_step
        by_step[step] = rec
    if dup:
        problems.append(f"{source}: {dup} repeated step(s); kept the last line for each")
    steps, tokens, metrics, values = [], [], [], []
    for step in sorted(by_step):
        rec = by_step[step]
        tok = _numeric(rec.get("tokens"))
        for key, raw in rec.items():
            if key in ("step", "tokens"):
                continue
            v = _numeric(raw)
            if v is None:
                continue
            steps.append(step)
            tokens.append(np.nan if tok is None else tok)
            metrics.append(str(key))
            values.append(v)
    df = pd.DataFrame(
        {
            "step": np.asarray(steps, dtype=np.int64),
            "tokens": np.asarray(tokens, dtype=float),
            "metric": pd.Series(metrics, dtype=object),
            "value": np.asarray(values, dtype=float),
        }
    )
    return df, problems


def _read_json(path: Path) -> tuple[dict, str | None]:
    if not path.exists():
        return {}, None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return {}, f"{path.name}: unreadable ({e})"
    return (obj, None) if isinstance(obj, dict) else ({}, f"{path.name}: not a JSON object")


def _read_yaml(path: Path) -> tuple[dict, str | None]:
    if not path.exists():
        return {}, None
    try:
        obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        return {}, f"{path.name}: unreadable ({e})"
    if obj is None:
        return {}, None
    return (obj, None) if isinstance(obj, dict) else ({}, f"{path.name}: not a mapping")


def _as_int(v) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
        return int(v)
    return None


def _is_run_dir(p: Path) -> bool:
    return p.is_dir() and any((p / f).exists() for f in RUN_FILES)


def _warn(msg: str, depth: int = 1) -> None:
    """Warn, attributed to the caller of load_runs; ``depth`` = calls between load_runs and _warn."""
    warnings.warn(msg, IncompleteRunWarning, stacklevel=2 + depth)


# ---------------------------------------------------------------------------------------------- load_runs


def load_runs(path: str | Path, include_incomplete: bool = False) -> Runs:
    """Load every run under ``path`` (a sweep folder, a plain runs folder, or one run folder).

    Args:
        path: the folder to read.
        include_incomplete: also load runs without a ``done`` file (they are marked ``complete=False``).

    Returns:
        A :class:`Runs`. See the module docstring for the reading rules.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is not a folder, holds no run folders, or every run folder was skipped (the message
            lists them and why).
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"runs folder {str(root)!r} does not exist")
    if not root.is_dir():
        raise ValueError(f"{str(root)!r} is not a folder; expected a sweep or runs folder")
    sweep_json, problem = _read_json(root / "sweep.json")
    if problem:
        _warn(f"{root}: {problem}; treating it as a plain runs folder")
    if _is_run_dir(root) and not (root / "sweep.json").exists():
        run_dirs = [root]  # a single run folder
    else:
        run_dirs = sorted((p for p in root.iterdir() if _is_run_dir(p)), key=lambda p: p.name)
    if not run_dirs:
        raise ValueError(
            f"no run folders in {str(root)!r}: expected subfolders holding any of {list(RUN_FILES)}"
        )

    loaded: list[dict] = []
    skipped: list[SkippedRun] = []
    for d in run_dirs:
        rec, reason = _load_one(d, include_incomplete)
        if reason is not None:
            skipped.append(SkippedRun(d.name, str(d), reason))
            _warn(f"skipped run {d.name!r} ({d}): {reason}")
        else:
            loaded.append(rec)
    if not loaded:
        detail = "; ".join(f"{s.run}: {s.reason}" for s in skipped)
        raise ValueError(f"no loadable runs in {str(root)!r} ({len(skipped)} skipped: {detail})")

    sweep = _sweep_info(root, sweep_json, loaded)
    order = {a: i for i, a in enumerate(sweep["arms"])}
    loaded.sort(key=lambda r: (order[r["arm"]], r["seed"], r["run"]))

    def long(kind: str) -> pd.DataFrame:
        parts = []
        for r in loaded:
            df = r[kind]
            if df.empty:
                continue
            parts.append(df.assign(run=r["run"], arm=r["arm"], seed=np.int64(r["seed"])))
        if not parts:
            return _empty_long()
        out = pd.concat(parts, ignore_index=True)[LONG_COLUMNS]
        return out.astype({"run": str, "arm": str, "seed": np.int64, "step": np.int64, "metric": str})

    configs = pd.DataFrame([r["row"] for r in loaded])
    return Runs(
        root=root,
        metrics=long("metrics"),
        evals=long("evals"),
        configs=configs,
        sweep=sweep,
        skipped=tuple(skipped),
    )


def _empty_long() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run": pd.Series(dtype=str),
            "arm": pd.Series(dtype=str),
            "seed": pd.Series(dtype=np.int64),
            "step": pd.Series(dtype=np.int64),
            "tokens": pd.Series(dtype=float),
            "metric": pd.Series(dtype=str),
            "value": pd.Series(dtype=float),
        }
    )


INCOMPLETE_HINT = "pass include_incomplete=True (objbench report --include-incomplete)"
"""How to load a run without a 'done' file, in the skip reason; the CLI shows only its flag."""


def _failed_reason(d: Path) -> str:
    """The step and quantity a failed run's ``failed`` file names (JSON written by the training loop)."""
    try:
        rec = json.loads((d / "failed").read_text())
        return f"step {rec['step']}, {rec['quantity']} not finite"
    except (OSError, ValueError, KeyError, TypeError):
        return "see its meta.json"


def _load_one(d: Path, include_incomplete: bool) -> tuple[dict | None, str | None]:
    """Read one run folder -> (record, None) or (None, reason to skip). A run that a non-finite value stopped (its
    ``failed`` file) is never loaded, whatever include_incomplete says: it is listed with its reason instead."""
    if (d / "failed").exists():
        return None, f"failed: {_failed_reason(d)} (never averaged in)"
    complete = (d / "done").exists()
    if not complete and not include_incomplete:
        return None, f"no 'done' file (half-written run); {INCOMPLETE_HINT} to load it"
    meta, p_meta = _read_json(d / "meta.json")
    cfg, p_cfg = _read_yaml(d / "config.yaml")
    problems = [p for p in (p_meta, p_cfg) if p]
    if not (d / "metrics.jsonl").exists() and not (d / "eval.jsonl").exists():
        return None, "neither metrics.jsonl nor eval.jsonl"

    m = _RUN_DIR_RE.match(d.name)
    arm = meta.get("arm") or (m.group("arm") if m else None) or cfg.get("name") or d.name
    seed = _as_int(meta.get("seed"))
    if seed is None:
        seed = _as_int(cfg.get("seed"))
    if seed is None and m:
        seed = int(m.group("seed"))
    if seed is None:
        return None, "no seed in meta.json, config.yaml or the folder name"

    recs, p1 = read_jsonl(d / "metrics.jsonl")
    metrics, p2 = _long_from_records(recs, "metrics.jsonl")
    recs, p3 = read_jsonl(d / "eval.jsonl")
    evals, p4 = _long_from_records(recs, "eval.jsonl")
    problems += p1 + p2 + p3 + p4
    run = d.name
    for p in problems:
        _warn(f"run {run!r}: {p}", depth=2)
    if not complete:
        _warn(f"run {run!r} has no 'done' file; loaded anyway (include_incomplete=True)", depth=2)

    row: dict[str, Any] = {"run": run, "arm": str(arm), "seed": seed, "complete": complete, "path": str(d)}
    rest = {k: v for k, v in meta.items() if k not in ("run", "arm", "seed")}
    if rest:
        row.update(pd.json_normalize(rest, sep=".").add_prefix("meta.").iloc[0].to_dict())
    if cfg:
        flat = pd.json_normalize(cfg, sep=".").iloc[0].to_dict()
        row.update({k: v for k, v in flat.items() if k not in row})
    return {"run": run, "arm": str(arm), "seed": seed, "metrics": metrics, "evals": evals, "row": row}, None


def _sweep_info(root: Path, sweep_json: dict, loaded: list[dict]) -> dict[str, Any]:
    """sweep.json completed with what the runs say; arm order = sweep order, then extra arms sorted."""
    listed = [str(a) for a in (sweep_json.get("arms") or [])]
    found = sorted({r["arm"] for r in loaded} - set(listed))
    commits = sorted({str(r["row"]["meta.commit"]) for r in loaded if r["row"].get("meta.commit")})
    info: dict[str, Any] = {
        "name": root.resolve().name,
        "spec_hash": None,
        "command": None,
        "commit": commits[0] if len(commits) == 1 else None,
        "base_config": None,
    }
    info.update(sweep_json)
    info["arms"] = listed + found
    info["seeds"] = sorted({int(s) for s in (sweep_json.get("seeds") or [])} | {r["seed"] for r in loaded})
    info["run_commits"] = commits
    info["has_sweep_json"] = bool(sweep_json)
    return info

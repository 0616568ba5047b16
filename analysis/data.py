"""A study's raw data in two small files next to its report, from which every table and figure is remade.

``results/runs/`` (the run folders) is not committed; the report folder is. ``write_data`` puts what the report
reads into the report folder, and ``read_data`` turns it back into the same :class:`analysis.load.Runs`, so a reader
can recompute any interval from the committed files alone (``write_report(data=...)``,
``objbench report --from-data results/<study>/runs.csv.gz``).

Files::

    runs.csv.gz       one row per (run, step): run, arm, seed, step, tokens (metrics.jsonl), eval_tokens
                      (eval.jsonl), then one column per metrics.jsonl key and one per eval.jsonl key, in order of first
                      appearance; empty cell = not logged at that step. Timing and memory keys (time, time/*, mem/*)
                      are dropped.
    runs_meta.json    format, sweep.json (completed as analysis.load does), which columns come from which file, the
                      columns stored at float32 precision, the dropped keys, skipped runs, the report options, the
                      config keys shared by every run (config_common), and per run: arm, seed, complete, config_hash
                      (sha256 of its config.yaml), the config keys that differ from config_common, commit, versions,
                      start, end, wall_s, resumed_from_step, data_seed, spec_hash, warm_start_sha256
                      (meta.json sft.weights_sha256, when present), threads (torch threads the run used: CPU
                      results depend on it; a sweep uses 1 per worker by default).
    samples.csv.gz    only for studies that read samples.jsonl (length_bias): run, step, length (characters),
                      correct (0/1), count (number of logged responses with that length and correctness).

Decisions:

- Lossless: ``read_data(write_data(runs))`` gives back every kept value bit for bit. A column whose every value is
  exactly a float32 (most logged metrics come from float32 tensors) is written with float32's shortest repr (at most
  9 significant digits instead of 17) and read back through float32; other columns use float64's shortest repr.
- Wide rather than long: a (run, step) row holds every metric once, which gzip compresses better than repeating
  the metric name per value; the long tables are rebuilt on reading.
- Configs as "common + per-run differences": the differences are exactly what the arms vary, readable at a glance.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from objbench.analysis.load import LONG_COLUMNS, Runs

__all__ = ["DATA_FILE", "META_FILE", "SAMPLES_FILE", "FORMAT", "DROP_KEYS", "DROP_PREFIXES", "write_data", "read_data",
           "read_samples_jsonl", "data_paths"]

DATA_FILE = "runs.csv.gz"
META_FILE = "runs_meta.json"
SAMPLES_FILE = "samples.csv.gz"
FORMAT = "objbench-runs/1"
DROP_KEYS = ("time",)
DROP_PREFIXES = ("time/", "mem/")
"""Keys dropped from the data file: the per-step timing and memory keys (cumulative ``time``, ``time/*``,
``mem/*``), the ones that differ between two runs of the same config and seed (experiments.train's
NONDETERMINISTIC_KEYS) and that no table reads; about a tenth of the file. Wall time per run stays in
runs_meta.json."""

_BASE = ["run", "arm", "seed", "step", "tokens", "eval_tokens"]


def data_paths(path: str | Path) -> tuple[Path, Path, Path]:
    """(runs.csv.gz, runs_meta.json, samples.csv.gz) for a data file or the folder holding it."""
    p = Path(path)
    folder = p if p.is_dir() or not p.name.endswith(".gz") else p.parent
    data = p if not p.is_dir() and p.name.endswith(".gz") else folder / DATA_FILE
    return data, folder / META_FILE, folder / SAMPLES_FILE


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> dotted keys (lists stay values), like ``pandas.json_normalize(sep=".")``."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and v:
                out.update(flatten(v, key + "."))
            else:
                out[key] = v
    return out


def jsonable(v: Any) -> Any:
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if np.isnan(v) else float(v)  # JSON has no NaN
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    return str(v)


def _read_json(p: Path) -> dict:
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
        return obj if isinstance(obj, dict) else {}
    except (OSError, ValueError):
        return {}


def _run_record(row: dict) -> tuple[dict, dict]:
    """(meta record, flat config) of one loaded run, re-read from its folder."""
    d = Path(str(row.get("path") or ""))
    meta = _read_json(d / "meta.json") if d.is_dir() else {}
    cfg_path = d / "config.yaml"
    cfg, cfg_hash = {}, None
    if cfg_path.is_file():
        raw = cfg_path.read_bytes()
        cfg_hash = hashlib.sha256(raw).hexdigest()
        try:
            loaded = yaml.safe_load(raw.decode("utf-8", errors="replace"))
            cfg = loaded if isinstance(loaded, dict) else {}
        except yaml.YAMLError:
            cfg = {}
    sft = meta.get("sft") if isinstance(meta.get("sft"), dict) else {}
    from objbench.analysis.provenance import wall_time

    wt = wall_time([meta])
    rec = {"run": row["run"], "arm": row["arm"], "seed": int(row["seed"]), "complete": bool(row.get("complete", True)),
           "config_hash": cfg_hash, "commit": meta.get("commit"), "versions": meta.get("versions"),
           "start": meta.get("start"), "end": meta.get("end"), "wall_s": wt["total_s"],
           "resumed_from_step": meta.get("resumed_from_step"), "data_seed": meta.get("data_seed"),
           "spec_hash": meta.get("spec_hash"), "warm_start_sha256": sft.get("weights_sha256"),
           "threads": meta.get("threads")}
    flat = {k: v for k, v in flatten(cfg).items() if k not in ("seed",)}  # seed is a run field already
    return jsonable(rec), jsonable(flat)


def _is_float32(v: np.ndarray) -> bool:
    v = v[np.isfinite(v)]
    if v.size == 0:
        return False
    with np.errstate(over="ignore"):
        return bool(np.all(v.astype(np.float32).astype(np.float64) == v))


def _wide(long: pd.DataFrame, tokens_col: str) -> tuple[pd.DataFrame, list[str]]:
    """Long (run, step, tokens, metric, value) -> one row per (run, step), metric columns in first-seen order."""
    if long.empty:
        return pd.DataFrame(columns=["run", "step", tokens_col]), []
    keys = list(pd.unique(long["metric"]))
    w = long.pivot(index=["run", "step"], columns="metric", values="value")
    tok = long.groupby(["run", "step"], sort=False)["tokens"].first()
    w = w.reindex(columns=keys)
    w.insert(0, tokens_col, tok.reindex(w.index))
    w = w.reset_index()
    w.columns.name = None
    return w, keys


def read_samples_jsonl(configs: pd.DataFrame) -> pd.DataFrame:
    """samples.jsonl of every run in ``configs`` (columns run, path) as counts: run, step, length (characters of
    the response), correct (0/1), count; unparsable lines are skipped."""
    rows = []
    for run, path in zip(configs["run"], configs["path"]):
        p = Path(str(path)) / "samples.jsonl"
        if not p.exists():
            continue
        for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                s = json.loads(line)
                rows.append((run, int(s["step"]), len(s["response"]), int(bool(s["correct"]))))
            except (ValueError, KeyError, TypeError):
                continue
    df = pd.DataFrame(rows, columns=["run", "step", "length", "correct"])
    if df.empty:
        return df.assign(count=pd.Series(dtype=np.int64))
    order = {r: i for i, r in enumerate(configs["run"])}
    out = df.groupby(["run", "step", "length", "correct"], sort=False).size().rename("count").reset_index()
    out = out.assign(_o=out["run"].map(order)).sort_values(["_o", "step", "length", "correct"], kind="stable")
    return out.drop(columns="_o").reset_index(drop=True)


def write_data(runs: Runs, out_dir: str | Path, *, samples: pd.DataFrame | None = None,
               report_options: dict | None = None, source: dict | None = None, drop_keys=DROP_KEYS,
               drop_prefixes=DROP_PREFIXES) -> dict[str, Path]:
    """Write runs.csv.gz, runs_meta.json (and samples.csv.gz when ``samples`` is given) into ``out_dir``.

    Args:
        runs: loaded runs (``analysis.load.load_runs``), each with its folder in ``configs["path"]``.
        out_dir: the report folder.
        samples: counts from :func:`read_samples_jsonl`, for studies that read samples; None = no samples file.
        report_options: the report's options, stored so ``read_data`` + ``write_report`` make the same report.
        source: where the runs came from (runs folder, loading notes, the declared report section), stored as is.
        drop_keys, drop_prefixes: metric keys, and key prefixes, left out.

    Returns:
        ``{"data": path, "meta": path[, "samples": path]}``. gzip members carry no name or time stamp, so the same
        runs give the same bytes.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wide, m_keys, e_cols, dropped = _wide_table(runs, drop_keys, drop_prefixes)
    text, f32 = _float32_text(wide, ["tokens", "eval_tokens"] + m_keys + list(e_cols.values()))
    paths = {"data": out / DATA_FILE, "meta": out / META_FILE}
    buf = io.StringIO()
    text.to_csv(buf, index=False, lineterminator="\n")
    _write_gz(paths["data"], buf.getvalue())

    recs, common = _run_records(runs.configs)
    sweep = {k: v for k, v in runs.sweep.items()}
    meta = {"format": FORMAT, "data_file": DATA_FILE, "samples_file": SAMPLES_FILE if samples is not None else None,
            "sweep": jsonable(sweep), "metric_columns": m_keys, "eval_columns": {v: k for k, v in e_cols.items()},
            "float32_columns": f32, "dropped_keys": dropped,
            "skipped": [{"run": s.run, "path": s.path, "reason": s.reason} for s in runs.skipped],
            "report_options": jsonable(report_options or {}), "source": jsonable(source or {}),
            "config_common": common, "runs": recs}
    paths["meta"].write_text(json.dumps(meta, indent=1, allow_nan=False, default=str) + "\n")
    if samples is not None:
        paths["samples"] = out / SAMPLES_FILE
        sbuf = io.StringIO()
        samples[["run", "step", "length", "correct", "count"]].to_csv(sbuf, index=False, lineterminator="\n")
        _write_gz(paths["samples"], sbuf.getvalue())
    else:
        (out / SAMPLES_FILE).unlink(missing_ok=True)  # no stale samples of an earlier report
    return paths


def _wide_table(runs: Runs, drop_keys, drop_prefixes) -> tuple[pd.DataFrame, list[str], dict[str, str], list[str]]:
    """The rows of runs.csv.gz, one per (run, step) in run order: ``(wide, metric keys, eval key -> column,
    dropped keys)``. An eval key that is also a metrics key (or a base column) gets the column ``eval.jsonl:<key>``."""
    order = {r: i for i, r in enumerate(runs.configs["run"])}

    def keep(df):
        if df.empty:
            return df
        gone = df["metric"].isin(list(drop_keys)) | df["metric"].str.startswith(tuple(drop_prefixes) or ("\0",))
        return df[~gone]

    dropped = sorted(set(runs.metrics["metric"]) - set(keep(runs.metrics)["metric"])) if not runs.metrics.empty else []
    m_wide, m_keys = _wide(keep(runs.metrics), "tokens")
    e_wide, e_keys = _wide(keep(runs.evals), "eval_tokens")
    e_cols = {k: (k if k not in set(m_keys) and k not in _BASE else f"eval.jsonl:{k}") for k in e_keys}
    e_wide = e_wide.rename(columns=e_cols)
    wide = m_wide.merge(e_wide, on=["run", "step"], how="outer")
    for c in ("tokens", "eval_tokens"):
        if c not in wide.columns:
            wide[c] = np.nan
    info = runs.configs.set_index("run")
    wide["arm"] = wide["run"].map(info["arm"])
    wide["seed"] = wide["run"].map(info["seed"]).astype(np.int64)
    wide = (wide.assign(_o=wide["run"].map(order)).sort_values(["_o", "step"], kind="stable").drop(columns="_o"))
    value_cols = m_keys + list(e_cols.values())
    return wide[_BASE + value_cols].reset_index(drop=True), m_keys, e_cols, dropped


def _float32_text(wide: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """``wide`` with each float32-exact column of ``columns`` as strings of float32's shortest repr ("" = missing),
    and the names of those columns; a column is converted only when the strings read back to the same values."""
    text = wide.copy()
    f32 = []
    for c in columns:
        v = wide[c].to_numpy(dtype=float)
        if not _is_float32(v):
            continue
        s = np.array(["" if np.isnan(x) else str(np.float32(x)) for x in v], dtype=object)
        if np.array_equal(_parse_f32(s), v, equal_nan=True):  # checked, not assumed: the file is lossless
            text[c] = s
            f32.append(c)
    return text, f32


def _run_records(configs: pd.DataFrame) -> tuple[list[dict], dict]:
    """runs_meta.json's per-run records and ``config_common``: the config keys with the same value in every run;
    each record's ``config`` holds the keys that differ from it."""
    recs, flats = [], []
    for row in configs.to_dict("records"):
        rec, flat = _run_record(row)
        recs.append(rec)
        flats.append(flat)
    common = {}
    if flats:
        for k, v in flats[0].items():
            if all(k in f and f[k] == v for f in flats[1:]):
                common[k] = v
    for rec, flat in zip(recs, flats):
        rec["config"] = {k: v for k, v in flat.items() if k not in common or common[k] != v}
    return recs, common


def _write_gz(path: Path, text: str) -> None:
    raw = text.encode("utf-8")
    with open(path, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as g:
        g.write(raw)


def _parse_f32(strings: np.ndarray) -> np.ndarray:
    """Strings written from float32 values ("" = missing) -> float64 arrays of those float32 values."""
    s = np.where(strings == "", "nan", strings).astype(str)
    return s.astype(np.float32).astype(np.float64)


def _read_csv_gz(path: Path, **kw) -> pd.DataFrame:
    extra = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}
    return pd.read_csv(path, compression="gzip", **extra, **kw)


def read_data(path: str | Path) -> Runs:
    """The :class:`Runs` stored by :func:`write_data`; ``path`` is runs.csv.gz or its folder.

    ``Runs.meta`` holds runs_meta.json and ``Runs.samples`` the sample counts (None without a samples file);
    ``configs["path"]`` is empty (the run folders are not part of the data).

    Raises:
        FileNotFoundError: a file is missing. ValueError: an unknown format.
    """
    data, meta_path, samples_path = data_paths(path)
    for p in (data, meta_path):
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist: expected {DATA_FILE} and {META_FILE} written by "
                                    "analysis.report.write_report")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise ValueError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    f32 = set(meta.get("float32_columns", []))
    m_keys = list(meta["metric_columns"])
    e_cols = dict(meta["eval_columns"])  # column -> key
    dtypes = {"run": str, "arm": str, "seed": np.int64, "step": np.int64}
    wide = _read_csv_gz(data, dtype={**dtypes, **{c: str for c in f32}}, keep_default_na=False,
                        na_values={c: [""] for c in ["tokens", "eval_tokens"] + m_keys + list(e_cols)})
    for c in f32:
        wide[c] = _parse_f32(wide[c].to_numpy(dtype=object))
    for c in ["tokens", "eval_tokens"] + m_keys + list(e_cols):
        wide[c] = wide[c].astype(np.float64)

    def long(cols: dict[str, str], tokens_col: str) -> pd.DataFrame:
        if not cols:
            return _empty_long()
        sub = wide[["run", "arm", "seed", "step", tokens_col] + list(cols)]
        vals = sub[list(cols)].to_numpy(dtype=float)
        r, c = np.nonzero(~np.isnan(vals))  # row-major: run, step, then column order
        names = np.array(list(cols.values()), dtype=object)
        out = pd.DataFrame({"run": sub["run"].to_numpy()[r], "arm": sub["arm"].to_numpy()[r],
                            "seed": sub["seed"].to_numpy()[r].astype(np.int64),
                            "step": sub["step"].to_numpy()[r].astype(np.int64),
                            "tokens": sub[tokens_col].to_numpy(dtype=float)[r], "metric": names[c],
                            "value": vals[r, c]})
        return out[LONG_COLUMNS].astype({"run": str, "arm": str, "metric": str})

    metrics = long({k: k for k in m_keys}, "tokens")
    evals = long(e_cols, "eval_tokens")
    rows = []
    common = meta.get("config_common", {})
    for rec in meta["runs"]:
        row = {"run": rec["run"], "arm": rec["arm"], "seed": int(rec["seed"]), "complete": bool(rec["complete"]),
               "path": ""}
        row.update({f"meta.{k}": v for k, v in flatten({k: rec[k] for k in rec if k not in (
            "run", "arm", "seed", "complete", "config")}).items()})
        cfg = {**common, **rec.get("config", {})}
        row.update({k: v for k, v in cfg.items() if k not in row})
        rows.append(row)
    configs = pd.DataFrame(rows)
    samples = None
    if meta.get("samples_file"):
        samples = _read_csv_gz(samples_path, dtype={"run": str, "step": np.int64, "length": np.int64,
                                                    "correct": np.int64, "count": np.int64})
    from objbench.analysis.load import SkippedRun

    skipped = tuple(SkippedRun(s["run"], s["path"], s["reason"]) for s in meta.get("skipped", []))
    return Runs(root=data.parent, metrics=metrics, evals=evals, configs=configs, sweep=dict(meta["sweep"]),
                skipped=skipped, samples=samples, meta=meta)


def _empty_long() -> pd.DataFrame:
    from objbench.analysis.load import _empty_long as empty

    return empty()

"""Regenerate one committed run from scratch and compare it with the committed data, value by value.

    python -m objbench.experiments.sweeper.reproduce results/quickstart grpo__s0            # cold warm-start cache, in a temp dir
    python -m objbench.experiments.sweeper.reproduce results/quickstart grpo__s0 --keep DIR # keep the regenerated run folder

A committed study keeps every logged value of every run (``runs.csv.gz``) and the resolved config, commit, warm
start hash and thread count of each (``runs_meta.json``). This command rebuilds the run's config from the
study's sweep spec at the current code, refuses if it differs from the committed config (naming the keys), trains
the run with an empty warm-start cache and the committed run's thread count, and then compares:

- the warm start's weights (sha256 of the safetensors files) with the committed ``warm_start_sha256``;
- every metric and evaluation value at every step with the committed one (exact equality: CPU kernels are
  deterministic for a fixed thread count; the first step that differs is named, with the largest difference).

Exit status 0 when everything matches, 1 when something differs, 2 on bad input. CI runs it on the quickstart's
GRPO seed-0 run (``tests/test_reproduce.py``, ``-m repro``). A mismatch on another machine type (other CPU
instruction set, other torch build) is expected to show as a first differing step: RL trajectories are chaotic,
so a difference in the last bit of one kernel grows into different samples; on such a machine compare the
study's intervals instead of single runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

IGNORED_CONFIG_KEYS = {"out_dir"}  # where the run is written, not what it computes



def committed_config(meta: dict, run: str) -> dict:
    rec = _record(meta, run)
    return {**meta.get("config_common", {}), **rec.get("config", {})}


def _record(meta: dict, run: str) -> dict:
    recs = {r["run"]: r for r in meta.get("runs", [])}
    if run not in recs:
        raise ValueError(f"run {run!r} is not in the committed data; its runs: {sorted(recs)}")
    return recs[run]


def flat_config(cfg) -> dict:
    """A config as the committed data stores it: config.yaml's YAML, flattened to dotted keys, without seed."""
    import yaml

    from objbench.analysis.data import flatten, jsonable
    from objbench.experiments.config import to_yaml

    return jsonable({k: v for k, v in flatten(yaml.safe_load(to_yaml(cfg))).items() if k != "seed"})


def config_differences(committed: dict, now: dict) -> list[str]:
    from objbench.experiments.config import TrainConfig, absent_values

    keys = sorted((set(committed) | set(now)) - IGNORED_CONFIG_KEYS)
    # settings added to objbench after the data was committed read as their declared neutral values
    added = {k: v for k, v in absent_values(TrainConfig, committed.get("task.name")).items() if k in now and k not in committed}
    shown = {k: f"<absent: {v!r}>" for k, v in added.items()}
    committed = {**added, **committed}
    return [f"{k}: committed {shown.get(k) or repr(committed.get(k, '<absent>'))}, now {now.get(k, '<absent>')!r}"
            for k in keys if committed.get(k, "<absent>") != now.get(k, "<absent>")]


def compare_values(old, new) -> dict:
    """Compare two long tables (run, step, metric, value) of one run: {"n", "mismatches", "first_step", ...}.
    Metrics that the committed run never logged (added to the code since) are listed under "added", not compared."""
    a = {(int(s), m): float(v) for s, m, v in zip(old["step"], old["metric"], old["value"])}
    b = {(int(s), m): float(v) for s, m, v in zip(new["step"], new["metric"], new["value"])}
    known = {m for _, m in a}  # metrics the committed run logged; one it never logged was added to the code since
    added = sorted({m for _, m in b} - known)
    b = {k: v for k, v in b.items() if k[1] in known}
    bad = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        same = x is not None and y is not None and (x == y or (math.isnan(x) and math.isnan(y)))
        if not same:
            bad.append((k, x, y))
    out = {"n": len(set(a) | set(b)), "mismatches": len(bad), **({"added": added} if added else {})}
    if bad:
        diffs = [abs(x - y) for _, x, y in bad if x is not None and y is not None]
        (step, metric), x, y = bad[0]
        out.update(first_step=step, first_metric=metric, first_committed=x, first_now=y,
                   max_abs_diff=max(diffs) if diffs else None,
                   missing=[f"{m}@{s}" for (s, m), x, y in bad if x is None or y is None][:10])
    return out


def reproduce(data: str | Path, run: str, *, spec: str | Path | None = None, workdir: str | Path,
              cache_dir: str | Path | None = None, threads: int | None = None) -> dict:
    """Train ``run`` of the committed study at ``data`` again under ``workdir`` and compare (see module doc).

    Raises ValueError (bad input, or a config that no longer matches the committed one) before training."""
    import torch

    from objbench.analysis.data import read_data
    from objbench.analysis.load import load_runs
    from objbench.experiments.run.provenance import cpu_signature
    from objbench.experiments.run.train import train
    from objbench.experiments.sweeper.plan import load_sweep

    runs = read_data(data)
    meta = runs.meta
    rec = _record(meta, run)
    spec_path = Path(spec or meta["sweep"].get("spec_path") or "")
    if not spec_path.is_file():
        raise ValueError(f"sweep spec {str(spec_path)!r} not found (run from the repository root or pass --spec)")
    workdir = Path(workdir)
    sw = load_sweep(spec_path, out_dir=str(workdir / "runs"))
    specs = [r for r in sw.runs if r.cfg.run_name == run]
    if not specs:
        raise ValueError(f"{spec_path} has no run {run!r}; its runs: {[r.cfg.run_name for r in sw.runs]}")
    cfg = specs[0].cfg
    diffs = config_differences(committed_config(meta, run), flat_config(cfg))
    if diffs:
        raise ValueError(f"the config of {run} at this commit differs from the committed one, so the comparison "
                         "would not be like for like:\n  " + "\n  ".join(diffs))
    n_threads = threads or rec.get("threads") or 1  # the sweep's default: 1 torch thread per worker
    torch.set_num_threads(n_threads)
    cache = Path(cache_dir) if cache_dir else workdir / "cache"  # empty: the warm start is trained again
    t0 = time.time()
    run_dir = train(cfg, progress=False, cache_dir=cache, meta_extra={"spec_hash": sw.spec_hash})
    wall = time.time() - t0
    new = load_runs(run_dir)
    new_meta = json.loads((Path(run_dir) / "meta.json").read_text())
    ws_now = (new_meta.get("sft") or {}).get("weights_sha256")
    old_m, old_e = (t[t["run"] == run] for t in (runs.metrics, runs.evals))
    dropped = set(meta.get("dropped_keys", []))  # timing and memory: not stored, not comparable
    new_m = new.metrics[~new.metrics["metric"].isin(dropped)]
    new_e = new.evals[~new.evals["metric"].isin(dropped)]
    res = {"run": run, "data": str(data), "committed_commit": rec.get("commit"), "threads": n_threads,
           "wall_s": round(wall, 1), "run_dir": str(run_dir),
           "warm_start": {"committed": rec.get("warm_start_sha256"), "now": ws_now,
                          "equal": rec.get("warm_start_sha256") == ws_now},
           "metrics": compare_values(old_m, new_m), "evals": compare_values(old_e, new_e)}
    cpu_then, cpu_now = (rec.get("versions") or {}).get("cpu"), cpu_signature()
    res["cpu"] = {"committed": cpu_then, "now": cpu_now, "same": cpu_then == cpu_now}
    res["ok"] = res["warm_start"]["equal"] and not res["metrics"]["mismatches"] and not res["evals"]["mismatches"]
    return res


def describe(res: dict) -> str:
    ws = res["warm_start"]
    lines = [f"{res['run']} regenerated in {res['wall_s']} s with {res['threads']} thread(s) "
             f"(committed at {str(res['committed_commit'])[:12]})",
             f"  warm start sha256: committed {ws['committed']}, now {ws['now']}: "
             f"{'equal' if ws['equal'] else 'DIFFERENT'}"]
    if "cpu" in res:
        c = res["cpu"]
        lines.append(f"  CPU: committed on {c['committed'] or '(not recorded)'}, now {c['now']}"
                     + ("" if c["same"] else " (another CPU kind: float32 results need not be bit-identical)"))
    for k in ("metrics", "evals"):
        c = res[k]
        if not c["mismatches"]:
            lines.append(f"  {k}: all {c['n']} values equal")
        else:
            lines.append(f"  {k}: {c['mismatches']} of {c['n']} values differ; first at step {c['first_step']} "
                         f"({c['first_metric']}: committed {c['first_committed']}, now {c['first_now']}), "
                         f"largest difference {c['max_abs_diff']}")
        if c.get("added"):
            lines.append(f"  {k}: logged now but not in the committed run (added since, not compared): "
                         f"{', '.join(c['added'])}")
    lines.append("REPRODUCED" if res["ok"] else "NOT REPRODUCED")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="a committed study folder (or its runs.csv.gz)")
    ap.add_argument("run", help="run name, e.g. grpo__s0")
    ap.add_argument("--spec", help="sweep spec (default: the one named in runs_meta.json)")
    ap.add_argument("--keep", help="write the regenerated run here instead of a temporary folder")
    ap.add_argument("--cache", help="warm-start cache to use (default: an empty one, so the start is retrained)")
    ap.add_argument("--threads", type=int, help="torch threads (default: the committed run's)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            res = reproduce(args.data, args.run, spec=args.spec, workdir=args.keep or tmp, cache_dir=args.cache,
                            threads=args.threads)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    print(describe(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

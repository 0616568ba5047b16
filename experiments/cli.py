"""objbench command line.

  objbench train  [--config FILE] [key=value ...]     one run (objective=grpo picks a preset)
  objbench sweep  SPEC.yaml [--workers N]             a sweep of arms x seeds, then its report (exit 1 if runs failed)
  objbench report RUNS_DIR                            report.md with figures and tables
  objbench bench  [--config FILE] [key=value ...]     step-time breakdown and tokens/s
  objbench presets [NAME ...]                         print presets as tables
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time


def _cmd_train(args) -> int:
    from experiments.config import load_config
    from experiments.train import train

    cfg = load_config(args.config, args.overrides)
    t0 = time.time()
    run_dir = train(cfg, progress=not args.quiet)
    print(f"{run_dir} ({time.time() - t0:.1f}s)")
    return 0


def _cmd_sweep(args) -> int:
    from experiments.sweep import SweepFailed, check_gpus_per_run, describe, load_sweep, run_sweep

    sw = load_sweep(args.spec, out_dir=args.out, extra_overrides=args.overrides)
    if args.dry_run:
        print(describe(sw))
        return 0
    gpus = None if args.gpus_per_run is None else check_gpus_per_run(args.gpus_per_run, "--gpus-per-run")
    command = "objbench sweep " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    t0 = time.time()
    try:
        run_sweep(sw, workers=args.workers, executor=args.executor, command=command, report=not args.no_report,
                  gpus_per_run=gpus, rerun_changed=args.rerun_changed)
    except SweepFailed as e:  # the failed runs and their errors are listed above and in failures.json
        print(f"objbench: sweep {sw.name}: {e}", file=sys.stderr)
        return 1
    print(f"sweep {sw.name} finished in {time.time() - t0:.0f}s")
    return 0


def _cmd_report(args) -> int:
    from analysis.report import write_report

    kw = {"primary": args.primary} if args.primary else {}
    print(write_report(args.runs_dir, out_dir=args.out, x=args.x, **kw))
    return 0


def _cmd_bench(args) -> int:
    from experiments.bench import bench

    bench(args.config, args.overrides, steps=args.steps, warmup=args.warmup)
    return 0


def _cmd_presets(args) -> int:
    from algos import presets
    from algos.config import format_config_table

    names = args.names or list(presets)
    for n in names:
        if n not in presets:
            raise ValueError(f"unknown preset {n!r}; choose one of: {', '.join(presets)}")
        print(f"## {n}\n{format_config_table(presets[n])}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="objbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train one run")
    t.add_argument("--config", help="YAML run config (default: built-in defaults)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. objective=dapo train.steps=100")
    t.set_defaults(fn=_cmd_train)

    s = sub.add_parser("sweep", help="run a sweep spec (resumable), then write its report")
    s.add_argument("spec", help="sweep spec YAML, e.g. experiments/sweeps/quickstart.yaml")
    s.add_argument("--workers", type=int, default=None, help="parallel runs (default: number of cores)")
    s.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local worker processes, or Ray for multi-machine sweeps (RAY_ADDRESS names a running "
                        "cluster; the output folder and OBJBENCH_CACHE must be on a filesystem every node shares)")
    s.add_argument("--out", default=None, help="output root (default: the spec's out_dir or results/runs)")
    s.add_argument("--gpus-per-run", type=float, default=None, metavar="G",
                   help="GPUs one run needs (Ray num_gpus; locally at most GPUs/G runs at once, each seeing its own "
                        "GPUs); a fraction shares a GPU (default: the spec's resources.gpus_per_run, else 1 when "
                        "model.device is cuda or auto with CUDA present, else 0)")
    s.add_argument("--rerun-changed", action="store_true",
                   help="when the sweep folder holds runs of an edited spec, move them to <sweep>/.replaced/"
                        "<timestamp>/ and run the new spec (without it such a sweep stops before any compute)")
    s.add_argument("--dry-run", action="store_true", help="list the runs (new, resume, done or changed) and exit")
    s.add_argument("--no-report", action="store_true", help="skip report.md")
    s.add_argument("overrides", nargs="*", help="key=value overrides applied to every run")
    s.set_defaults(fn=_cmd_sweep)

    r = sub.add_parser("report", help="write report.md, figures and tables for a folder of runs")
    r.add_argument("runs_dir")
    r.add_argument("--x", choices=("step", "tokens"), default="step", help="x axis of learning curves")
    r.add_argument("--out", default=None, help="output folder (default: RUNS_DIR/report)")
    r.add_argument("--primary", default=None,
                   help="metric of the main tables (default: the sweep spec's report.primary, else eval/acc)")
    r.set_defaults(fn=_cmd_report)

    b = sub.add_parser("bench", help="time a few steps: tokens/s and where a step's time goes")
    b.add_argument("--config", help="YAML run config")
    b.add_argument("--steps", type=int, default=20, help="timed steps (after warmup)")
    b.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    b.add_argument("overrides", nargs="*")
    b.set_defaults(fn=_cmd_bench)

    pr = sub.add_parser("presets", help="print objective presets")
    pr.add_argument("names", nargs="*")
    pr.set_defaults(fn=_cmd_presets)
    return p


def main(argv=None) -> int:
    from experiments.config import ConfigError

    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"objbench: config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("objbench: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

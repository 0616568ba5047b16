"""objbench: compare RL objectives for language models (PPO, GRPO, Dr. GRPO, DAPO, GSPO and any mix of their
parts) under identical conditions.

The subpackages live in the repository's top-level folders and install under this package:

    objbench.algos        pure-torch objectives: advantages, ratios and clipping, aggregation, KL, presets, registries
    objbench.envs         tasks with verifiable rewards: prompt streams, difficulty, tokenizers, verifiers
    objbench.rollout      policy/reference/critic models, generation engines, teacher-forced scoring, warm start
    objbench.experiments  configs, the training loop, the CLI, sweep specs and the sweep runner
    objbench.analysis     run folders -> DataFrames, statistics, figures, tables, report.md

The command line is ``objbench`` (``python -m objbench`` does the same). From Python:

    from objbench import load_config, train
    cfg = load_config(None, ["objective=grpo", "train.steps=20"])
    run_dir = train(cfg)
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "load_config", "train"]


def __getattr__(name: str):
    """The Python API, imported on first use so that ``import objbench`` stays light (no torch)."""
    if name == "load_config":
        from objbench.experiments.config import load_config

        return load_config
    if name == "train":
        from objbench.experiments.train import train

        return train
    raise AttributeError(f"module 'objbench' has no attribute {name!r}")

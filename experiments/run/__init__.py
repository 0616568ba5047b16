"""One training run: the loop (train.py: the run's driver and one step; update.py: the optimizer steps of a step)
and each job beside it in a file named for it: setup, warm start, collection and sampling, evaluation,
checkpoints, the run folder, logs, provenance, diagnostics. Imports the config layer and algos / envs / rollout,
never a package above it (sweeper, card, cli) and never analysis."""

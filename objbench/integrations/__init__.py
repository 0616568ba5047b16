"""objbench's objectives inside other frameworks: ``objbench.integrations.trl`` (TRL's GRPOTrainer)."""

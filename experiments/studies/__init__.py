"""Study drivers: one module per study that needs models (sampling, scoring, gradients) before its analysis, run
as ``python -m objbench.experiments.studies.<name>``. Each computes its numbers here and writes its tables, figures
and README through objbench.analysis.studies, so, like the CLI, these modules sit above analysis.

- ``kl_estimators``: the KL-estimator study (no training): estimator quality of k1, k2, k3 on the tiny policy and
  the gradient behaviour of the KL forms; kl_tokens.py and kl_gradients.py are its compute parts.
"""

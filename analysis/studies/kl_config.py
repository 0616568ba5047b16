"""The KL-estimator study's settings: ``Args`` (everything that determines its numbers, with the seed), the
estimators, the gradient forms it compares and the named thresholds its verdicts are traced to. See
objbench.experiments.studies.kl_estimators (the study's command) for what each part measures."""

from __future__ import annotations

from dataclasses import dataclass

ESTIMATORS = ("k1", "k2", "k3")
COLORS = {"k1": "#1f77b4", "k2": "#ff7f0e", "k3": "#2ca02c"}  # fixed per estimator in every figure

# Schulman (2020), "Approximating KL Divergence": (mu, kind) -> (bias / KL, std / KL)
SCHULMAN_TABLE = {
    (0.1, "k1"): (0.0, 20.0), (0.1, "k2"): (0.002, 1.42), (0.1, "k3"): (0.0, 1.42),
    (1.0, "k1"): (0.0, 2.0), (1.0, "k2"): (0.25, 1.73), (1.0, "k3"): (0.0, 1.70),
}

# The KL forms whose gradients part b compares: name -> label in the tables
GRAD_FORMS = {
    "k1": "k1 as loss",
    "k2": "k2 as loss",
    "k3": "k3 as loss",
    "k3_k2grad": "k3_k2grad as loss (value k3, gradient k2; verl k3+)",
    "k3_ratio": "k3_ratio as loss (r k3, r not detached; TRL / DeepSeek-V3.2)",
    "k1_reward": "k1 in the reward (REINFORCE sg(k1) ∇log π)",
    "k2_reward": "k2 in the reward (REINFORCE sg(k2) ∇log π)",
    "k3_reward": "k3 in the reward (REINFORCE sg(k3) ∇log π)",
    "x_dlogpi": "REFERENCE.md k2 row literally: x ∇log π",
}

# Verdict thresholds (named, so a verdict can be traced to a number)
UNBIASED_Z = 4.0        # sampled |bias| / standard error below this in every bin -> "no detectable bias"
EXACT_UNBIASED = 1e-6   # enumerated |E[k | prefix] - KL_t| / KL below this in every bin -> "exactly unbiased"
MIN_BIN_TOKENS = 50     # bins with fewer tokens are dropped from the tables
GRAD_RTOL = 1e-10       # exact-gradient identities: relative error below this (float64)
ZERO_GRAD_TOL = 1e-12   # "zero expected gradient": |g| / |grad KL| below this


@dataclass(frozen=True)
class Args:
    """Everything that determines the study's numbers (with the seed); --quick shrinks the sizes."""

    out: str = "results/kl_estimators"
    """output folder"""
    seed: int = 0
    """seeds the warm start (through the config), perturbations, prompts, sampling and the toys"""
    quick: bool = False
    """smoke-test sizes (seconds); the numbers are then too noisy to read"""
    sigmas: tuple = (0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 1.0)
    """weight-noise scales of the perturbed policies (relative to each parameter tensor's std)"""
    n_prompts: int = 1024
    """prompts per policy (part a)"""
    group: int = 4
    """completions per prompt (part a)"""
    gauss_samples: int = 1_000_000
    """samples per mu for the Gaussian table"""
    distances: tuple = (0.1, 0.5, 2.0, 4.0)
    """logit-noise scales s of the categorical and sequence toys (pi = ref + s N(0, 1))"""
    vocab: int = 10
    """categorical toy vocabulary"""
    mc_tokens: int = 10_000
    """tokens per Monte-Carlo gradient estimate"""
    mc_reps: int = 200
    """Monte-Carlo repetitions (for its std)"""
    seq_instances: int = 20
    """random (pi, ref) pairs per distance in the sequence toy"""
    overrides: tuple = ()
    """config overrides for the warm start, e.g. sft.steps=30 (key=value)"""
    cache_dir: str | None = None
    """warm-start cache (default $OBJBENCH_CACHE or ~/.cache/objbench)"""

    @staticmethod
    def quick_sizes() -> dict:
        return dict(sigmas=(0.03, 0.3, 1.0), n_prompts=64, group=2, gauss_samples=100_000, mc_tokens=1000,
                    mc_reps=20, seq_instances=3)


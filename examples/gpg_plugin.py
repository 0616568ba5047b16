"""A plug-in objective: GPG's surrogate (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning
Baseline"): the plain policy-gradient loss -A log pi(y_t), no importance ratio and no clip.

Load it with `objbench train --import examples/gpg_plugin.py objective.ratio.surrogate=gpg`, or `imports:` in a
sweep spec; `objective.options.gpg.scale=0.5` sets its own setting.
"""

from dataclasses import dataclass

from objbench.algos import SURROGATES, Surrogate


@dataclass(frozen=True)
class GPGSettings:
    scale: float = 1.0
    """multiplies the advantage (1 = GPG as published)"""


def gpg(*, ratio, logp, adv, mask, opts, settings):
    """Per-token loss -scale * A * log pi; no clip events (the clip metrics read 0)."""
    return -settings.scale * adv * logp, {}


SURROGATES.register("gpg", Surrogate(gpg, reads=(), levels=("token",), settings=GPGSettings))

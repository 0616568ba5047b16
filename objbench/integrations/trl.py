"""Any objbench objective (a preset, a config, or a plug-in's member) as the loss of TRL's ``GRPOTrainer``.

    from objbench.integrations.trl import ObjbenchGRPOTrainer
    trainer = ObjbenchGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(num_generations=8, beta=0.0, ...),
                                  train_dataset=..., objective="gspo")   # or an ObjectiveConfig, or a dict
    trainer.train()

TRL samples, scores the rewards, computes the group advantages and old / reference log-probs as usual; the loss
of each batch is ``objbench.algos.compute_loss`` on TRL's per-token log-probs: the objective's ratio level,
surrogate, clipping, aggregation mode, KL estimator and entropy bonus. Its metrics are logged as ``objbench/<name>``.
The loss of a batch is divided by TRL's gradient-accumulation steps in training, as TRL's own "grpo" loss is; with
``gradient_accumulation_steps=1`` and ``steps_per_generation=1`` it equals objbench's loss on the batch exactly
(``tests/test_trl_integration.py``, ``-m trl``).

Required of the TRL settings (checked when the trainer is built; ValueError naming both settings):
- ``num_generations`` == ``objective.group_size``;
- the advantages are TRL's: ``objective.adv.estimator`` must be ``group`` and ``scale_rewards`` must match
  ``objective.adv.scale`` (group / batch / none); TRL adds 1e-4 to the std (objbench's presets 1e-6);
- ``beta`` == ``objective.kl.beta`` when the objective puts its KL in the loss, else ``beta=0`` (then TRL computes
  no reference log-probs); a KL in the reward is not supported (the rewards are TRL's);
- no objbench sampling-side setting: filters (dynamic sampling, overlong shaping, group selection or correction),
  adaptive group sizes, schedules;
- no TRL loss masks objbench would not see: ``top_entropy_quantile=1``, ``off_policy_mask_threshold=None``, and
  no vLLM importance-sampling correction.
Ignored TRL settings (the objective decides instead): ``loss_type``, ``epsilon``, ``epsilon_high``, ``delta``,
``importance_sampling_level``, ``use_bias_correction_kl``, the SAPO temperatures. Ignored objective settings
(TRL's ``num_iterations`` and ``steps_per_generation`` decide how a batch is reused): ``n_epochs``,
``n_minibatches``.
"""

from __future__ import annotations

import warnings

import torch
from trl import GRPOTrainer

from objbench import algos
from objbench.algos import ObjectiveConfig

__all__ = ["ObjbenchGRPOTrainer", "resolve_objective", "check_trl_settings"]


def resolve_objective(objective) -> ObjectiveConfig:
    """A preset name, an ObjectiveConfig, or a dict of dotted overrides (``{"preset": "grpo", "loss.agg": ...}``)."""
    if isinstance(objective, ObjectiveConfig):
        return objective
    if isinstance(objective, str):
        return algos.get_preset(objective)
    if isinstance(objective, dict):
        over = dict(objective)
        return algos.with_overrides(algos.get_preset(over.pop("preset", "grpo")), over)
    raise TypeError(f"objective must be a preset name, an ObjectiveConfig or a dict, got {type(objective).__name__}")


def check_trl_settings(obj: ObjectiveConfig, args) -> list:
    """ValueError for the first setting pair that does not fit (module docstring); returns the warnings for
    objective settings TRL's loop makes irrelevant."""
    scale = {True: "group", False: "none"}.get(args.scale_rewards, args.scale_rewards)
    kl_beta = obj.kl.beta if obj.kl.placement == "loss" else 0.0
    f = obj.filters
    rules = [
        (args.num_generations == obj.group_size,
         f"num_generations={args.num_generations} but objective.group_size={obj.group_size}"),
        (obj.adv.estimator == "group",
         f"objective.adv.estimator={obj.adv.estimator!r}: the advantages are TRL's group advantages (use 'group')"),
        (scale == obj.adv.scale, f"scale_rewards={args.scale_rewards!r} but objective.adv.scale={obj.adv.scale!r}"),
        (obj.kl.placement != "reward",
         "objective.kl.placement='reward': the rewards are TRL's; put the KL in the loss"),
        (args.beta == kl_beta, f"beta={args.beta} but the objective's KL in the loss has beta {kl_beta} "
                               f"(objective.kl.placement={obj.kl.placement!r}, kl.beta={obj.kl.beta})"),
        (not (f.dynamic_sampling or f.overlong_penalty or f.top_select or f.group_correction or f.overlong_filter),
         "objective.filters.* act on sampling, which TRL does: turn them off"),
        (not algos.groups.adaptive(obj), "objective.groups.rule: adaptive group sizes need objbench's sampler"),
        (not obj.schedules, "objective.schedules: not supported inside TRL"),
        (args.top_entropy_quantile == 1.0, "top_entropy_quantile < 1 masks tokens the objbench loss would not see"),
        (args.off_policy_mask_threshold is None, "off_policy_mask_threshold masks sequences the objbench loss would "
                                                 "not see"),
        (not (args.use_vllm and args.vllm_importance_sampling_correction),
         "vllm_importance_sampling_correction: the objbench loss has no sampler correction; set it to False"),
    ]
    for ok, why in rules:
        if not ok:
            raise ValueError(f"ObjbenchGRPOTrainer: {why}")
    return [f"objective.{k}={getattr(obj, k)} is not read inside TRL (its num_iterations / steps_per_generation "
            f"decide how a batch is reused)" for k in ("n_epochs", "n_minibatches") if getattr(obj, k) != 1]


class ObjbenchGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with the loss of an objbench objective (module docstring)."""

    def __init__(self, *args, objective="grpo", **kwargs):
        super().__init__(*args, **kwargs)
        self.objective = resolve_objective(objective)
        for message in check_trl_settings(self.objective, self.args):
            warnings.warn(message, stacklevel=2)

    def _compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        mask = inputs["completion_mask"].bool()
        logp, entropy, _ = self._get_per_token_logps_and_entropies(
            model, torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1), completion_ids.size(1),
            compute_entropy=self.objective.loss.entropy_coef != 0)
        old = inputs.get("old_per_token_logps")
        loss, metrics = algos.compute_loss(
            self.objective, logp=logp, old_logp=logp.detach() if old is None else old,
            advantages=inputs["advantages"], mask=mask, ref_logp=inputs.get("ref_per_token_logps"),
            entropy=entropy, max_len=self.max_completion_length)
        mode = "train" if self.model.training else "eval"
        for name, value in metrics.items():
            self._metrics[mode][f"objbench/{name}"].append(float(value))
        return loss / self.current_gradient_accumulation_steps if mode == "train" else loss



"""Every key a run writes to metrics.jsonl and eval.jsonl, documented in one place.

Keys are namespaced ``family/name``. The algos package returns bare names (see ``algos.METRIC_DOCS``);
``ALGOS_KEYS`` maps them to their logged names. Keys with ``{d}`` exist once per difficulty level, keys with
``{k}`` once per pass count k (0..G) that occurred in the step, keys with ``{g}`` once per group size that
occurred (adaptive group sizes), keys with ``{field}`` once per scheduled setting (``section.field``).
Per-step values from several optimizer steps (n_minibatches x n_epochs) are averaged, except ``*_max``
(max) and ``*_min`` (min).
"""

from __future__ import annotations

ALGOS_KEYS = {
    "reward_mean": "adv/reward_mean",
    "pass_rate": "adv/pass_rate",
    "zero_var_frac": "adv/zero_var_frac",
    "kl_in_reward_mean": "kl/in_reward",
    "adv_mean": "adv/mean",
    "adv_std": "adv/std",
    "adv_abs_mean": "adv/abs_mean",
    "clipfrac_low": "policy/clipfrac_low",
    "clipfrac_high": "policy/clipfrac_high",
    "ratio_mean": "policy/ratio_mean",
    "ratio_max": "policy/ratio_max",
    "ratio_min": "policy/ratio_min",
    "dual_clip_frac": "policy/dual_clip_frac",
    "approx_kl": "policy/approx_kl",
    "policy_loss": "loss/policy",
    "kl_loss": "loss/kl",
    "kl_ref": "loss/kl_ref_k3",
    "entropy": "loss/entropy",
    "loss": "loss/total",
    "value_loss": "value/loss",
    "value_clipfrac": "value/clipfrac",
    "value_mean": "value/mean",
    "value_explained_var": "value/explained_var",
}

METRICS = {
    "step": "RL step (one rollout batch), 1-based",
    "tokens": "cumulative generated response tokens (all sampling rounds, EOS included)",
    "time": "cumulative wall-clock seconds of training steps (excludes evaluation and checkpoints)",
    "reward/mean": "mean shaped reward over every completion sampled this step",
    "reward/acc": "fraction of completions sampled this step that are correct",
    "reward/acc_d{d}": "the same, for prompts of difficulty d",
    "length/mean": "mean response length in tokens (EOS included)",
    "length/correct": "mean length of correct responses (NaN if none)",
    "length/incorrect": "mean length of incorrect responses (NaN if none)",
    "length/filler_correct": "arithmetic with task.filler_max > 0: mean filler characters in correct responses "
                             "(NaN if none); the length-bias study's length, free of the answer's own length",
    "length/filler_incorrect": "the same for well-formed incorrect responses (malformed ones have no filler count)",
    "length/filler_gap": "length/filler_incorrect - length/filler_correct: how much longer wrong answers are padded "
                         "(the length-bias study's primary metric; NaN when either is)",
    "rollout/trunc_frac": "fraction of completions that hit max_new_tokens without EOS",
    "rollout/parse_rate": "fraction of completions sampled this step in which the verifier found an answer at all "
                          "(not malformed / unparseable); below 0.1 the run warns once, naming the task setting "
                          "that decides the answer format",
    "reward/pass@{n}": "unbiased pass@n over each prompt's group of completions this step (n = 2, 4, ... up to the "
                       "group size), averaged over groups; beside reward/acc (pass@1) it tells sharpening from "
                       "learning",
    "rollout/completions": "completions sampled this step (more than the budget when dynamic sampling refills)",
    "rollout/tokens": "response tokens generated this step",
    "rollout/rounds": "sampling rounds this step (1 unless dynamic sampling refilled)",
    "rollout/groups_kept": "groups available for training after dynamic sampling",
    "rollout/engine_logp_abs_diff_mean": "engines with their own kernels (vllm, rollout.vllm.recompute_logp): mean "
                                         "over valid tokens of |engine behaviour log-prob - trainer log-prob| of "
                                         "the sampled tokens; the trainer's value is used as old log-prob",
    "rollout/engine_logp_abs_diff_max": "the same, max over valid tokens (large values: the engine samples from "
                                        "other weights than the trainer's, or another dtype)",
    "rollout/zero_var_frac": "fraction of groups of the first sampling round whose rewards are all equal "
                             "(before dynamic sampling; adv/zero_var_frac is the same on the training batch)",
    "adv/group_weight_k{k}": "mean over the step's groups with k correct responses (of G) of the group's total "
                             "advantage weight sum_i |A_i| (sequence-level advantage); only for k that occurred",
    "adv/weight_share_d{d}": "tasks with several difficulties: share of the loss's advantage weight "
                             "sum_{i,t} w_it |A_it| (w = the aggregation's per-token weights) carried by the "
                             "responses of difficulty d; the shares sum to 1 (NaN when every advantage is 0). "
                             "experiments.train.weight_shares",
    "adv/groups_k{k}": "number of groups with k correct responses this step (weights adv/group_weight_k{k})",
    "adv/group_weight_g{g}_k{k}": "adaptive group sizes: adv/group_weight_k{k} over the groups of size g only",
    "adv/groups_g{g}_k{k}": "adaptive group sizes: number of groups of size g with k correct responses",
    "sched/{field}": "value in effect this step of a setting that follows a schedule: objective fields as "
                     "section.field (objective.schedules), rollout.temperature (temperature_schedule or "
                     "temperature_control; training sampling only, held-out sampling keeps rollout.temperature or train.eval_temperature)",
    "groups/prompts": "adaptive group sizes: prompts sampled this step (all rounds)",
    "groups/size_mean": "adaptive group sizes: mean group size this step (completions / prompts, all rounds)",
    "groups/size_d{d}": "adaptive group sizes: mean group size of the prompts of difficulty d this step",
    "groups/pass_rate_d{d}": "adaptive group sizes: running pass rate of difficulty d before this step (groups.ema, "
                             "groups.prior; it chooses the sizes under groups.rule pass_rate); from step 2 on",
    "filters/top_kept_frac": "filters.top_select: fraction of the training batch's responses kept in the loss",
    "filters/corrected_frac": "filters.group_correction: fraction of the groups sampled this step (all rounds) "
                              "whose rewards were scaled (malformed share above filters.correction_share)",
    "filters/overlong_frac": "filters.overlong_penalty: fraction of the completions sampled this step (all rounds) "
                             "longer than max_new_tokens - overlong_cache, i.e. penalised",
    "filters/overlong_penalty": "filters.overlong_penalty: mean overlong penalty (<= 0, added to the reward) over "
                                "the completions sampled this step (all rounds)",
    "filters/malformed_frac": "filters.group_correction: fraction of the completions sampled this step that the "
                              "verifier judged malformed",
    "policy/log_ratio_std": "std over valid tokens of log(pi/pi_old) at the start of each optimizer step "
                            "(0 on the first minibatch of an on-policy batch)",
    "policy/seq_log_ratio_std": "std over sequences of the per-sequence mean log ratio (GSPO's log s_i)",
    "policy/entropy": "mean next-token entropy over valid response tokens (first pass over each minibatch)",
    "kl/exact": "exact KL(pi || pi_ref) summed over the vocabulary, mean over valid tokens",
    "kl/exact_fwd": "exact KL(pi_ref || pi), mean over valid tokens",
    "kl/k1": "k1 estimate of KL(pi || pi_ref) on the sampled tokens (mean over valid tokens)",
    "kl/k2": "k2 estimate",
    "kl/k3": "k3 estimate",
    "optim/grad_norm": "global policy grad norm before clipping (mean over optimizer steps)",
    "optim/lr": "policy learning rate of this step's optimizer updates (mean over them); logged only with "
                "optim.lr_schedule != constant or optim.warmup_steps > 0",
    "optim/grad_norm_clipped": "global policy grad norm after clipping at optim.grad_clip, the norm the update "
                               "used (mean over optimizer steps; not logged when optim.grad_clip = 0)",
    "optim/clip_active": "share of optimizer steps whose grad norm exceeded optim.grad_clip and was scaled down "
                         "(not logged when optim.grad_clip = 0)",
    "optim/steps": "optimizer steps this RL step (n_minibatches x n_epochs)",
    "optim/nonfinite_skipped": "optimizer steps skipped this RL step because their loss, gradient norm or rewards "
                               "were not finite (logged only with train.nan_policy=skip_step)",
    "optim/tokens": "response tokens that went through the policy update this RL step (x n_epochs)",
    "time/step": "seconds of this step; time/rollout and time/update split it",
    "time/{phase}": "seconds in a phase: sample, reward, reference, critic, advantages, forward, loss, backward, "
                    "optimizer, metrics, old_logp (the trainer rescoring an engine's samples, vllm)",
    "rollout/staleness": "training steps between the weights that sampled this step's batch and the policy being "
                         "trained (rollout.staleness > 0 only; smaller during the first steps)",
    "mem/peak_rss_mb": "peak resident memory of the process so far (MiB)",
    "mem/gpu_peak_mb": "peak GPU memory allocated by torch in the process so far (MiB; CUDA runs only: weights, "
                       "optimizer state, activations, KV cache)",
    "eval/acc": "greedy accuracy on the held-out set",
    "eval/acc_d{d}": "greedy accuracy on held-out prompts of difficulty d",
    "eval/length": "mean greedy response length on the held-out set",
    "eval/pass@1_d{d}": "sampled (temperature-1) accuracy on held-out prompts of difficulty d",
    "eval/pass@{n}": "unbiased pass@n from train.eval_samples samples per held-out prompt (Chen et al., 2021), "
                     "n = 1, 2, 4, ... below train.eval_samples, and train.eval_samples",
    **{v: f"algos metric {k!r} (see algos.METRIC_DOCS)" for k, v in ALGOS_KEYS.items()},
}


def rename(metrics: dict) -> dict:
    """Map algos' bare metric names to logged names (unknown keys go under ``algos/``)."""
    return {ALGOS_KEYS.get(k, f"algos/{k}"): v for k, v in metrics.items()}


def reduce(key: str, values: list[float]) -> float:
    if len(values) == 1:  # one minibatch (the default): the value itself, as the general case gives it
        v = values[0]
        if v != v:
            return float("nan")
        return v if key.endswith(("_max", "_min")) else (0 + v) / 1  # sum([v]) / 1: -0.0 becomes 0.0
    vals = [v for v in values if v == v]  # drop NaN
    if not vals:
        return float("nan")
    if key.endswith("_max"):
        return max(vals)
    if key.endswith("_min"):
        return min(vals)
    return sum(vals) / len(vals)


def undocumented(keys) -> list[str]:
    """The keys that no entry of METRICS documents ({d} and {k} stand for integers)."""
    import re

    def pattern(key: str):
        rx = re.escape(key)
        for name, sub in (("d", r"\d+"), ("k", r"\d+"), ("n", r"\d+"), ("g", r"\d+"), ("phase", r"[a-z_]+"),
                          ("field", r"[a-z_]+(\.[a-z_]+)*")):
            rx = rx.replace(r"\{" + name + r"\}", sub)
        return re.compile("^" + rx + "$")

    pats = [pattern(k) for k in METRICS]
    return sorted(k for k in keys if not any(p.match(k) for p in pats))

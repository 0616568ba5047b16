"""The warm start: the cached supervised start policy of (task, model, sft settings, seed), identical for every
arm of a seed, trained on the task's reference answers (clean, then noisy) until a competence criterion."""

from __future__ import annotations

import functools
import os
import sys

from objbench.envs import task_spec
from objbench.envs.tokenizer import VOCAB_SIZE
from objbench.experiments.config import (
    TrainConfig,
    check_model,
    max_new_tokens,
    to_dict,
)
from objbench.rollout.bundle import (
    DTYPES,
    Codec,
    char_codec,
    fingerprint_folder,
    folder_codec,
    load_hf,
    resolve_device,
)
from objbench.rollout.code_fingerprint import code_fingerprint
from objbench.rollout.decode import decode_responses
from objbench.rollout.engine import HFEngine, SamplingParams
from objbench.rollout.models import build_policy, n_params
from objbench.rollout.sft import Until, cached_warm_start, sft_train


def corrupt_digit(text: str, rng) -> str:
    """Replace one digit of ``text`` with a different digit (noisy demonstrations for the warm start)."""
    pos = [i for i, ch in enumerate(text) if ch.isdigit()]
    if not pos:
        return text
    i = rng.choice(pos)
    wrong = rng.choice([d for d in "0123456789" if d != text[i]])
    return text[:i] + wrong + text[i + 1:]


def demonstrations(cfg: TrainConfig, task, probs, rng, noisy: bool) -> list[str]:
    """The warm start's target completions for `probs`: the task's reference answers, and in the noisy phase each
    one corrupted (one wrong digit) with probability sft.noise, or the task's own per-problem rate where it has
    one (a mixture's per-component `sft_noise`, None = sft.noise)."""
    targets = [task.sft_target(p, rng) for p in probs]
    per_problem = getattr(task, "sft_noise", None)
    if not noisy or (per_problem is None and not cfg.sft.noise):
        return targets
    rates = ([cfg.sft.noise] * len(probs) if per_problem is None
             else [cfg.sft.noise if r is None else r for r in map(per_problem, probs)])
    targets = [corrupt_digit(t, rng) if rng.random() < r else t for t, r in zip(targets, rates)]
    if hasattr(task, "relabel"):  # e.g. a verdict that must follow the altered answer
        targets = [task.relabel(p, t) for p, t in zip(probs, targets)]
    return targets


SFT_VALIDATION_SIZE = 512


def _competence_check(cfg: TrainConfig, task, codec: Codec):
    """reached(policy) -> (every difficulty's greedy accuracy >= sft.until_acc, {"acc_d<d>": ...}) on
    SFT_VALIDATION_SIZE training-distribution problems from a stream of their own (never the held-out set)."""
    problems = task.prompts(cfg.seed + 7919 + 104_729, 0, SFT_VALIDATION_SIZE)
    params = SamplingParams(max_new_tokens(cfg, task), 0.0, 1.0, codec.eos_id, codec.pad_id)
    p_ids, p_mask = codec.encode_prompts(problems)

    def reached(policy):
        gen = HFEngine(policy).generate(p_ids, p_mask, params, None)
        ids = gen.response_ids.masked_fill(~gen.response_mask, codec.pad_id)
        texts = decode_responses(codec.tokenizer, ids)
        ok = [task.reward(p, t, bool(tr)).correct for p, t, tr in zip(problems, texts, gen.truncated.tolist())]
        acc = {}
        for d in sorted({p.difficulty for p in problems}):
            sel = [c for c, p in zip(ok, problems) if p.difficulty == d]
            acc[f"acc_d{d}"] = round(sum(sel) / len(sel), 4)
        return all(v >= cfg.sft.until_acc for v in acc.values()), acc

    return reached


def warm_start(cfg: TrainConfig, task, codec: Codec | None = None, cache_dir=None):
    """The cached SFT start for (task, model, sft settings, seed); identical for every arm of a seed.

    Built-in architectures start from random weights and the character tokenizer; a pretrained ``model.path``
    starts from its own weights (then ``sft.steps`` > 0 fine-tunes it on the task's reference answers first).
    """
    if cfg.model.path:
        folder = check_model(cfg)["folder"]
        if codec is None:  # the sweep trains warm starts before its runs, with no run's codec at hand
            codec = folder_codec(folder, cfg.rollout.chat_template)
        device = resolve_device(cfg.model.device)
        key = {"task": task_spec(task), "model_hash": fingerprint_folder(folder),
               "dtype": cfg.model.dtype, "attn": cfg.model.attn, "sft": to_dict(cfg.sft), "seed": cfg.seed,
               "chat_template": cfg.rollout.chat_template, "device": device.type}
        if getattr(task, "fingerprint", None):
            key["data"] = task.fingerprint

        def build():  # fine-tuned where the run trains (a pretrained model is too big for a CPU detour)
            return load_hf(folder, chat_template=cfg.rollout.chat_template, dtype=DTYPES[cfg.model.dtype],
                           attn_implementation=cfg.model.attn)[0].to(device)
    else:
        codec = codec if isinstance(codec, Codec) else char_codec()
        key = {"task": task_spec(task), "arch": cfg.model.arch, "attn": cfg.model.attn, "vocab": VOCAB_SIZE,
               "sft": to_dict(cfg.sft), "seed": cfg.seed, "code": warm_start_code(task)}
        if getattr(task, "fingerprint", None):
            key["data"] = task.fingerprint
        max_pos = max(64, task.max_prompt_len() + 1 + task.max_response_len() + 8)

        def build():
            return build_policy(cfg.model.arch, VOCAB_SIZE, seed=cfg.seed, max_positions=max_pos,
                                attn_implementation=cfg.model.attn)

    def train_fn(model):
        sft_seed = cfg.seed + 7919  # SFT prompts come from their own stream, not the RL stream
        log_every = max(1, cfg.sft.steps // 10) if _warm_progress() and cfg.sft.steps else 0
        if log_every:
            plan = (f"until greedy accuracy {cfg.sft.until_acc} on every difficulty (checked every "
                    f"{cfg.sft.check_every} steps, at most {cfg.sft.steps}), then {cfg.sft.noise_steps} noisy steps"
                    if cfg.sft.until_acc else f"{cfg.sft.steps} steps")
            print(f"warm start of seed {cfg.seed}: not in the cache, training it once: {plan}; a line every "
                  f"{log_every} steps", file=sys.stderr, flush=True)

        def texts(probs):
            return probs if codec.bos_id is None else [p.prompt for p in probs]

        def batch(step, rng, noisy):
            probs = task.prompts(sft_seed, step * cfg.sft.batch_size, cfg.sft.batch_size)
            return texts(probs), demonstrations(cfg, task, probs, rng, noisy)

        def batch_fn(step, rng):  # the fixed schedule turns noisy at noise_start; with until_acc, never
            return batch(step, rng, until is None and step >= cfg.sft.noise_start * cfg.sft.steps)

        until = None
        if cfg.sft.until_acc and cfg.sft.steps:
            def noisy_batch_fn(step, rng):
                return batch(step, rng, True)

            until = Until(_competence_check(cfg, task, codec), cfg.sft.check_every, cfg.sft.steps,
                          cfg.sft.noise_steps, noisy_batch_fn)
        losses = sft_train(model, codec, batch_fn, steps=cfg.sft.steps, lr=cfg.sft.lr, seed=cfg.seed,
                           grad_clip=cfg.sft.grad_clip, until=until,
                           log_every=log_every, log_label=f"warm start of seed {cfg.seed}")
        info = {"final_loss": losses[-1] if losses else None, "n_params": n_params(model), "steps": len(losses)}
        if until is not None:
            info.update(clean_steps=until.clean_steps, criterion_met=until.done, checks=until.history)
            if not until.done:
                print(f"warning: the warm start of seed {cfg.seed} did not reach greedy accuracy "
                      f"{cfg.sft.until_acc} on every difficulty in {cfg.sft.steps} steps ({until.history[-1]}); "
                      "continuing with it (sft.json records this)", file=sys.stderr, flush=True)
        return info

    return cached_warm_start(key, build, train_fn, cache_dir=cache_dir)


def warm_start_modules(task) -> tuple:
    """The modules whose code a built-in warm start runs: the SFT loop, model construction, the forward it trains
    through, generation for the competence check, tokenizer and codec, decoding, the task's own module and this
    file. tests/test_warm_start_key.py checks that these modules import objbench code from nowhere else (but
    settings, and the vLLM engine, which a warm start never builds)."""
    import inspect

    from objbench.algos import entropy, row_counts
    from objbench.envs import base, tokenizer
    from objbench.rollout import bundle, decode, engine, fastlm, generation, models, scoring, sft

    masks = inspect.getmodule(row_counts)  # algos/_checks.py: the mask helpers that entropy uses
    hashed = (sft, models, scoring, fastlm, engine, generation, bundle, decode, entropy, masks, base, tokenizer,
              inspect.getmodule(type(task)), sys.modules[__name__])
    return hashed + _task_dependencies(task, hashed)


def _task_dependencies(task, hashed: tuple) -> tuple:
    """envs modules whose code the task's module uses (the scratchpad task draws its problems through the
    arithmetic task's module), in name order, leaving out those already hashed."""
    import inspect

    own = inspect.getmodule(type(task))
    deps = {inspect.getmodule(v) for v in vars(own).values()
            if str(getattr(v, "__module__", "")).startswith("objbench.envs.")}
    return tuple(sorted((m for m in deps if m is not None and m not in hashed), key=lambda m: m.__name__))


def warm_start_code(task) -> str:
    """Fingerprint of the code a built-in warm start runs (objbench.rollout.code_fingerprint): any edit to it
    changes the key, moving code unchanged between these modules does not. Computed once per process and task
    module (parsing the modules takes ~0.15 s; their source does not change while the process runs)."""
    return _fingerprint(warm_start_modules(task))


@functools.lru_cache(maxsize=None)
def _fingerprint(modules: tuple) -> str:
    return code_fingerprint(*modules)


def _warm_progress() -> bool:
    """Progress lines of a warm start being trained (stderr, a line per tenth of sft.steps), terminal or log file
    alike: a cold warm start can take minutes before the step bar appears. OBJBENCH_QUIET=1 silences them."""
    return os.environ.get("OBJBENCH_QUIET", "0") == "0"

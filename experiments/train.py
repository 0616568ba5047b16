"""The training loop: one function of (config, seed), readable top to bottom, never branching on a preset.

One RL step:
  prompts (envs, by index) -> G completions each (rollout engine, + behaviour log-probs) -> rewards (envs)
  -> shaping / dynamic sampling (algos.filters) -> reference log-probs and critic values (no grad)
  -> advantages (algos) -> n_epochs x n_minibatches optimizer steps on the policy loss (+ value loss)
  -> one JSON line of metrics, flushed.

Files (run_dir = <out_dir>/<run name>/): config.yaml, meta.json, metrics.jsonl, eval.jsonl, samples.jsonl,
checkpoints/last/ (safetensors weights, optimizer, RNG and loop state), done (written last).
A run that finds its folder with a checkpoint and no ``done`` resumes from the checkpoint; rows logged after
the checkpoint are dropped first, so no step appears twice and none is lost.
"""

from __future__ import annotations

import array
import copy
import dataclasses
import fcntl
import functools
import hashlib
import json
import math
import operator
import os
import platform
import resource
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch
import yaml

from objbench import algos
from objbench.algos import filters as F
from objbench.algos import groups as GR
from objbench.algos import kl as KL
from objbench.algos import schedules as SCH
from objbench.algos._checks import row_counts
from objbench.algos.advantages import zero_variance_groups
from objbench.algos.registry import ADVANTAGE_ESTIMATORS
from objbench.envs import task_spec
from objbench.envs.tokenizer import VOCAB_SIZE
from objbench.experiments.config import ConfigError, TrainConfig, build_task, check_model, max_new_tokens, to_dict, to_yaml
from objbench.experiments.errors import RunFolderError
from objbench.experiments.metrics import reduce, rename
from objbench.rollout.bundle import DTYPES, Codec, char_codec, fingerprint_folder, load_hf, resolve_device
from objbench.rollout.engine import Generation, HFEngine, SamplingParams, make_engine, repeat_prompts
from objbench.rollout.models import ValueModel, build_policy, frozen_copy, n_params
from objbench.rollout.scoring import Scored, score, score_values
from objbench.rollout.sft import Until, _encode_batch, cached_warm_start, pad_left, pad_right, sft_train

# transformers' own per-file progress bars (save/load of a 0.5 MB checkpoint) would drown the sweep's bar
from transformers.utils import logging as _hf_logging  # noqa: E402

_hf_logging.disable_progress_bar()

INVALID_MARK = "\ufffd"  # prefixed to a response that held a special token; no verifier accepts it
NONDETERMINISTIC_KEYS = ("time", "time/", "mem/")  # excluded when comparing two runs for determinism


# ---------------------------------------------------------------------------------------------------------
# small utilities


def _seed_for(seed: int, step: int, stream: int) -> int:
    # independent generator per (seed, step, purpose): a resumed run samples exactly what it would have
    return (seed * 1_000_003 + step * 101 + stream) % (2**63 - 1)


def _gen(seed: int, step: int, stream: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(_seed_for(seed, step, stream))


def _git_commit() -> str:
    try:
        here = Path(__file__).resolve().parent.parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_signature() -> str:
    """The CPU model, the kernel set torch dispatches to and a digest of the CPU flags ("Intel(R) Xeon(R)
    Processor | AVX512 | flags 1a2b3c4d"). Float32 CPU training is bit-identical only on the same kernel path: the
    same config and seed on another CPU kind give other numbers (measured: the quickstart's 6000-step warm start,
    see tests/test_reproduce.py)."""
    info: dict[str, str] = {}  # the first "model name" and "flags" lines of /proc/cpuinfo
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
                if "model name" in info and "flags" in info:
                    break
    except OSError:
        pass
    model = info.get("model name") or platform.processor() or platform.machine()
    # virtual machines often hide the model; the flags tell kinds apart
    flags = hashlib.sha256(" ".join(sorted(info["flags"].split())).encode()).hexdigest()[:8] if "flags" in info else ""
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - older torch
        cap = "unknown"
    return f"{model} | {cap}" + (f" | flags {flags}" if flags else "")


def _versions() -> dict:
    import numpy
    import transformers
    v = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
         "numpy": numpy.__version__, "platform": platform.platform(), "cpu": cpu_signature()}
    try:
        import importlib.metadata as md
        v["objbench"] = md.version("objbench")
    except Exception:  # not installed (running from a checkout)
        v["objbench"] = "checkout"
    return v


def _vmhwm_kb() -> int | None:
    """VmHWM of /proc/self/status in KiB (None where there is no such file: not Linux)."""
    try:
        with open("/proc/self/status", "rb") as f:  # plain bytes: ~4x cheaper than Path.read_text().splitlines()
            text = f.read()
        i = text.find(b"VmHWM:")
        if i >= 0:
            return int(text[i + 6:text.index(b"\n", i)].split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return None


# ru_maxrss (KiB) inherited from the parent at exec, where it exceeded this process's own peak; -1 once
# ru_maxrss is known to be this process's own peak; None before the first call
_INHERITED_MAXRSS: int | None = None


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB, its own peak even in a worker: on Linux ru_maxrss = max(the
    peak inherited from the parent across fork + exec, own peak), so VmHWM (reset at exec) is read until
    ru_maxrss has grown past what was inherited, and ru_maxrss from then on: the same high-water mark, read from
    the kernel's per-CPU RSS counters without summing them (so within their slack: measured 0.27 MB of 465 MB),
    at ~10 us instead of the ~100 us that reading /proc/self/status takes right after a training step's
    multi-threaded kernels. Elsewhere ru_maxrss."""
    global _INHERITED_MAXRSS
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if _INHERITED_MAXRSS is not None and ru > _INHERITED_MAXRSS:
        return ru / 1024
    hwm = _vmhwm_kb()
    if hwm is None:
        return ru / 1024
    if _INHERITED_MAXRSS is None:
        # ru == hwm: ru is the own peak from now on (it only grows); ru > hwm: ru is the parent's peak
        _INHERITED_MAXRSS = -1 if ru <= hwm else ru
    return hwm / 1024


def _itself(x):
    return x


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(sum(xs) / len(xs)) if xs else float("nan")


def _to_float(v):
    return float(v.detach()) if torch.is_tensor(v) else float(v)


def _floats(d: dict) -> dict:
    """{key: float} of a dict of numbers and 0-dim tensors; the tensors (of one dtype) are read with one device
    sync, not one each (the same values as float(t))."""
    tensors = [v for v in d.values() if torch.is_tensor(v)]
    if len(tensors) < 2 or len({(t.dtype, t.device) for t in tensors}) > 1 or any(t.dim() for t in tensors):
        return {k: _to_float(v) for k, v in d.items()}
    with torch.no_grad():
        values = iter(torch.stack(tensors).tolist())
    return {k: next(values) if torch.is_tensor(v) else float(v) for k, v in d.items()}


class JsonlWriter:
    """Append-only JSON-lines file, flushed per row; ``truncate_after(step)`` drops rows logged after a checkpoint."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = open(path, "a")

    def write(self, row: dict):
        self.fh.write(json.dumps(row, allow_nan=True) + "\n")
        self.fh.flush()

    def close(self):
        self.fh.close()

    @staticmethod
    def truncate_after(path: Path, step: int):
        if not path.exists():
            return
        keep = []
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut off by a crash
            if row.get("step", 0) <= step:
                keep.append(line)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(l + "\n" for l in keep))
        os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------------
# setup


class PromptStream:
    """The training prompts of one data seed, drawn ahead: ``take(start, n)`` returns ``task.prompts(seed, start,
    n)``, the same problems (each is a pure function of (seed, index)), taken from a chunk of ``chunk`` problems
    (those asked for, then the rest drawn ahead where the task's stream has them: see ``_ahead``); with a codec, ``encoded(start, n)`` returns ``codec.encode_prompts`` of them, the same tensors,
    cut from the chunk's encoding (left padding: the last max-length columns of those rows). Drawing a problem
    costs ~11 us in a tight loop but about twice that, and ~60 us for the first of a step, between a training
    step's tensor kernels; a step's 8 prompts cost ~0.17 ms one by one in the loop, ~0.09 ms from a chunk."""

    def __init__(self, task, seed: int, codec=None, chunk: int = 256):
        self.task, self.seed, self.codec, self.chunk = task, seed, codec, chunk
        self.start, self.items, self._enc = 0, [], None

    def _fill(self, start: int, n: int) -> int:
        if not (self.start <= start and start + n <= self.start + len(self.items)):
            items = self.task.prompts(self.seed, start, n)  # what was asked for: its errors are the caller's
            self.start, self.items, self._enc = start, items + self._ahead(start + n, self.chunk - n), None
        return start - self.start

    def _ahead(self, start: int, n: int) -> list:
        """Problems drawn ahead of need, or none where the stream cannot give them: a task whose stream ends
        (a finite list of problems) raises only when a step asks for a problem past its end, as it would
        without the stream."""
        if n <= 0:
            return []
        try:
            return self.task.prompts(self.seed, start, n)
        except Exception:
            return []

    def take(self, start: int, n: int) -> list:
        i = self._fill(start, n)
        return self.items[i:i + n]

    def encoded(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = self._fill(start, n)
        if self._enc is None:
            ids, mask = self.codec.encode_prompts(self.items)
            self._enc = ids, mask, mask.sum(-1).tolist()
        ids, mask, lengths = self._enc
        width = max(lengths[i:i + n], default=0)
        return ids[i:i + n, ids.shape[1] - width:], mask[i:i + n, ids.shape[1] - width:]


def _prompt_stream(s: "Setup") -> PromptStream:
    p = s.prompts
    if p is None or p.task is not s.task or p.codec is not s.codec or p.seed != s.cfg.effective_data_seed:
        s.prompts = PromptStream(s.task, s.cfg.effective_data_seed, s.codec)  # a Setup built by hand
    return s.prompts


@dataclass
class Setup:
    cfg: TrainConfig
    task: object
    codec: Codec
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    critic: ValueModel | None
    engine: HFEngine
    sampling: SamplingParams
    eval_sampling: SamplingParams
    sft_info: dict = field(default_factory=dict)
    bad_ids: torch.Tensor | None = None  # token ids that make a response invalid when they occur inside it
    timers: dict = field(default_factory=lambda: defaultdict(float))  # seconds per phase, cumulative
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # rollout.staleness > 0: a frozen copy of the policy that samples the training batches, and the policy's
    # weights after each of the last staleness + 1 training steps (oldest first; the sampler gets the oldest)
    sampler: torch.nn.Module | None = None
    history: deque | None = None
    prompts: "PromptStream | None" = None  # the training prompt stream (make_setup sets it)

    _params: tuple = field(default=(None, ()), repr=False)  # (policy, its parameters): see policy_params

    @property
    def tokenizer(self):
        return self.codec.tokenizer

    @property
    def policy_params(self) -> tuple:
        """The policy's parameters, listed once per policy object (clip_grad_norm_ would walk the module tree
        every optimizer step)."""
        if self._params[0] is not self.policy:
            self._params = (self.policy, tuple(self.policy.parameters()))
        return self._params[1]


class timed:
    """``with timed(s, key):`` adds the block's wall time to ``s.timers[key]`` (a class, not a
    @contextmanager generator: ~20 blocks a step, each ~1 us cheaper)."""

    __slots__ = ("timers", "key", "t0")

    def __init__(self, s: "Setup", key: str):
        self.timers, self.key = s.timers, key

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.timers[self.key] += time.perf_counter() - self.t0
        return False


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
               "sft": to_dict(cfg.sft), "seed": cfg.seed, "code": _warm_start_code(task)}
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


def _warm_start_code(task) -> str:
    """Fingerprint of the code a built-in warm start runs: the SFT loop, model construction, the forward it
    trains through, the tokenizer, the task's module and this file's warm-start functions."""
    import inspect

    from objbench.envs import base, tokenizer
    from objbench.rollout import engine, fastlm, models, scoring, sft
    from objbench.rollout.sft import code_fingerprint

    return code_fingerprint(sft, models, scoring, fastlm, engine, base,
                            tokenizer, inspect.getmodule(type(task)), warm_start, corrupt_digit, demonstrations,
                            _competence_check, decode_responses)


def _warm_progress() -> bool:
    """Progress lines of a warm start being trained (stderr, a line per tenth of sft.steps), terminal or log file
    alike: a cold warm start can take minutes before the step bar appears. OBJBENCH_QUIET=1 silences them."""
    return os.environ.get("OBJBENCH_QUIET", "0") == "0"


def load_start(cfg: TrainConfig, task, cache_dir=None):
    """(policy, codec, sft info, checkpoint folder) of a run's start policy."""
    if cfg.model.path:
        folder = check_model(cfg)["folder"]
        policy, codec = load_hf(folder, chat_template=cfg.rollout.chat_template,
                                dtype=DTYPES[cfg.model.dtype], attn_implementation=cfg.model.attn)
        if cfg.sft.steps:
            if not getattr(task, "has_sft_targets", True):
                raise ConfigError(f"sft.steps={cfg.sft.steps}: task {task.name!r} has no reference answers to "
                                  "fine-tune on; set sft.steps=0")
            policy, ckpt, info = warm_start(cfg, task, codec, cache_dir)
            return policy, codec, {**info, "checkpoint": str(ckpt), "model_path": folder}, ckpt
        return policy, codec, {"pretrained": folder}, Path(folder)
    codec = char_codec()
    policy, ckpt, info = warm_start(cfg, task, codec, cache_dir)
    return policy, codec, {**info, "checkpoint": str(ckpt)}, ckpt


def build_setup(cfg: TrainConfig, cache_dir=None) -> Setup:
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    task = build_task(cfg)
    policy, codec, sft_info, ckpt = load_start(cfg, task, cache_dir)
    return make_setup(cfg, task, codec, policy, sft_info, ckpt)


def make_setup(cfg: TrainConfig, task, codec, policy, sft_info: dict | None = None, ckpt=None) -> Setup:
    """Everything the loop needs around a start policy: reference, critic, engine, sampling settings.

    build_setup() calls it with the cached warm start of the configured task; benchmarks call it with a
    workload of their own (benchmarks/workload.py), so they time the very same loop.
    """
    obj = cfg.objective
    if not isinstance(codec, Codec):  # a bare character tokenizer (tests, benchmarks)
        codec = dataclasses.replace(char_codec(), tokenizer=codec)
    device = resolve_device(cfg.model.device)
    policy.to(device=device, dtype=DTYPES[cfg.model.dtype])
    if cfg.model.gradient_checkpointing:
        policy.config.use_cache = False
        policy.gradient_checkpointing_enable()
    if cfg.model.forward == "hf" or cfg.model.gradient_checkpointing or device.type != "cpu":
        # the lean path is checked against transformers on CPU only; checkpointing needs the transformers forward
        policy._objbench_forward = "hf"  # read by rollout/fastlm.why_unsupported (copies below inherit it)
    needs_ref = obj.kl.placement != "none" or cfg.log.ref_kl
    reference = frozen_copy(policy) if needs_ref else None
    needs_values = ADVANTAGE_ESTIMATORS.get(obj.adv.estimator).needs_values  # gae, hybrid: a critic
    critic = ValueModel(policy).to(device=device, dtype=DTYPES[cfg.model.dtype]) if needs_values else None
    max_new = max_new_tokens(cfg, task)
    engine = make_engine(cfg.rollout.engine, policy, **cfg.rollout.engine_settings())
    sampling = SamplingParams(max_new, cfg.rollout.temperature, cfg.rollout.top_p, codec.eos_id, codec.pad_id)
    eval_T = cfg.rollout.temperature if cfg.train.eval_temperature is None else cfg.train.eval_temperature
    eval_sampling = SamplingParams(max_new, eval_T, cfg.rollout.top_p, codec.eos_id, codec.pad_id)
    # special tokens other than <eos> inside a response make it invalid (decoding would silently drop them)
    bad_ids = torch.tensor(sorted(set(codec.tokenizer.all_special_ids) - {codec.eos_id}), dtype=torch.long,
                           device=device)
    sampler = history = None
    if cfg.rollout.staleness:
        sampler, history = frozen_copy(policy), deque([_weights_copy(policy)])
    return Setup(cfg, task, codec, policy, reference, critic, engine, sampling, eval_sampling,
                 dict(sft_info or {}), bad_ids=bad_ids, device=device, sampler=sampler, history=history,
                 prompts=PromptStream(task, cfg.effective_data_seed, codec))


def _weights_copy(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------------------
# rollouts


@dataclass
class Batch:
    """A training batch in the group layout: rows [g*G, (g+1)*G) share prompt g (with adaptive group sizes, the
    groups are contiguous with the sizes in ``group_sizes``)."""

    prompt_ids: torch.Tensor      # (B, P) long, left padded
    prompt_mask: torch.Tensor     # (B, P) bool
    response_ids: torch.Tensor    # (B, T) long
    response_mask: torch.Tensor   # (B, T) bool
    old_logp: torch.Tensor        # (B, T) behaviour log-probs
    truncated: torch.Tensor       # (B,) bool
    rewards: torch.Tensor         # (B,) float32 (after shaping)
    correct: torch.Tensor         # (B,) bool
    difficulty: torch.Tensor      # (B,) long
    texts: list
    problems: list
    reasons: list = field(default_factory=list)  # the verifier's reason per row ("" where a task gives none)
    malformed: torch.Tensor | None = None  # (B,) bool, the verifier's verdict: the text does not parse as an answer
    group_sizes: list | None = None  # one size per contiguous group (adaptive group sizes); None = equal groups of G
    forced: torch.Tensor | None = None  # (B, T) bool: tokens the environment wrote (a verdict), not the policy;
    #                                     attended to like the rest, never in the loss. None = none

    @property
    def size(self):
        return self.response_ids.shape[0]

    def select(self, rows: torch.Tensor) -> "Batch":
        """The given rows (``group_sizes`` is dropped: rows need not be whole groups; see _select_groups)."""
        idx = rows.tolist()
        return Batch(self.prompt_ids[rows], self.prompt_mask[rows], self.response_ids[rows],
                     self.response_mask[rows], self.old_logp[rows], self.truncated[rows], self.rewards[rows],
                     self.correct[rows], self.difficulty[rows], [self.texts[i] for i in idx],
                     [self.problems[i] for i in idx], [self.reasons[i] for i in idx],
                     None if self.malformed is None else self.malformed[rows], None,
                     None if self.forced is None else self.forced[rows])


def _pad_to(x: torch.Tensor, width: int, value) -> torch.Tensor:
    if x.shape[1] == width:
        return x
    pad = torch.full((x.shape[0], width - x.shape[1]), value, dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], 1)


def _left_pad_to(x: torch.Tensor, width: int, value) -> torch.Tensor:
    if x.shape[1] == width:
        return x
    pad = torch.full((x.shape[0], width - x.shape[1]), value, dtype=x.dtype, device=x.device)
    return torch.cat([pad, x], 1)


def concat_batches(parts: list[Batch], pad_id: int = 0) -> Batch:
    if len(parts) == 1:
        return parts[0]
    P = max(b.prompt_ids.shape[1] for b in parts)
    T = max(b.response_ids.shape[1] for b in parts)
    return Batch(
        torch.cat([_left_pad_to(b.prompt_ids, P, pad_id) for b in parts]),
        torch.cat([_left_pad_to(b.prompt_mask, P, False) for b in parts]),
        torch.cat([_pad_to(b.response_ids, T, pad_id) for b in parts]),
        torch.cat([_pad_to(b.response_mask, T, False) for b in parts]),
        torch.cat([_pad_to(b.old_logp, T, 0.0) for b in parts]),
        torch.cat([b.truncated for b in parts]), torch.cat([b.rewards for b in parts]),
        torch.cat([b.correct for b in parts]), torch.cat([b.difficulty for b in parts]),
        sum((b.texts for b in parts), []), sum((b.problems for b in parts), []),
        sum((b.reasons for b in parts), []),
        None if any(b.malformed is None for b in parts) else torch.cat([b.malformed for b in parts]),
        None if any(b.group_sizes is None for b in parts) else sum((b.group_sizes for b in parts), []),
        None if all(b.forced is None for b in parts) else torch.cat(
            [_pad_to(b.forced if b.forced is not None else torch.zeros_like(b.response_mask), T, False)
             for b in parts]))


def _concat_table(tokenizer) -> list[str] | None:
    """For a word-level tokenizer whose decoder just concatenates tokens (the task character tokenizers):
    the text of every id ("" for special tokens), so decoding is a join. None for any other tokenizer."""
    cached = getattr(tokenizer, "_objbench_concat_table", False)
    if cached is not False:
        return cached
    table = None
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is not None and type(rust.model).__name__ == "WordLevel" and type(rust.decoder).__name__ == "Fuse":
        special = set(tokenizer.all_special_ids)
        vocab = rust.get_vocab(with_added_tokens=True)
        table = [""] * (max(vocab.values()) + 1)
        for tok, i in vocab.items():
            table[i] = "" if i in special else tok
    tokenizer._objbench_concat_table = table
    return table


def decode_responses(tokenizer, ids: torch.Tensor) -> list[str]:
    """Texts of the responses with special tokens skipped, as ``batch_decode(ids, skip_special_tokens=True)``.
    A concatenating word-level tokenizer decodes by table look-up; other fast tokenizers in Rust directly
    (transformers' batch_decode first converts every id through Python: ~3 ms for 256 short rows)."""
    table = _concat_table(tokenizer)
    if table is not None:
        return ["".join([table[i] for i in row]) for row in ids.tolist()]
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is not None and hasattr(rust, "decode_batch"):
        return rust.decode_batch(ids.tolist(), skip_special_tokens=True)
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def _verify(task, probs: list, texts: list[str], truncated: list[bool]) -> list:
    """task.reward of each response; with a deterministic reward (``task.deterministic_reward``) each distinct
    (problem, text, truncated) is verified once and its copies share the (frozen) result."""
    if not getattr(task, "deterministic_reward", False):
        return [task.reward(p, t, bool(tr)) for p, t, tr in zip(probs, texts, truncated)]
    seen: dict = {}
    out = []
    for p, t, tr in zip(probs, texts, truncated):
        key = (id(p), t, bool(tr))  # a group's rows hold the same problem object; probs keeps it alive
        r = seen.get(key)
        if r is None:
            r = seen[key] = task.reward(p, t, bool(tr))
        out.append(r)
    return out


def rollout(s: Setup, problems: list, group_size: int | list, params: SamplingParams, generator,
            encoded: tuple | None = None) -> Batch:
    """G completions for each problem (or group_size[i] for problem i), decoded and scored by the task's verifier.
    ``encoded``: ``s.codec.encode_prompts(problems)`` when the caller has it (PromptStream.encoded)."""
    sizes = list(group_size) if isinstance(group_size, (list, tuple)) else None
    p_ids, p_mask = encoded if encoded is not None else s.codec.encode_prompts(problems)
    reps = group_size if sizes is None else torch.tensor(sizes, device=s.device)
    p_ids, p_mask = repeat_prompts(p_ids.to(s.device), p_mask.to(s.device), reps)
    probs = [p for p, g in zip(problems, sizes or [group_size] * len(problems)) for _ in range(g)]
    forced = None
    with timed(s, "sample"):
        if getattr(s.task, "interjection_marker", None):
            gen, forced = _generate_with_interjection(s, p_ids, p_mask, probs, params, generator)
        else:
            gen = _on_device(s, s.engine.generate(p_ids, p_mask, params, generator))
    with timed(s, "reward"):
        texts = decode_responses(s.tokenizer, gen.response_ids.masked_fill(~gen.response_mask, s.codec.pad_id).cpu())
        if s.bad_ids is not None and len(s.bad_ids):
            # "1<pad>2" would decode to "12": mark such responses so that every verifier rejects them
            bad = (torch.isin(gen.response_ids, s.bad_ids) & gen.response_mask).any(-1)
            if bool(bad.any()):
                texts = [INVALID_MARK + t if b else t for t, b in zip(texts, bad.tolist())]
        results = _verify(s.task, probs, texts, gen.truncated.tolist())
    rows = [(r.reward, r.correct, p.difficulty, bool(getattr(r, "malformed", False))) for r, p in zip(results, probs)]
    if rows and s.device.type == "cpu":  # four small tensors straight from the lists
        reward, correct, difficulty, malformed = (
            _cpu_column(col, dt) for col, dt in zip(zip(*rows), (torch.float32, torch.bool, torch.long, torch.bool)))
    else:  # one table (float64 holds each number exactly): one host-to-device copy instead of four, then split
        cols = torch.tensor(rows, dtype=torch.float64).view(-1, 4).to(s.device).unbind(-1)
        reward, correct, difficulty, malformed = (cols[0].to(torch.float32), cols[1] != 0, cols[2].to(torch.long),
                                                  cols[3] != 0)
    return Batch(p_ids, p_mask, gen.response_ids, gen.response_mask, gen.logp, gen.truncated, reward, correct,
                 difficulty, texts, probs, [getattr(r, "reason", "") for r in results], malformed, sizes, forced)


def _cpu_column(values, dtype: torch.dtype) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype)`` (float32, bool or long), the same tensor built through a packed
    buffer: ~3x cheaper for a batch's column of Python numbers (torch.tensor inspects every element)."""
    try:
        if dtype == torch.bool:
            buf = bytearray(map(bool, values))
        else:
            buf = array.array("f" if dtype == torch.float32 else "q", values)
        if len(buf):
            return torch.frombuffer(buf, dtype=dtype)  # keeps buf alive
    except (TypeError, OverflowError):  # e.g. a float where an int belongs: torch.tensor decides
        pass
    return torch.tensor(values, dtype=dtype)


def _on_device(s: Setup, gen: Generation) -> Generation:
    if gen.response_ids.device == s.device:
        return gen
    # an engine of its own (vLLM) answers on the CPU
    return Generation(*(x.to(s.device) for x in (gen.response_ids, gen.response_mask, gen.logp, gen.truncated)))


def _generate_with_interjection(s: Setup, p_ids, p_mask, probs: list, params: SamplingParams, generator):
    """Sampling in two parts around an environment's interjection (a task with ``interjection_marker``, e.g.
    arithmetic's verdict): the policy writes until the marker (its stop token for this part, at most
    ``task.interjection_window()`` tokens), the task appends ``interjection(problem, first part)``, and the policy
    goes on from there until EOS. Rows that never write the marker, or write EOS before it, end there (truncated,
    so never correct). Returns (one Generation of the whole responses, (B, T) bool of the interjected tokens:
    attended to, in the response mask, with log-prob 0, and excluded from the loss by update())."""
    task, codec = s.task, s.codec
    (mark,) = _encode_batch(codec.tokenizer, [task.interjection_marker])
    if len(mark) != 1:
        raise ConfigError(f"the task's interjection marker {task.interjection_marker!r} must be one token of the "
                          f"tokenizer, got {len(mark)}")
    window = min(task.interjection_window(), params.max_new_tokens - 1)
    first = _on_device(s, s.engine.generate(p_ids, p_mask, dataclasses.replace(
        params, eos_id=mark[0], max_new_tokens=window), generator))
    ids1 = [r[m].tolist() for r, m in zip(first.response_ids, first.response_mask)]
    lp1 = [r[m].tolist() for r, m in zip(first.logp, first.response_mask)]
    # an EOS inside the first part does not stop it (the marker does): such a row ends there, truncated
    stopped = [ok and params.eos_id not in x for ok, x in zip((~first.truncated).tolist(), ids1)]
    rows = [i for i, ok in enumerate(stopped) if ok]
    inter: dict[int, list[int]] = {}
    ids2, lp2, trunc2 = {}, {}, {}
    if rows:
        texts = decode_responses(s.tokenizer, pad_right([ids1[i] for i in rows], codec.pad_id)[0])
        enc = _encode_batch(codec.tokenizer, [task.interjection(probs[i], t) for i, t in zip(rows, texts)])
        inter = dict(zip(rows, enc))
        prompts = [p[m].tolist() for p, m in zip(p_ids[rows], p_mask[rows])]
        q_ids, q_mask = pad_left([q + ids1[i] + inter[i] for q, i in zip(prompts, rows)], codec.pad_id)
        budget = params.max_new_tokens - max(len(ids1[i]) + len(inter[i]) for i in rows)
        second = _on_device(s, s.engine.generate(q_ids.to(s.device), q_mask.to(s.device), dataclasses.replace(
            params, max_new_tokens=max(1, budget)), generator))
        for j, i in enumerate(rows):
            m = second.response_mask[j]
            ids2[i], lp2[i] = second.response_ids[j][m].tolist(), second.logp[j][m].tolist()
            trunc2[i] = bool(second.truncated[j])
    seqs, lps, forced, trunc = [], [], [], []
    for i in range(len(ids1)):
        v = inter.get(i, [])
        seqs.append(ids1[i] + v + ids2.get(i, []))
        lps.append(lp1[i] + [0.0] * len(v) + lp2.get(i, []))
        forced.append([False] * len(ids1[i]) + [True] * len(v) + [False] * len(ids2.get(i, [])))
        trunc.append(trunc2.get(i, True))
    ids, mask = pad_right(seqs, codec.pad_id)
    T = ids.shape[1]
    logp = torch.tensor([x + [0.0] * (T - len(x)) for x in lps], dtype=torch.float32)
    forced_t = torch.tensor([x + [False] * (T - len(x)) for x in forced], dtype=torch.bool)
    dev = s.device
    return Generation(ids.to(dev), mask.to(dev), logp.to(dev), torch.tensor(trunc, device=dev)), forced_t.to(dev)


# ---------------------------------------------------------------------------------------------------------
# engine log-probs: engines whose kernels differ from the trainer's (vLLM) have their old log-probs recomputed


def recompute_old_logp(s: Setup, b: Batch) -> torch.Tensor | None:
    """When the engine asks for it (``engine.recompute_logp``), replace ``b.old_logp`` by the trainer's
    teacher-forced log-probs of the sampled tokens; return |engine - trainer| over the valid tokens (1-D), else
    None. The trainer's numbers make the first minibatch's ratio exactly 1, as with the hf engine."""
    if not getattr(s.engine, "recompute_logp", False):
        return None
    with torch.no_grad(), timed(s, "old_logp"):
        sc = score(s.policy, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                   temperature=s.cfg.rollout.temperature, with_entropy=False)
        diff = (sc.logp - b.old_logp)[b.response_mask].abs()
        b.old_logp = sc.logp.masked_fill(~b.response_mask, 0.0)
    return diff


def engine_logp_metrics(diffs: list) -> dict:
    diffs = [d for d in diffs if d is not None]
    if not diffs:
        return {}
    d = torch.cat(diffs)
    if not d.numel():
        return {}
    return {"rollout/engine_logp_abs_diff_mean": float(d.mean()), "rollout/engine_logp_abs_diff_max": float(d.max())}


# ---------------------------------------------------------------------------------------------------------
# evaluation


def evaluate(s: Setup, step: int) -> dict:
    """Greedy accuracy per difficulty and pass@k (unbiased estimator) on the held-out set."""
    from objbench.analysis.stats import pass_at_k

    problems = s.task.eval_set()
    if s.cfg.train.eval_size:
        problems = problems[: s.cfg.train.eval_size]
    greedy = SamplingParams(s.sampling.max_new_tokens, 0.0, 1.0, s.codec.eos_id, s.codec.pad_id)
    g = rollout(s, problems, 1, greedy, None)
    row = {"eval/acc": float(g.correct.float().mean()),
           "eval/length": float(g.response_mask.sum(-1).float().mean())}
    for d in s.task.difficulties:
        sel = g.difficulty == d
        if sel.any():
            row[f"eval/acc_d{d}"] = float(g.correct[sel].float().mean())
    k = s.cfg.train.eval_samples
    smp = rollout(s, problems, k, s.eval_sampling, _gen(s.cfg.seed, step, 2, s.device))
    c = smp.correct.view(len(problems), k).sum(-1).tolist()
    for kk in sorted({1, k}):
        row[f"eval/pass@{kk}"] = _mean([pass_at_k(k, ci, kk) for ci in c])
    for d in s.task.difficulties:  # sampled accuracy per difficulty: where RL's gains show
        cd = [ci for ci, p in zip(c, problems) if p.difficulty == d]
        if cd:
            row[f"eval/pass@1_d{d}"] = _mean([ci / k for ci in cd])
    return row


# ---------------------------------------------------------------------------------------------------------
# one RL step


def collect(s: Setup, step: int, state: dict) -> tuple[Batch, Batch, dict]:
    """Sample until the training batch is full. Returns (training batch, everything sampled, metrics)."""
    if GR.adaptive(s.cfg.objective):  # a group size per prompt (objective.groups)
        return collect_adaptive(s, step, state)
    cfg, obj = s.cfg, s.cfg.objective
    G, n_prompts = obj.group_size, cfg.prompts_per_step
    filt = obj.filters
    kept: list[Batch] = []
    everything: list[Batch] = []
    engine_diffs: list = []
    n_kept, rounds = 0, 0
    while True:
        stream = _prompt_stream(s)
        problems = stream.take(state["prompt_index"], n_prompts)
        encoded = stream.encoded(state["prompt_index"], n_prompts)
        state["prompt_index"] += n_prompts
        b = rollout(s, problems, G, s.sampling, _gen(cfg.seed, step, 10 + rounds, s.device), encoded)
        engine_diffs.append(recompute_old_logp(s, b))
        rounds += 1
        if filt.overlong_penalty:
            lengths = b.response_mask.sum(-1)
            b.rewards = b.rewards + F.overlong_penalty(lengths, s.sampling.max_new_tokens,
                                                       filt.overlong_cache, filt.overlong_factor).float()
        _correct_groups(s, b, G)
        everything.append(b)
        if rounds == 1 and G > 1:  # before any filtering: how many fresh groups carry no signal
            first_zero_var = zero_var_frac(b.rewards, G)
        if filt.dynamic_sampling:
            keep_groups = F.dynamic_sampling_keep(b.rewards, G)
            rows = keep_groups.repeat_interleave(G).nonzero().squeeze(-1)
            if len(rows):
                kept.append(b.select(rows))
                n_kept += len(rows) // G
        else:
            kept.append(b)
            n_kept += n_prompts
        if n_kept >= n_prompts or not filt.dynamic_sampling or rounds >= filt.max_rounds:
            break
    allb = concat_batches(everything, s.codec.pad_id)
    m = {"rollout/rounds": rounds, "rollout/groups_kept": n_kept, **engine_logp_metrics(engine_diffs)}
    if G > 1:
        m["rollout/zero_var_frac"] = first_zero_var
    m.update(_correction_metrics(s, allb, G))
    if not kept:
        return None, allb, m
    train_b = concat_batches(kept, s.codec.pad_id)
    if train_b.size > n_prompts * G:  # dynamic sampling overshot: keep the first n_prompts groups
        train_b = train_b.select(torch.arange(n_prompts * G))
    return train_b, allb, m


# ---------------------------------------------------------------------------------------------------------
# seed 003 directions (each a config field; every preset leaves them off and runs exactly the code above):
# adaptive group sizes, group reward correction, group selection, schedules and the entropy-driven temperature


def collect_adaptive(s: Setup, step: int, state: dict) -> tuple[Batch | None, Batch, dict]:
    """collect() with a group size per prompt (objective.groups; algos.groups).

    Every sampling round spends the same budget, rollout.completions_per_step completions, on as many prompts of
    the stream as the sizes allow (algos.groups.fill_budget: the last group is trimmed, never to fewer than the
    estimator's smallest group). Dynamic sampling keeps whole groups; the training batch is the kept groups in
    order while they fit in the budget (a kept group is never cut: that could make it all-equal), so with dynamic
    sampling it may hold fewer completions than the budget. The running pass rate per difficulty level
    (groups.ema, groups.prior) is updated from every completion sampled and kept in ``state`` (checkpointed).
    """
    cfg, obj = s.cfg, s.cfg.objective
    filt, budget = obj.filters, cfg.rollout.completions_per_step
    min_size = max(ADVANTAGE_ESTIMATORS.get(obj.adv.estimator).min_group_size, 2 if filt.dynamic_sampling else 1)
    rates = {int(d): r for d, r in state.get("pass_rates", {}).items()}
    kept: list[Batch] = []
    everything: list[Batch] = []
    n_kept, rounds = 0, 0
    while True:
        chunk = _prompt_stream(s).take(state["prompt_index"], budget)  # more than enough
        sizes = GR.fill_budget(GR.wanted_sizes(obj, [p.difficulty for p in chunk], rates), budget, min_size)
        state["prompt_index"] += len(sizes)
        b = rollout(s, chunk[:len(sizes)], sizes, s.sampling, _gen(cfg.seed, step, 10 + rounds, s.device))
        rounds += 1
        if filt.overlong_penalty:
            b.rewards = b.rewards + F.overlong_penalty(b.response_mask.sum(-1), s.sampling.max_new_tokens,
                                                       filt.overlong_cache, filt.overlong_factor).float()
        _correct_groups(s, b, sizes)
        everything.append(b)
        if rounds == 1:
            first_zero_var = float(zero_variance_groups(b.rewards, sizes).float().mean())
        if filt.dynamic_sampling:
            keep = F.dynamic_sampling_keep(b.rewards, sizes).tolist()
            if any(keep):
                kept.append(_select_groups(b, keep))
                n_kept += kept[-1].size
        else:
            kept.append(b)
            n_kept += b.size
        if n_kept >= budget or not filt.dynamic_sampling or rounds >= filt.max_rounds:
            break
    allb = concat_batches(everything, s.codec.pad_id)
    first = [sum(allb.group_sizes[:i]) for i in range(len(allb.group_sizes))]  # first row of each group
    m = {"rollout/rounds": rounds, "rollout/zero_var_frac": first_zero_var,
         "groups/prompts": len(allb.group_sizes), "groups/size_mean": allb.size / len(allb.group_sizes)}
    by_d = defaultdict(list)
    for g, i in zip(allb.group_sizes, first):
        by_d[allb.problems[i].difficulty].append(g)
    m.update({f"groups/size_d{d}": sum(gs) / len(gs) for d, gs in sorted(by_d.items())})
    m.update({f"groups/pass_rate_d{d}": r for d, r in sorted(rates.items())})  # the rates that chose the sizes
    rates = GR.update_pass_rates(rates, allb.difficulty.tolist(), allb.correct.tolist(), obj.groups.ema,
                                 obj.groups.prior)
    state["pass_rates"] = {str(d): r for d, r in rates.items()}
    m.update(_correction_metrics(s, allb, allb.group_sizes))
    if not kept:
        m["rollout/groups_kept"] = 0
        return None, allb, m
    train_b = concat_batches(kept, s.codec.pad_id)
    if train_b.size > budget:  # dynamic sampling overshot: the first groups that fit
        total, fit = 0, []
        for g in train_b.group_sizes:
            fit.append(total + g <= budget and (not fit or fit[-1]))
            total += g if fit[-1] else 0
        train_b = _select_groups(train_b, fit)
    m["rollout/groups_kept"] = len(train_b.group_sizes)
    return train_b, allb, m


def _select_groups(b: Batch, keep: list) -> Batch:
    """The whole groups of ``b`` (with group_sizes) whose entry in ``keep`` is True, their sizes kept."""
    rows, start = [], 0
    for g, k in zip(b.group_sizes, keep):
        if k:
            rows.extend(range(start, start + g))
        start += g
    out = b.select(torch.tensor(rows, dtype=torch.long, device=b.rewards.device))
    out.group_sizes = [g for g, k in zip(b.group_sizes, keep) if k]
    return out


def _correct_groups(s: Setup, b: Batch, groups) -> None:
    """objective.filters.group_correction (algos.filters.group_reward_correction): the rewards of a group whose share
    of malformed responses exceeds correction_share are scaled by correction_factor, right after sampling (before
    dynamic sampling looks at them). ``groups``: G or the group sizes."""
    f = s.cfg.objective.filters
    if f.group_correction:
        b.rewards, _ = F.group_reward_correction(b.rewards, b.malformed, groups, f.correction_share,
                                                 f.correction_factor)


def _correction_metrics(s: Setup, allb: Batch, groups) -> dict:
    f = s.cfg.objective.filters
    if not f.group_correction:
        return {}
    _, hit = F.group_reward_correction(allb.rewards, allb.malformed, groups, f.correction_share, f.correction_factor)
    return {"filters/corrected_frac": float(hit.float().mean()),
            "filters/malformed_frac": float(allb.malformed.float().mean())}


def _top_select(obj, b: Batch, mask: torch.Tensor, m: dict) -> torch.Tensor:
    """objective.filters.top_select (algos.filters.top_fraction_keep): only the top responses of each group by reward
    stay in the loss mask; every response keeps its reward in its group's baseline. Logs filters/top_kept_frac."""
    f = obj.filters
    if not f.top_select:
        return mask
    keep = F.top_fraction_keep(b.rewards, b.group_sizes or obj.group_size, f.top_fraction, f.top_min_keep)
    m["filters/top_kept_frac"] = float(keep.float().mean())
    return mask & keep[:, None]


def _group_weights_by_size(adv: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, sizes: list) -> dict:
    """The difficulty-bias measurement (adv/group_weight_k{k}) for unequal groups: a group's total advantage weight
    sum_i |A_i| against its pass count k, separately for each group size g."""
    w = ((adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)).abs().tolist()
    c = correct.tolist()
    acc, start = defaultdict(list), 0
    for g in sizes:
        acc[(g, sum(c[start:start + g]))].append(sum(w[start:start + g]))
        start += g
    out = {}
    for (g, k), ws in sorted(acc.items()):
        out[f"adv/group_weight_g{g}_k{k}"] = sum(ws) / len(ws)
        out[f"adv/groups_g{g}_k{k}"] = len(ws)
    return out


def at_step(s: Setup, state: dict, step: int) -> tuple[Setup, dict]:
    """The setup as it is at RL step ``step``: the objective with its schedules applied (algos.objective_at at the
    step's progress) and the training-sampling temperature (rollout.temperature_schedule, or the entropy-driven
    temperature kept in ``state``). Returns (setup, {"sched/<setting>": value}); ``s`` itself and {} when nothing
    is scheduled (every preset). The copy shares everything else with ``s`` (models, engine, timers)."""
    cfg, ro = s.cfg, s.cfg.rollout
    controlled = ro.temperature_control.target is not None
    if not cfg.objective.schedules and ro.temperature_schedule.kind == "constant" and not controlled:
        return s, {}
    p = SCH.progress(min(step, cfg.train.steps), cfg.train.steps)  # past the last step (bench): the end values
    sched = {f"sched/{k}": v for k, v in SCH.scheduled_values(cfg.objective, p).items()}
    if controlled:
        T = state.setdefault("temperature", ro.temperature)
    else:
        T = SCH.value_at(ro.temperature_schedule, ro.temperature, p)
    if controlled or ro.temperature_schedule.kind != "constant":
        sched["sched/rollout.temperature"] = T
    cfg_t = copy.copy(cfg)  # frozen: set its fields without re-running TrainConfig's (task-resolving) validation
    object.__setattr__(cfg_t, "objective", algos.objective_at(cfg.objective, p))
    object.__setattr__(cfg_t, "rollout", dataclasses.replace(ro, temperature=T, temperature_schedule=SCH.Schedule()))
    s_t = copy.copy(s)
    s_t.cfg, s_t.sampling = cfg_t, dataclasses.replace(s.sampling, temperature=T)
    return s_t, sched


def control_temperature(s: Setup, state: dict, m: dict) -> None:
    """rollout.temperature_control: the next step's temperature from this step's policy entropy (algos.schedules.
    controlled_temperature), kept in ``state`` so that a resumed run continues it."""
    ctl = s.cfg.rollout.temperature_control
    if ctl.target is not None:
        state["temperature"] = SCH.controlled_temperature(state.get("temperature", s.cfg.rollout.temperature),
                                                          m.get("policy/entropy", float("nan")), ctl)


_F32 = struct.Struct("f")


def f32_mean_of_ints(total: int, n: int) -> float:
    """The float32 mean of ``n`` integer values summing to ``total`` (|total| < 2**24, so the float32 sum is
    exact), as ``float(torch.tensor(values, dtype=torch.float32).mean())`` gives it: the correctly rounded
    float32 quotient. Lets counts and lengths be averaged in Python from one ``tolist()`` instead of a few
    small tensor operations per metric, with the logged numbers unchanged (tests/test_experiments_train.py
    checks the equality against torch). The quotient is taken in float64 and rounded once to float32, which is
    the correctly rounded float32 quotient (53 >= 2 * 24 + 2 bits: double rounding is innocuous for division);
    struct, not numpy: a numpy scalar operation right after a step's tensor kernels costs ~20 us."""
    return _F32.unpack(_F32.pack(total / n))[0]


def zero_var_frac(rewards: torch.Tensor, G: int) -> float:
    """``float(zero_variance_groups(rewards, G).float().mean())``, the share of groups of G whose rewards are all
    identical (exactly; a NaN is equal to nothing), from one ``tolist()`` instead of five tensor operations."""
    rw = rewards.tolist()
    if not rw or G < 2 or len(rw) % G:
        return float(zero_variance_groups(rewards, G).float().mean())  # its error, its NaN for no group, G = 1
    # a group of >= 2 is all-equal iff its set has one element: tolist() gives each NaN its own float object,
    # unequal to every other (so a group holding a NaN never is), and 0.0 == -0.0 as in torch
    n = sum(len(set(rw[i:i + G])) == 1 for i in range(0, len(rw), G))
    return f32_mean_of_ints(n, len(rw) // G)


def rollout_metrics(b: Batch, task) -> dict:
    lengths = b.response_mask.sum(-1).tolist()
    c = b.correct.tolist()
    n = len(c)
    n_c = sum(c)
    len_c = sum(x for x, ok in zip(lengths, c) if ok)
    total = sum(lengths)
    m = {"reward/mean": float(b.rewards.mean()), "reward/acc": f32_mean_of_ints(n_c, n),
         "length/mean": f32_mean_of_ints(total, n),
         "length/correct": f32_mean_of_ints(len_c, n_c) if n_c else float("nan"),
         "length/incorrect": f32_mean_of_ints(total - len_c, n - n_c) if n_c < n else float("nan"),
         "rollout/trunc_frac": f32_mean_of_ints(sum(b.truncated.tolist()), n),
         "rollout/completions": b.size, "rollout/tokens": total}
    if getattr(getattr(task, "config", None), "filler_max", 0):  # the length-bias study's filler, by correctness
        fill = [task.filler_length(t) for t in b.texts]
        for name, want in (("correct", True), ("incorrect", False)):
            xs = [f for f, ok in zip(fill, c) if ok == want and f is not None]
            m[f"length/filler_{name}"] = f32_mean_of_ints(sum(xs), len(xs)) if xs else float("nan")
        m["length/filler_gap"] = m["length/filler_incorrect"] - m["length/filler_correct"]  # NaN if either is
    diff = b.difficulty.tolist()
    n_d, n_dc = Counter(diff), Counter(d for d, ok in zip(diff, c) if ok)  # responses, correct ones per difficulty
    for d in task.difficulties:
        if n_d[d]:
            m[f"reward/acc_d{d}"] = f32_mean_of_ints(n_dc[d], n_d[d])
    return m


@functools.lru_cache(maxsize=16)
def _selector_parts(difficulties: tuple, B: int, device: torch.device) -> tuple:
    """weight_shares' constant parts: a (1, B) all-True row and the (D, 1) difficulty column (never written)."""
    return (torch.ones(1, B, dtype=torch.bool, device=device),
            torch.tensor(difficulties, device=device).unsqueeze(-1))


def weight_shares(adv: torch.Tensor, mask: torch.Tensor, difficulty: torch.Tensor, difficulties, agg: str,
                  max_len: int | None) -> dict:
    """adv/weight_share_d<d>: the share of the loss's advantage weight that difficulty d's responses carry.

    The policy-gradient loss is agg(-A * ratio) and its gradient at ratio = 1 is -sum_{i,t} w_it A_it grad logp_it,
    where w_it are the aggregation's per-token weights (1/(B'|y_i|) under seq_mean_token_mean, 1/sum|y| under
    token_mean, ...). The advantage weight of a set of responses is sum over their tokens of w_it |A_it|; since
    agg is linear in the per-token loss, that is agg(|A| * [row in set]) with the batch's own mask, so the shares
    of all difficulties sum to 1. It measures how much of the update each bucket is allowed to drive (its
    directions may still cancel); NaN on a step whose advantages are all zero. Difficulty-bias study (issue 12.4).
    """
    absadv = adv.abs()  # what lies under ~mask is dropped by the aggregation
    # row selectors (1 + D, B): every row (the total), then each difficulty's; one stacked aggregation, one sync
    every, column = _selector_parts(tuple(difficulties), difficulty.shape[0], difficulty.device)
    sel = torch.cat([every, difficulty == column])
    total, *parts = algos.aggregate_many(absadv * sel.unsqueeze(-1), mask, agg, max_len).tolist()
    return {f"adv/weight_share_d{d}": part / total if total > 0 else float("nan")
            for d, part in zip(difficulties, parts)}


def _group_weights(adv: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, G: int) -> dict:
    """Difficulty-bias measurement with equal groups of G: adv/group_weight_k<k>, the mean over the groups whose
    pass count is k of their total advantage weight sum_i |A_i| (A_i the response's mean token advantage), and
    adv/groups_k<k>, how many groups that is."""
    seq_adv = (adv * mask).sum(-1) / row_counts(mask, adv.dtype)[0]  # response lengths, clamped to >= 1
    c = correct.tolist()
    k_of = [sum(c[i:i + G]) for i in range(0, len(c), G)]
    weight = seq_adv.abs().view(-1, G).sum(-1)
    # the groups in order of k (by group index within a k): each k's weights are one contiguous slice, so one
    # gather and one sync for every k (each slice's mean is that of weight[groups with that k])
    order = sorted(range(len(k_of)), key=k_of.__getitem__)
    ks = sorted(set(k_of))
    counts = [k_of.count(k) for k in ks]
    index = _cpu_column(order, torch.long) if weight.device.type == "cpu" else torch.tensor(order, device=weight.device)
    by_k = weight[index].split(counts)
    means = torch.stack([w.mean() for w in by_k]).tolist()
    m = {}
    for k, n, mean in zip(ks, counts, means):
        m[f"adv/group_weight_k{k}"] = mean
        m[f"adv/groups_k{k}"] = n
    return m


def update(s: Setup, b: Batch, opt, critic_opt, step: int) -> dict:
    """Advantages, then n_epochs x n_minibatches optimizer steps. Returns metrics."""
    obj = s.cfg.objective
    mask = b.response_mask if b.forced is None else b.response_mask & ~b.forced  # the policy's own tokens
    gen_mask = mask
    if obj.filters.overlong_filter:
        mask = F.overlong_filter(mask, b.truncated)
    max_len = obj.loss.max_len or s.sampling.max_new_tokens
    m: dict = {}
    mask = _top_select(obj, b, mask, m)
    with torch.no_grad():
        ref = None
        if s.reference is not None:
            with timed(s, "reference"):
                with torch.inference_mode():  # cheaper than no_grad; the log-probs the loss keeps are cloned out
                    ref = score(s.reference, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                                temperature=s.cfg.rollout.temperature, with_entropy=False, with_logits=True)
                ref.logp = ref.logp.clone()
        values = None
        if s.critic is not None:
            with timed(s, "critic"):
                values = score_values(s.critic, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)
        with timed(s, "advantages"):
            kl_ref = ref.logp if (ref is not None and obj.kl.placement == "reward") else None
            adv, returns, am = algos.compute_advantages(obj, rewards=b.rewards, mask=mask, values=values,
                                                        old_logp=b.old_logp, ref_logp=kl_ref, max_len=max_len,
                                                        group_sizes=b.group_sizes)
    # read with the first minibatch's metrics (one device sync); the keys hold their place in m meanwhile
    pending = rename(am)
    m.update(dict.fromkeys(pending))
    if len(s.task.difficulties) > 1:
        m.update(weight_shares(adv, mask, b.difficulty, s.task.difficulties, obj.loss.agg, max_len))
    G = obj.group_size
    if b.group_sizes is not None:
        m.update(_group_weights_by_size(adv, mask, b.correct, b.group_sizes))
    elif G > 1 and b.size % G == 0:
        # difficulty-bias measurement: a group's total advantage weight sum_i |A_i| against its pass count k
        m.update(_group_weights(adv, mask, b.correct, G))

    B = b.size
    mb = B // obj.n_minibatches
    sums = defaultdict(list)
    kl_parts = []  # per first-pass minibatch: ((5,) masked sums of the KL metrics' per-token values, token count)
    gen = _gen(s.cfg.seed, step, 1)
    for epoch in range(obj.n_epochs):
        perm = torch.randperm(B, generator=gen) if obj.n_minibatches > 1 else None
        for j in range(obj.n_minibatches):
            # one minibatch; with one, the whole batch itself (the same values an index of arange(B) copies out)
            pick = operator.itemgetter(perm[j * mb:(j + 1) * mb]) if perm is not None else _itself  # x -> rows of x
            mk = pick(mask)
            first_pass = epoch == 0
            want_logits = first_pass and ref is not None
            with timed(s, "forward"):
                sc = score(s.policy, pick(b.prompt_ids), pick(b.prompt_mask), pick(b.response_ids),
                           pick(b.response_mask), temperature=s.cfg.rollout.temperature, with_logits=want_logits,
                           entropy_grad=obj.loss.entropy_coef != 0.0)
            with timed(s, "loss"):
                loss, lm = algos.compute_loss(
                    obj, logp=sc.logp, old_logp=pick(b.old_logp), advantages=pick(adv), mask=mk,
                    ref_logp=pick(ref.logp) if (ref is not None and obj.kl.placement == "loss") else None,
                    entropy=sc.entropy, max_len=max_len)
            # the metrics below read only the scores' values
            vals = Scored(sc.logp.detach(), None if sc.entropy is None else sc.entropy.detach(), None,
                          sc.log_probs.detach() if want_logits else None)
            with timed(s, "backward"):
                opt.zero_grad(set_to_none=True)
                loss.backward()
                del loss, sc  # the forward's autograd graph goes here (the model's nodes: ~0.1 ms at the default)
            with timed(s, "optimizer"):
                gn = torch.nn.utils.clip_grad_norm_(s.policy_params, s.cfg.optim.grad_clip or float("inf"))
                opt.step()
            loss_metrics = rename(lm)  # 0-dim tensors: turned into floats below, with one sync per minibatch
            if critic_opt is not None:
                with timed(s, "critic"):
                    v_new = score_values(s.critic, pick(b.prompt_ids), pick(b.prompt_mask), pick(b.response_ids),
                                         pick(b.response_mask))
                    vloss, vm = algos.compute_value_loss(obj, values=v_new, old_values=pick(values),
                                                         returns=pick(returns), mask=mk, max_len=max_len)
                    critic_opt.zero_grad(set_to_none=True)
                    (obj.value.coef * vloss).backward()
                    torch.nn.utils.clip_grad_norm_(s.critic.parameters(), s.cfg.optim.grad_clip or float("inf"))
                    critic_opt.step()
                    loss_metrics.update(rename(vm))
            with torch.no_grad(), timed(s, "metrics"):
                # spread of the importance ratio at the start of each optimizer step (the off-policy axis)
                lr = (vals.logp - pick(b.old_logp)) * mk
                valid = lr[mk]
                loss_metrics["policy/log_ratio_std"] = valid.std(correction=0) if valid.numel() else 0.0
                seq_lr = lr.sum(-1) / row_counts(mk, lr.dtype)[0]  # response lengths, clamped to >= 1
                loss_metrics["policy/seq_log_ratio_std"] = seq_lr.std() if len(seq_lr) > 1 else 0.0
                if first_pass:
                    rm = pick(gen_mask)
                    n_rm = rm.sum()
                    loss_metrics["policy/entropy"] = (vals.entropy * rm).sum() / n_rm  # NaN without a token
                    if want_logits:
                        lp, ref_lp = vals.logp, pick(ref.logp)
                        rev, fwd = KL.exact_kl_both_from_log_probs(vals.log_probs, pick(ref.log_probs))
                        per_token = [rev, fwd, *KL.value_estimates(lp, ref_lp)]  # exact, then k1, k2, k3
                        kl_parts.append(((torch.stack(per_token) * rm).sum((-2, -1)), n_rm))
                floats = _floats({"optim/grad_norm": gn, **loss_metrics, **pending})
            for k in pending:
                m[k] = floats.pop(k)
            pending = {}
            gn_f, clip = floats.pop("optim/grad_norm"), s.cfg.optim.grad_clip
            sums["optim/grad_norm"].append(gn_f)
            if clip:  # clip_grad_norm_ scales every gradient by min(1, clip / (norm + 1e-6))
                sums["optim/grad_norm_clipped"].append(gn_f * min(1.0, clip / (gn_f + 1e-6)))
                sums["optim/clip_active"].append(float(gn_f > clip))
            for k, v in floats.items():
                sums[k].append(v)
    for k, v in sums.items():
        m[k] = reduce(k, v)
    if kl_parts:  # every KL metric is weighted by the same response masks: sum over minibatches, then divide
        nums = [x.tolist() for x, _ in kl_parts]
        den = sum(float(n) for _, n in kl_parts)
        for i, k in enumerate(("kl/exact", "kl/exact_fwd", "kl/k1", "kl/k2", "kl/k3")):
            num = sum(part[i] for part in nums)
            m[k] = num / den if den else float("nan")
    m["optim/steps"] = len(sums["optim/grad_norm"])
    m["optim/tokens"] = int(b.response_mask.sum()) * obj.n_epochs
    return m


# ---------------------------------------------------------------------------------------------------------
# checkpoints


def save_checkpoint(run_dir: Path, s: Setup, opt, critic_opt, state: dict):
    tmp = run_dir / "checkpoints" / "tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    s.policy.save_pretrained(tmp / "policy")  # safetensors
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    if s.critic is not None:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in s.critic.state_dict().items()}, tmp / "critic.safetensors")
        torch.save(critic_opt.state_dict(), tmp / "critic_optimizer.pt")
    torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
    if s.history is not None:  # the stale sampler's weights to come
        torch.save(list(s.history), tmp / "sampler_history.pt")
    (tmp / "state.json").write_text(json.dumps(state))
    last = run_dir / "checkpoints" / "last"
    old = run_dir / "checkpoints" / "old"
    shutil.rmtree(old, ignore_errors=True)
    if last.exists():
        os.replace(last, old)
    os.replace(tmp, last)  # the checkpoint becomes visible only when complete
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(run_dir: Path, s: Setup, opt, critic_opt) -> dict | None:
    last = run_dir / "checkpoints" / "last"
    if not (last / "state.json").is_file():
        return None
    try:
        return _load_checkpoint(last, s, opt, critic_opt)
    except Exception as e:
        raise RunFolderError(
            f"{run_dir}: its checkpoint {last} cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:200]}). "
            f"Delete {last} to restart this run from step 0, or delete {run_dir}") from None


def _load_checkpoint(last: Path, s: Setup, opt, critic_opt) -> dict:
    from safetensors.torch import load_file
    pol = type(s.policy).from_pretrained(last / "policy", dtype=next(s.policy.parameters()).dtype)
    s.policy.load_state_dict(pol.state_dict())
    opt.load_state_dict(torch.load(last / "optimizer.pt", weights_only=True, map_location=s.device))
    if s.critic is not None:
        s.critic.load_state_dict(load_file(last / "critic.safetensors"))
        critic_opt.load_state_dict(torch.load(last / "critic_optimizer.pt", weights_only=True,
                                              map_location=s.device))
    torch.set_rng_state(torch.load(last / "rng.pt", weights_only=True)["torch"])
    if s.history is not None:
        s.history.clear()
        s.history.extend(torch.load(last / "sampler_history.pt", weights_only=True, map_location=s.device))
    return json.loads((last / "state.json").read_text())


# ---------------------------------------------------------------------------------------------------------
# the run


LOCATION_KEYS = ("out_dir",)  # where a run lives, not what it is: a moved folder still resumes


def run_status(cfg: TrainConfig) -> tuple[Path, str]:
    """(run_dir, status) with status in new|resume|done, writing nothing.

    A folder that holds a different resolved config is never overwritten: that is an error.
    """
    run_dir = Path(cfg.out_dir) / cfg.run_name
    if (run_dir / "config.yaml").is_file():
        try:
            old = yaml.safe_load((run_dir / "config.yaml").read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise RunFolderError(f"{run_dir}/config.yaml cannot be read ({type(e).__name__}); the folder is not a "
                                 f"usable run: move or delete {run_dir}, or choose another name=") from None
        if not isinstance(old, dict) or not set(to_dict(cfg)) <= set(old):
            raise RunFolderError(f"{run_dir}/config.yaml is incomplete (cut off while it was written?); the folder "
                                 f"is not a usable run: move or delete {run_dir}, or choose another name=")
        diff = sorted(k for k in _diff_keys(old, to_dict(cfg)) if k not in LOCATION_KEYS)
        if diff:
            if not (run_dir / "checkpoints" / "last" / "state.json").is_file() and not (run_dir / "done").exists():
                return run_dir, "replace"  # a run that failed before its first checkpoint: nothing to resume
            raise ConfigError(
                f"{run_dir} already holds a run with a different config (differs in: {', '.join(diff[:8])}); "
                "choose another name= or out_dir=, or delete that folder yourself")
        if (run_dir / "done").exists():
            return run_dir, "done"
        return run_dir, "resume"
    return run_dir, "new"


def prepare_run_dir(cfg: TrainConfig) -> tuple[Path, str]:
    """Create or reopen the run folder. Returns (run_dir, status) with status in new|resume|done."""
    run_dir, status = run_status(cfg)
    if status == "replace":  # moved aside, never deleted: it may hold the logs of why it failed
        aside = run_dir.with_name(f"{run_dir.name}.failed-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}")
        os.replace(run_dir, aside)
        print(f"{run_dir} held a different config and no checkpoint (a run that failed early); moved it to "
              f"{aside}", file=sys.stderr)
        status = "new"
    if status == "new":
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return run_dir, status


def _diff_keys(a, b, prefix=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in set(a) | set(b):
            yield from _diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
    elif a != b:
        yield prefix.rstrip(".")


def _make_optimizers(s: Setup):
    o = s.cfg.optim
    # fused: one kernel for all parameters instead of a Python loop over them (same update up to rounding)
    opt = torch.optim.AdamW(s.policy.parameters(), lr=o.lr, betas=(o.beta1, o.beta2),
                            weight_decay=o.weight_decay, eps=1e-8, fused=True)
    critic_opt = None
    if s.critic is not None:
        critic_opt = torch.optim.AdamW(s.critic.parameters(), lr=o.lr * s.cfg.objective.value.lr_scale,
                                       betas=(o.beta1, o.beta2), weight_decay=o.weight_decay, eps=1e-8)
    return opt, critic_opt


def train(cfg: TrainConfig, *, progress: bool = True, cache_dir=None, meta_extra: dict | None = None) -> Path:
    """Run (or resume, or skip if finished) one training run; returns its folder.

    One process at a time per run folder: a second command for the same run stops at once (file lock)."""
    lock_path = Path(cfg.out_dir) / f".{cfg.run_name}.lock"
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(lock_path, "w")
    except OSError as e:
        raise RunFolderError(f"cannot write to out_dir={cfg.out_dir!r} ({type(e).__name__}: {e.strerror or e}); "
                             "choose another out_dir=") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderError(f"another objbench process is running {Path(cfg.out_dir) / cfg.run_name} "
                                 f"(lock {lock_path}); wait for it or stop it") from None
        return _train(cfg, progress=progress, cache_dir=cache_dir, meta_extra=meta_extra)


def _train(cfg: TrainConfig, *, progress: bool, cache_dir, meta_extra: dict | None) -> Path:
    model_info = check_model(cfg)
    run_dir, status = run_status(cfg)
    if status == "done":
        if progress:
            print(f"{run_dir}: already finished (delete its 'done' file to rerun)")
        return run_dir
    # the start policy first: a bad model, data file or warm start fails before any run folder is written
    s = build_setup(cfg, cache_dir)
    run_dir, status = prepare_run_dir(cfg)
    s.policy.train()
    opt, critic_opt = _make_optimizers(s)
    state = load_checkpoint(run_dir, s, opt, critic_opt) if status == "resume" else None
    if state is None:
        state = {"step": 0, "prompt_index": 0, "tokens": 0, "elapsed": 0.0}
        for name in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
            (run_dir / name).unlink(missing_ok=True)
    else:
        for name in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
            JsonlWriter.truncate_after(run_dir / name, state["step"])
        s.engine.sync_weights(s.policy)  # the engine was built from the warm start, the policy is the checkpoint's
    meta = {"run": cfg.run_name, "seed": cfg.seed, "data_seed": cfg.effective_data_seed,
            "objective": cfg.objective.name, "commit": _git_commit(), "versions": _versions(),
            "host": socket.gethostname(), "threads": torch.get_num_threads(),
            "start": datetime.now(timezone.utc).isoformat(timespec="seconds"), "end": None,
            "resumed_from_step": state["step"] or None, "sft": s.sft_info,
            "device": str(s.device), "dtype": cfg.model.dtype, "special_ids": s.codec.special,
            "chat_template": s.codec.chat, "model": model_info or {"arch": cfg.model.arch},
            "n_params": n_params(s.policy), "argv": sys.argv, **(meta_extra or {})}
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))

    metrics_w = JsonlWriter(run_dir / "metrics.jsonl")
    eval_w = JsonlWriter(run_dir / "eval.jsonl")
    samples_w = JsonlWriter(run_dir / "samples.jsonl")
    wb = _wandb_init(cfg, run_dir, meta) if cfg.log.wandb else None
    crash_at = int(os.environ.get("OBJBENCH_CRASH_AT_STEP", "0"))  # test hook: hard crash after this step
    steps = cfg.train.steps
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, initial=state["step"], desc=cfg.run_name, unit="step", dynamic_ncols=True)
    try:
        if state["step"] == 0:
            row = {"step": 0, "tokens": 0, **evaluate(s, 0)}
            eval_w.write(row)
        while state["step"] < steps:
            row, all_b = train_step(s, state, opt, critic_opt)
            step, m = state["step"], row
            metrics_w.write(row)
            for i in range(min(cfg.train.log_samples, all_b.size)):
                row_s = {"step": step, "prompt": all_b.problems[i].prompt, "response": all_b.texts[i],
                         "reward": float(all_b.rewards[i]), "correct": bool(all_b.correct[i])}
                if all_b.reasons and all_b.reasons[i]:
                    row_s["reason"] = all_b.reasons[i]  # why the verifier judged it (unparseable / wrong / ...)
                samples_w.write(row_s)
            if step % cfg.train.eval_every == 0 or step == steps:
                erow = {"step": step, "tokens": state["tokens"], **evaluate(s, step)}
                eval_w.write(erow)
                row.update(erow)
            if wb is not None:
                wb.log(row, step=step)
            if (cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0) or step == steps:
                save_checkpoint(run_dir, s, opt, critic_opt, state)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(acc=f"{m['reward/acc']:.2f}", len=f"{m['length/mean']:.1f}")
            if crash_at and step == crash_at:
                os._exit(3)
    finally:
        for w in (metrics_w, eval_w, samples_w):
            w.close()
        if bar is not None:
            bar.close()
        if wb is not None:
            wb.finish()
    meta["end"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    meta["peak_rss_mb"] = peak_rss_mb()
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    (run_dir / "done").write_text("")
    return run_dir


def train_step(s: Setup, state: dict, opt, critic_opt) -> tuple[dict, Batch]:
    """One RL step (collect, then update); advances ``state``. Returns (metrics row, everything sampled)."""
    step = state["step"] + 1
    s, sched = at_step(s, state, step)  # the objective and sampling temperature in effect at this step
    phases_before = dict(s.timers)
    t0 = time.perf_counter()
    if s.sampler is not None:  # stale rollouts: sample with the weights of len(history) - 1 training steps ago
        s.sampler.load_state_dict(s.history[0])
        s.engine.sync_weights(s.sampler)
        try:
            train_b, all_b, cm = collect(s, step, state)
        finally:
            s.engine.sync_weights(s.policy)  # evaluation samples the current weights
        cm["rollout/staleness"] = len(s.history) - 1
    else:
        train_b, all_b, cm = collect(s, step, state)
    t1 = time.perf_counter()
    m = {**rollout_metrics(all_b, s.task), **cm, **sched}
    if train_b is not None:
        m.update(update(s, train_b, opt, critic_opt, step))
        s.engine.sync_weights(s.policy)  # the next rollout (and evaluation) samples from the updated weights
    if s.history is not None:
        s.history.append(_weights_copy(s.policy))
        while len(s.history) > s.cfg.rollout.staleness + 1:
            s.history.popleft()
    control_temperature(s, state, m)  # rollout.temperature_control: the next step's temperature
    t2 = time.perf_counter()
    state["tokens"] += m["rollout/tokens"]
    state["elapsed"] += t2 - t0
    state["step"] = step
    row = {"step": step, "tokens": state["tokens"], "time": round(state["elapsed"], 4), **m,
           "time/rollout": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0,
           "mem/peak_rss_mb": peak_rss_mb()}
    if s.device.type == "cuda":  # the policy's device (make_setup moved it there)
        row["mem/gpu_peak_mb"] = torch.cuda.max_memory_allocated(s.device) / 2 ** 20
    row.update({f"time/{k}": v - phases_before.get(k, 0.0) for k, v in s.timers.items()})
    return row, all_b


def _wandb_mode() -> str | None:
    """None (wandb decides: WANDB_MODE, an API key, or a `wandb login`) unless nothing is configured at all,
    then "offline", so a run never blocks on a login prompt."""
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return None
    host = (os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        import netrc

        if netrc.netrc().authenticators(host):
            return None  # `wandb login` wrote the key to ~/.netrc
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


def _wandb_init(cfg: TrainConfig, run_dir: Path, meta: dict):
    try:
        import wandb
    except ImportError:
        raise ConfigError("log.wandb=true needs wandb: pip install 'objbench[wandb]'") from None
    # one wandb run per run folder: a resumed run continues the same wandb run (same id, resume="allow")
    id_file = run_dir / "wandb_id"
    safe = "".join(c if c.isalnum() or c in "_-" else "-" for c in cfg.run_name[:40])
    run_id = id_file.read_text().strip() if id_file.is_file() else f"{safe}-{os.urandom(4).hex()}"
    id_file.write_text(run_id)
    mode = _wandb_mode()
    kw = {"mode": mode} if mode else {}
    for attempt in range(10):
        try:
            return wandb.init(project=cfg.log.wandb_project, name=cfg.run_name, id=run_id, resume="allow",
                              dir=str(run_dir), config=to_dict(cfg), group=meta.get("sweep") or None,
                              tags=[t for t in (meta.get("arm"), f"seed{cfg.seed}") if t], **kw)
        except Exception as e:  # after a hard crash wandb's service may hold the run for a few seconds
            if "in use" not in str(e) or attempt == 9:
                raise
            time.sleep(2)

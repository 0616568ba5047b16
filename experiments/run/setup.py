"""Everything the loop needs around a start policy (Setup): reference, critic, engine, sampling settings, the
training prompt stream, and the phase timers."""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from objbench.algos.registry import ADVANTAGE_ESTIMATORS
from objbench.experiments.config import (
    ConfigError,
    TrainConfig,
    build_task,
    check_model,
    max_new_tokens,
)
from objbench.experiments.run.diagnostics import StudyDiagnostics
from objbench.experiments.run.reward_terms import start_reward_fns
from objbench.experiments.run.warmstart import warm_start
from objbench.rollout.bundle import DTYPES, Codec, char_codec, load_hf, resolve_device
from objbench.rollout.engine import HFEngine, SamplingParams, make_engine
from objbench.rollout.models import ValueModel, frozen_copy


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


def prompt_stream(s: "Setup") -> PromptStream:
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
    forward: str = "auto"  # "auto": the lean forward where it supports the model; "hf": the transformers forward
    # optim.lr_schedule / optim.warmup_steps: the policy optimizer's schedule (make_optimizers sets it; stepped after
    # every policy optimizer step, saved in checkpoints); None for a constant learning rate without warm-up
    lr_schedule: "torch.optim.lr_scheduler.LambdaLR | None" = None
    reward_fns: object = None  # the worker of reward.fns (experiments/run/reward_terms.py); None: none
    # what listens to each update (experiments/run/update.py): classes, one instance per update, with
    # after_advantages(StepView), after_optimizer_step(MinibatchView) and finish() -> metrics; by default the
    # registered study diagnostics
    update_listeners: tuple = (StudyDiagnostics,)

    _params: tuple = field(default=(None, ()), repr=False)  # (policy, its parameters): see policy_params

    @property
    def tokenizer(self):
        return self.codec.tokenizer

    @property
    def greedy_sampling(self) -> SamplingParams:
        """Greedy decoding with the run's other sampling settings (length budget, special ids, stop strings)."""
        return dataclasses.replace(self.eval_sampling, temperature=0.0, top_p=1.0, top_k=0)

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
    # the lean path is checked against transformers on CPU only; checkpointing needs the transformers forward
    forward = "hf" if cfg.model.forward == "hf" or cfg.model.gradient_checkpointing or device.type != "cpu" else "auto"
    needs_ref = obj.kl.placement != "none" or cfg.log.ref_kl
    reference = frozen_copy(policy) if needs_ref else None
    needs_values = ADVANTAGE_ESTIMATORS.get(obj.adv.estimator).needs_values  # gae, hybrid: a critic
    critic = ValueModel(policy).to(device=device, dtype=DTYPES[cfg.model.dtype]) if needs_values else None
    max_new = max_new_tokens(cfg, task)
    ro = cfg.rollout
    if ro.stop and getattr(task, "interjection_marker", None):
        raise ConfigError(f"rollout.stop: task {task.name!r} interjects at a marker of its own (task.verdict); stop "
                          "strings would end its first part early. Leave rollout.stop empty")
    engine_settings = {**ro.engine_settings(), **({"forward": forward} if ro.engine == "hf" else {}),
                       **({"tokenizer": codec.tokenizer} if ro.stop else {})}  # stop strings decode with it
    engine = make_engine(ro.engine, policy, **engine_settings)
    knobs = dict(top_k=ro.top_k, stop=tuple(ro.stop))
    sampling = SamplingParams(max_new, ro.temperature, ro.top_p, codec.eos_id, codec.pad_id, **knobs)
    eval_T = ro.temperature if cfg.train.eval_temperature is None else cfg.train.eval_temperature
    eval_sampling = SamplingParams(max_new, eval_T, ro.top_p, codec.eos_id, codec.pad_id, **knobs)
    # special tokens other than <eos> inside a response make it invalid (decoding would silently drop them)
    bad_ids = torch.tensor(sorted(set(codec.tokenizer.all_special_ids) - {codec.eos_id}), dtype=torch.long,
                           device=device)
    sampler = history = None
    if cfg.rollout.staleness:
        sampler, history = frozen_copy(policy), deque([weights_copy(policy)])
    return Setup(cfg, task, codec, policy, reference, critic, engine, sampling, eval_sampling,
                 dict(sft_info or {}), bad_ids=bad_ids, device=device, sampler=sampler, history=history,
                 prompts=PromptStream(task, cfg.effective_data_seed, codec), forward=forward,
                 reward_fns=start_reward_fns(cfg))


def weights_copy(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def make_optimizers(s: Setup):
    """AdamW for the policy (and the critic); sets ``s.lr_schedule`` (make_lr_schedule) on the policy's."""
    o = s.cfg.optim
    # fused: one kernel for all parameters instead of a Python loop over them (same update up to rounding)
    opt = torch.optim.AdamW(s.policy.parameters(), lr=o.lr, betas=(o.beta1, o.beta2),
                            weight_decay=o.weight_decay, eps=1e-8, fused=True)
    critic_opt = None
    if s.critic is not None:
        critic_opt = torch.optim.AdamW(s.critic.parameters(), lr=o.lr * s.cfg.objective.value.lr_scale,
                                       betas=(o.beta1, o.beta2), weight_decay=o.weight_decay, eps=1e-8)
    s.lr_schedule = make_lr_schedule(opt, s.cfg)
    return opt, critic_opt


def optimizer_steps(cfg: TrainConfig) -> int:
    """Optimizer steps of the whole run: train.steps x objective.n_epochs x objective.n_minibatches (the unit of
    optim.warmup_steps and of the decay, as in verl and TRL). A step whose batch is empty (every group filtered
    out) takes none, so a run may end a little short of this count, with a learning rate above the floor."""
    return cfg.train.steps * cfg.objective.n_epochs * cfg.objective.n_minibatches


def lr_factor(step: int, o, total: int) -> float:
    """The factor on optim.lr of the optimizer update that follows ``step`` updates (step 0 = the first update).

    Warm-up: step / warmup_steps while step < warmup_steps (so the first update has lr 0, as in transformers'
    get_*_schedule_with_warmup and verl). Then, with progress p = (step - warmup) / (total - warmup) clamped to
    [0, 1], the decay d = 1 (constant), 1 - p (linear) or (1 + cos(pi p)) / 2 (cosine), and the factor
    min_lr_ratio + (1 - min_lr_ratio) d: the floor is reached at step ``total``, after the last update (the
    last update itself has p = (total - 1 - warmup) / (total - warmup)), and held past it."""
    if step < o.warmup_steps:
        return step / o.warmup_steps
    if o.lr_schedule == "constant":
        return 1.0
    p = min(1.0, max(0.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps)))
    d = 1.0 - p if o.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
    return o.min_lr_ratio + (1.0 - o.min_lr_ratio) * d


def make_lr_schedule(opt: torch.optim.Optimizer, cfg: TrainConfig) -> "torch.optim.lr_scheduler.LambdaLR | None":
    """The policy optimizer's learning-rate schedule (optim.lr_schedule, optim.warmup_steps, optim.min_lr_ratio),
    counted in optimizer steps (``optimizer_steps``; ``lr_factor`` gives the factor on optim.lr), as a LambdaLR
    that the loop steps after every policy optimizer step. None for the constant schedule without warm-up: the
    optimizer's learning rate is then never touched (every committed run).

    Building it sets the optimizer's learning rate to that of the first update (0 with a warm-up)."""
    o = cfg.optim
    if o.lr_schedule == "constant" and not o.warmup_steps:
        return None
    total = optimizer_steps(cfg)
    if o.warmup_steps > total:
        raise ConfigError(f"optim.warmup_steps={o.warmup_steps} is more than the run's {total} optimizer steps "
                          "(train.steps x objective.n_epochs x objective.n_minibatches)")

    def factor(step: int) -> float:
        return lr_factor(step, o, total)

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)

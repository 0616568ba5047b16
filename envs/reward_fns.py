"""Reward functions (``reward.fns``): a researcher's own reward terms beside the task's verifier, with TRL's
signature ``fn(prompts, completions, **columns) -> list[float | None]``.

- ``prompts``: the problems' prompt texts; ``completions``: the responses as text (the assistant's text for chat
  tasks); ``columns``: for a data-set task every column of its rows as in the file (TRL's convention), for every
  task ``answer`` (the parsed ground truth, unless the data set has an ``answer`` column of its own) and
  ``difficulty``, and the problem's extras -- one list per name, aligned with the samples.
- A value per sample: a number, or None when the function abstains for that sample.
- A sample's reward is ``task_weight * verifier + sum_k weights[k] * fn_k`` over the terms that did not abstain;
  the verifier alone decides ``correct`` (accuracy, pass@k, dynamic sampling, lengths of right and wrong answers).

Every function runs in one worker process per run (the sandbox server, envs/sandbox_server.py, running
envs/_job_reward_fn.py; its client is envs/sandbox.py), with the user's environment and working folder and a time
limit per call (``reward.timeout``): a function that raises, returns the wrong thing, hangs or kills its process
fails the run with ``RewardFnError`` naming it; nothing is zeroed silently. A spec is ``module:function`` (found on the
working directory and PYTHONPATH) or ``path/file.py:function``.
"""

from __future__ import annotations

import math
import os

from .sandbox import SandboxClient, SandboxError, SandboxSpec, SandboxTimeout

__all__ = ["RewardFnError", "RewardFunctions", "check_fn_spec", "fn_names", "columns_of"]

_WORKER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_job_reward_fn.py")
"""The per-job module of the reward-function worker (run by the sandbox server, envs/sandbox_server.py)."""
STARTUP_TIMEOUT_S = 120.0  # importing the functions' modules (they may import torch or a tokenizer)


class RewardFnError(RuntimeError):
    """A reward function that cannot be loaded, raised, hung, died or returned something other than one number
    (or None) per sample."""


def check_fn_spec(spec: str) -> None:
    """``module:function`` or ``path/file.py:function``; ValueError naming the spec otherwise."""
    target, colon, name = str(spec).rpartition(":")
    if not colon or not target or not name.isidentifier():
        raise ValueError(f"reward.fns entry {spec!r} must be 'module:function' or 'path/file.py:function'")
    if target.endswith(".py") and not os.path.isfile(target):
        raise ValueError(f"reward.fns entry {spec!r}: file {target} not found")


def fn_names(specs: list) -> list:
    """The metric name of each function (``reward/<name>``): the function's name, made unique with a suffix."""
    out: list = []
    for spec in specs:
        base = str(spec).rpartition(":")[2]
        name, k = base, 2
        while name in out or name in ("task", "mean", "acc"):
            name, k = f"{base}_{k}", k + 1
        out.append(name)
    return out


def columns_of(problems: list, task=None) -> dict:
    """The ``columns`` of a batch, as aligned lists: the task's own (``task.reward_columns(problems)``: a data set's
    columns as in its file), then ``answer`` (the parsed ground truth) and ``difficulty`` and every extra of the
    problems (``Problem.meta``) under the names the task did not use."""
    cols: dict = dict(task.reward_columns(problems)) if hasattr(task, "reward_columns") else {}
    for name, values in (("answer", [p.answer for p in problems]), ("difficulty", [p.difficulty for p in problems])):
        cols.setdefault(name, values)
    for key in dict.fromkeys(k for p in problems for k, _ in p.meta):
        cols.setdefault(key, [dict(p.meta).get(key) for p in problems])
    return cols


class RewardFunctions:
    """The worker process of one run's reward functions (the shared sandbox client, envs/sandbox.py, under the
    reward functions' policy: the user's environment, folder and terminal; any failure stops the worker and fails
    the run). ``RewardFunctions(specs, timeout)`` starts it and imports the functions (RewardFnError when one cannot
    be loaded); ``values(k, prompts, completions, columns)`` calls function k; ``close()`` ends the worker (also at
    garbage collection)."""

    def __init__(self, specs: list, timeout: float) -> None:
        self.specs, self.timeout = [str(s) for s in specs], float(timeout)
        spec = SandboxSpec(job=_WORKER_PATH, settings={"fns": self.specs}, name="reward-function worker",
                           output="inherit", replace=False, startup_timeout_s=STARTUP_TIMEOUT_S)
        self._client = SandboxClient(lambda: spec)
        what = "loading reward.fns " + ", ".join(self.specs)
        try:
            self._client.open()
        except SandboxTimeout:
            self.close()
            raise RewardFnError(f"{what} did not return within {STARTUP_TIMEOUT_S:g} s (reward.timeout); its worker "
                                f"was stopped") from None
        except SandboxError as e:
            self.close()
            if e.reply is not None:
                raise RewardFnError(f"reward.fns: cannot load {', '.join(self.specs)}: {e.reply['error']}") from None
            raise RewardFnError(f"{what}: its worker process ended (exit code {e.exit_code})") from None

    def values(self, k: int, prompts: list, completions: list, columns: dict) -> list:
        """Function k on one batch: a list of floats and Nones, one per completion."""
        spec = self.specs[k]
        reply = self._ask({"fn": k, "prompts": prompts, "completions": completions, "columns": columns},
                          self.timeout, f"reward function {spec}")
        if "error" in reply:
            raise RewardFnError(f"reward function {spec} raised {reply['error']}\n{reply.get('traceback', '')}")
        return _checked(spec, reply.get("values"), len(completions))

    def _ask(self, request: dict, timeout: float, what: str) -> dict:
        if not self._client.running:
            raise RewardFnError(f"{what}: the reward-function worker is not running")
        try:
            return self._client.request(request, (timeout,))
        except SandboxTimeout:
            self.close()
            raise RewardFnError(f"{what} did not return within {timeout:g} s (reward.timeout); its worker was "
                                f"stopped") from None
        except SandboxError as e:
            self.close()
            raise RewardFnError(f"{what}: its worker process ended (exit code {e.exit_code})") from None

    def close(self) -> None:
        self._client.stop()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown, or a constructor that failed early
            pass


def _checked(spec: str, values, n: int) -> list:
    if not isinstance(values, list) or len(values) != n:
        got = f"{len(values)} values" if isinstance(values, list) else repr(values)[:80]
        raise RewardFnError(f"reward function {spec} must return a list of {n} values (a number or None per "
                            f"completion), got {got}")
    for i, v in enumerate(values):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise RewardFnError(f"reward function {spec} returned {v!r} for completion {i}: each value must be a "
                                f"finite number or None (abstain)")
    return [None if v is None else float(v) for v in values]

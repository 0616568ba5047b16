"""The reward-function job of the sandbox server (envs/sandbox_server.py): runs a run's reward functions
(``reward.fns``, envs/reward_fns.py), user code that may hang, crash or print, outside the training process. Loaded
by path in the worker, never imported by objbench; it runs with the user's environment and working folder (a
reward function may need an API key for a judge).

Settings: {"fns": ["module:function" | "path/file.py:function", ...]}; each server imports them before announcing
itself (an import that fails is reported instead, as {"error": "Type: message", "traceback": ...}). Requests
{"fn": i, "prompts": [...], "completions": [...], "columns": {name: [...]}} are answered {"values": [...]} (the
function's return value, checked by the client) or, when it raises, {"error": "Type: message", "traceback": ...}
(by the server loop). Whatever user code prints goes to stderr: stdout carries the protocol only.
"""

import importlib
import importlib.util
import os
import sys


def load(spec: str):
    """The function named by one spec."""
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        path = os.path.abspath(target)
        mod_spec = importlib.util.spec_from_file_location(f"objbench_reward_{abs(hash(path))}", path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.path.append(os.path.dirname(path))
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"{target} has no function {name!r}")
    return fn


def plain(v):
    """A returned value as JSON can carry it: numbers (numpy and torch scalars too) and None as they are, anything
    else as its repr (the client then names the bad value)."""
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if hasattr(v, "__float__") and getattr(v, "ndim", 0) == 0:
        return float(v)
    return repr(v)


def start(settings: dict) -> list:
    """The functions, imported in the server ("module:function" finds the modules of the run's folder)."""
    sys.path.insert(0, os.getcwd())
    return [load(spec) for spec in settings["fns"]]


def handle(fns: list, request: dict, reply) -> None:
    """Call function `fn` on one batch; its values, or the repr of whatever else it returned."""
    values = fns[request["fn"]](request["prompts"], request["completions"], **request["columns"])
    reply({"values": [plain(v) for v in values] if isinstance(values, (list, tuple)) else repr(values)})

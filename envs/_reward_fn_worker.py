"""The process that runs a run's reward functions (``reward.fns``, envs/reward_fns.py): user code that may hang,
crash or print runs here, never in the training process. Run by path (``python _reward_fn_worker.py``); imports
nothing of objbench.

Protocol, one JSON object per line. The first line from the parent is ``{"fns": ["module:function" |
"path/file.py:function", ...]}``; the worker imports them and answers ``{"ready": true}`` or ``{"error": ...}``.
Then each request ``{"fn": i, "prompts": [...], "completions": [...], "columns": {name: [...]}}`` is answered
with ``{"values": [...]}`` (the function's return value, checked by the parent) or ``{"error": "Type: message",
"traceback": ...}``. The worker ends at EOF on its input. Whatever user code prints goes to stderr: stdout carries
the protocol only.
"""

import importlib
import importlib.util
import json
import os
import sys
import traceback


def _protocol_out():
    """A private copy of stdout for the replies; fd 1 then points at stderr, so a print() in user code cannot
    corrupt the protocol."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _load(spec):
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


def _plain(v):
    """A returned value as JSON can carry it: numbers (numpy and torch scalars too) and None as they are, anything
    else as its repr (the parent then names the bad value)."""
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if hasattr(v, "__float__") and getattr(v, "ndim", 0) == 0:
        return float(v)
    return repr(v)


def _error(e):
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return {"error": f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__,
            "traceback": traceback.format_exc()[-4000:]}


def main():
    out = _protocol_out()
    sys.path.insert(0, os.getcwd())  # "module:function" finds the modules of the directory the run started in
    first = sys.stdin.readline()
    if not first:
        return
    try:
        fns = [_load(spec) for spec in json.loads(first)["fns"]]
        out.write(json.dumps({"ready": True}) + "\n")
    except BaseException as e:  # noqa: BLE001 - any failure to import is reported, then the worker ends
        out.write(json.dumps(_error(e)) + "\n")
        return
    for line in sys.stdin:
        req = json.loads(line)
        try:
            values = fns[req["fn"]](req["prompts"], req["completions"], **req["columns"])
            reply = {"values": [_plain(v) for v in values] if isinstance(values, (list, tuple)) else repr(values)}
            text = json.dumps(reply, allow_nan=True)
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the run naming the function
            if isinstance(e, KeyboardInterrupt):
                raise
            text = json.dumps(_error(e))
        out.write(text + "\n")


if __name__ == "__main__":
    main()

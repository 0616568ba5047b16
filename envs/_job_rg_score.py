"""The reasoning-gym scoring job of the sandbox server (envs/sandbox_server.py): runs a data set's `score_answer`
away from the trainer, under the policy of envs/rg_scorer.py (scrubbed environment, empty temporary folder,
RLIMIT_AS and RLIMIT_FSIZE set by the server, RLIMIT_CPU here). Loaded by path in the worker, never imported by
objbench.

Requests (strings are \\u-escaped on the wire, so NUL bytes and lone surrogates travel intact):
- {"op": "score", "dataset": name, "args": {...}, "seed": s, "size": k, "index": i, "qhash": h, "answer": str,
  "timeout_s": t} -> {"phase": "built"} once the entry is rebuilt (trusted generator code: the client waits for this
  under a long bound), then {"score": x} with x a float in [0, 1], or {"error": "mismatch"} when the rebuilt entry's
  question hash is not `qhash` (the generator is not deterministic in this process), or {"error": "build: ..."}
  when the entry cannot be built;
- {"op": "probe"} -> {"env": {...}, "cwd": ..., "pid": ..., "limits": {...}, "sys_path": [...]} (for tests).

The entry is rebuilt here from (dataset, args, seed, size, index) with the same generator the parent used, never
received: nothing the parent sends is unpickled or executed except by the scorer the parent chose.

RLIMIT_CPU: its soft bound is set before each score_answer call to the CPU seconds used so far + timeout + 1 (before
a rebuild, and the import and warm-up: + 300), so a scorer that spins after its parent is gone dies on its own
(SIGXCPU); the server is then replaced.
"""

import copy
import hashlib
import json
import math
import os
import resource
import sys
from collections import OrderedDict

_DATASET_CACHE = 8  # dataset objects kept by the server (creating one can take seconds: acre reads a file)
_ENTRY_CACHE = 512  # rebuilt entries kept (the completions of one group share their entry)
_CPU_HARD_S = 7 * 24 * 3600  # hard CPU bound of a server; the soft bound is raised per request up to it
_BUILD_CPU_S = 300  # CPU seconds allowed for rebuilding one entry (trusted generator code; the parent bounds it too)


def question_hash(question: str) -> str:
    """What the parent sends as qhash: the first 16 hex digits of sha256 of the question (UTF-8, surrogates
    escaped). The parent has a copy of this function (envs/reasoning_gym.py): the two must agree."""
    return hashlib.sha256(question.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class Entries:
    """Rebuilds entries from (dataset, args, seed, size, index), caching dataset objects and entries."""

    def __init__(self, create_dataset):
        self.create = create_dataset
        self.datasets: OrderedDict = OrderedDict()
        self.entries: OrderedDict = OrderedDict()

    def get(self, name: str, args: dict, seed: int, size: int, index: int) -> tuple:
        """(dataset object, entry) for one request."""
        dkey = (name, json.dumps(args, sort_keys=True), seed, size)
        ekey = (*dkey, index)
        hit = self.entries.get(ekey)
        if hit is not None:
            self.entries.move_to_end(ekey)
            return hit
        ds = self.datasets.get(dkey)
        if ds is None:
            ds = self.create(name, seed=seed, size=size, **args)
            self.datasets[dkey] = ds
            if len(self.datasets) > _DATASET_CACHE:
                self.datasets.popitem(last=False)
        hit = self.entries[ekey] = (ds, ds[index])
        if len(self.entries) > _ENTRY_CACHE:
            self.entries.popitem(last=False)
        return hit


def cpu_budget(seconds: float) -> None:
    """Let this process use `seconds` more CPU seconds from now (RLIMIT_CPU's soft bound; SIGXCPU past it)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    try:
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        hard = _CPU_HARD_S if hard == resource.RLIM_INFINITY else min(hard, _CPU_HARD_S)
        resource.setrlimit(resource.RLIMIT_CPU, (min(hard, math.ceil(r.ru_utime + r.ru_stime + seconds)), hard))
    except (ValueError, OSError):
        pass


def warm(settings: dict):
    """reasoning-gym's create_dataset, imported and warmed up (lazy imports of the scoring path)."""
    cpu_budget(_BUILD_CPU_S)  # the import and warm-up
    from reasoning_gym import create_dataset

    ds = create_dataset("basic_arithmetic", seed=0, size=2)
    ds.score_answer(ds[0]["answer"], ds[0])
    return create_dataset


def start(create_dataset) -> Entries:
    """Each server's entry cache (empty)."""
    return Entries(create_dataset)


def score(entries: Entries, request: dict, reply) -> None:
    """Rebuild the entry, announce it, score the answer (exceptions of the scorer score 0)."""
    cpu_budget(_BUILD_CPU_S)
    try:
        ds, entry = entries.get(str(request["dataset"]), dict(request["args"]), int(request["seed"]),
                                int(request["size"]), int(request["index"]))
    except BaseException as e:  # noqa: BLE001 - a bad request must not end the server
        reply({"error": f"build: {type(e).__name__}: {e}"[:500]})
        return
    if question_hash(entry["question"]) != request.get("qhash"):
        reply({"error": "mismatch"})
        return
    reply({"phase": "built"})
    cpu_budget(float(request.get("timeout_s", 1.0)) + 1)
    try:
        value = ds.score_answer(str(request["answer"]), copy.deepcopy(entry))  # a scorer may write into the entry
        value = float(value)
        value = 0.0 if not math.isfinite(value) else min(1.0, max(0.0, value))
    except BaseException:  # noqa: BLE001 - MemoryError, RecursionError, anything the scorer raises: scores 0
        value = 0.0
    reply({"score": value})


def probe(reply) -> None:
    """What this server sees: environment, folder, pid, limits, import path."""
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE")}
    reply({"env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid(), "limits": limits,
           "sys_path": list(sys.path)})


def handle(entries: Entries, request: dict, reply) -> None:
    """One request: "score" (the default op) or "probe"."""
    op = request.get("op", "score")
    if op == "probe":
        probe(reply)
    elif op == "score":
        score(entries, request, reply)
    else:
        reply({"error": "unknown op"})

"""The reasoning-gym scoring job of the sandbox server (envs/sandbox_server.py): runs a data set's `score_answer`
away from the trainer, under the policy of envs/rg_scorer.py (scrubbed environment, empty temporary folder,
RLIMIT_AS and RLIMIT_FSIZE set by the server, RLIMIT_CPU here). Loaded by path in the worker, never imported by
objbench.

Requests (strings are \\u-escaped on the wire, so NUL bytes and lone surrogates travel intact):
- {"op": "score", "dataset": name, "args": {...}, "seed": s, "size": k, "index": i, "qhash": h, "answer": str,
  "timeout_s": t, "one_shot": b} -> {"phase": "built"} once the entry is rebuilt (trusted generator code: the
  client waits for this under a long bound), then {"score": x} with x a float in [0, 1], or {"timeout": true} when
  a one-shot child wrote no score (it died: RLIMIT_CPU, a signal, an exit of its own), or {"error": "mismatch"}
  when the rebuilt entry's question hash is not `qhash` (the generator is not deterministic in this process), or
  {"error": "build: ..."} when the entry cannot be built. "one_shot" (default true): score in a one-shot child;
  false (a scorer that does not evaluate the answer): in the server itself, on a deep copy of the entry;
- {"op": "probe"} -> {"env": {...}, "cwd": ..., "pid": ..., "limits": {...}, "sys_path": [...], "child": {...}}
  (for tests; "child": what a one-shot child sees: its uid, gid, groups, limits, open descriptors).

The entry is rebuilt here from (dataset, args, seed, size, index) with the same generator the parent used, never
received: nothing the parent sends is unpickled or executed except by the scorer the parent chose.

One-shot children (`one_shot`, envs/sandbox_server.py): a fresh process per call whose only open descriptor is a
private pipe for its one result, under the sandbox's own uid when the worker runs as root (with RLIMIT_NPROC); the
server attaches the request id, so an evaluated answer cannot reply for any other request, and whatever it starts
is killed before the next request is read. The entry is rebuilt in the server (and cached there: the child
inherits it); when a data set object is created, its scorer is run once in the server on the rebuilt entry's own
reference answer (trusted generator output), so the modules a scorer imports lazily are loaded before a child is
forked (one under another uid may not be allowed to read the interpreter's files, e.g. under a 0700 /root).

RLIMIT_CPU: its soft bound is set before each rebuild to the CPU seconds used so far + 300 (and for the import and
warm-up), and in the child to timeout + 1, so a scorer that spins after its parent is gone dies on its own (SIGXCPU:
the answer scores as a time-out).
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
_LIMITS = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NPROC")

one_shot = None
"""Set by the server when it loads this module: one_shot(fn, *args) -> the dict fn returned in a fresh child, or
None (see envs/sandbox_server.py)."""


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
            _load_scorer(ds, ds[index])
            self.datasets[dkey] = ds
            if len(self.datasets) > _DATASET_CACHE:
                self.datasets.popitem(last=False)
        hit = self.entries[ekey] = (ds, ds[index])
        if len(self.entries) > _ENTRY_CACHE:
            self.entries.popitem(last=False)
        return hit


def _load_scorer(ds, entry: dict) -> None:
    """Run the scorer once here on the entry's own reference answer (trusted): its lazy imports are then loaded."""
    try:
        ds.score_answer(entry.get("answer"), copy.deepcopy(entry))
    except BaseException:  # noqa: BLE001 - only a warm-up
        pass


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
    args = (ds, entry, str(request["answer"]), float(request.get("timeout_s", 1.0)))
    if not request.get("one_shot", True):  # a scorer that does not evaluate the answer: here, a copy of the entry
        reply(score_answer(ds, copy.deepcopy(entry), *args[2:]))
        return
    result = one_shot(score_answer, *args)
    if result is None:
        reply({"timeout": True})
    elif "error" in result:
        reply({"error": str(result["error"])[:500]})
    else:
        reply({"score": clamp(result.get("score"))})


def score_answer(ds, entry: dict, answer: str, timeout_s: float) -> dict:
    """{"score": the scorer's value} (anything it raises scores 0), in the one-shot child or the server."""
    cpu_budget(timeout_s + 1)
    try:
        return {"score": clamp(ds.score_answer(answer, entry))}  # a copy: the child's own, or a deep copy
    except BaseException:  # noqa: BLE001 - MemoryError, RecursionError, anything the scorer raises: scores 0
        return {"score": 0.0}


def clamp(value) -> float:
    """A score as a float in [0, 1] (0 for anything else)."""
    try:
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return 0.0 if not math.isfinite(value) else min(1.0, max(0.0, value))


def child_view() -> dict:
    """What a one-shot child sees: uid, gid, groups, limits, open descriptors."""
    return {"uid": os.getresuid(), "gid": os.getresgid(), "groups": os.getgroups(), "fds": sorted(
        int(fd) for fd in os.listdir("/proc/self/fd")), "limits": limits()}


def limits() -> dict:
    """This process's resource limits (_LIMITS)."""
    return {name: resource.getrlimit(getattr(resource, name)) for name in _LIMITS}


def probe(reply) -> None:
    """What this server sees: environment, folder, pid, limits, import path; and what a one-shot child sees."""
    reply({"env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid(), "limits": limits(),
           "sys_path": list(sys.path), "child": one_shot(child_view)})


def handle(entries: Entries, request: dict, reply) -> None:
    """One request: "score" (the default op) or "probe"."""
    op = request.get("op", "score")
    if op == "probe":
        probe(reply)
    elif op == "score":
        score(entries, request, reply)
    else:
        reply({"error": "unknown op"})

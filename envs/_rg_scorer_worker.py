"""Worker process of `envs.reasoning_gym`: runs reasoning-gym's `score_answer` away from the trainer.

Run by path: `python -s -B <this file> <settings JSON>`, where the settings are {"sys_path": [...], "memory_bytes":
n, "file_bytes": m}. The parent starts it with a scrubbed environment (nothing inherited: see
`reasoning_gym.scorer_env`) in an empty temporary folder, so whatever a scorer does with the model's text (some call
eval() on it) has no API keys to read and no project folder to write into.

Protocol, JSON lines (ASCII: strings are \\u-escaped, so NUL bytes and lone surrogates travel intact):
- the server announces itself: {"ready": true, "pid": p};
- {"id": n, "op": "score", "dataset": name, "args": {...}, "seed": s, "size": k, "index": i, "qhash": h,
   "answer": str, "timeout_s": t} -> {"id": n, "phase": "built"} once the entry is rebuilt (trusted generator code:
   the parent waits for this under a long bound), then {"id": n, "score": x} with x a float in [0, 1], or
   {"id": n, "error": "mismatch"} when the rebuilt entry's question hash is not `qhash` (the generator is not
   deterministic in this process), or {"id": n, "error": "build: ..."} when the entry cannot be built;
- {"id": n, "op": "probe"} -> {"id": n, "env": {...}, "cwd": ..., "pid": ..., "limits": {...}} (for tests).

The entry is rebuilt here from (dataset, args, seed, size, index) with the same generator the parent used, never
received: nothing the parent sends is unpickled or executed except by the scorer the parent chose.

Limits: RLIMIT_AS (memory_bytes) and RLIMIT_FSIZE (file_bytes) for the whole worker; RLIMIT_CPU, whose soft bound is
set before each score_answer call to the CPU seconds used so far + timeout + 1 (before a rebuild: + 300), so a
scorer that spins after its parent is gone dies on its own (SIGXCPU). The wall clock is the parent's: past timeout_s
it sends SIGUSR1 to this process (the zygote), which SIGKILLs the server (which also stops a C-level big-integer
computation that no signal handler could) and forks a warm replacement in milliseconds. Everything exits when stdin
closes.
"""

import copy
import hashlib
import json
import math
import os
import resource
import signal
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


def score(entries: Entries, request: dict, send) -> None:
    """Rebuild the entry, announce it, score the answer (exceptions of the scorer score 0)."""
    rid = request["id"]
    cpu_budget(_BUILD_CPU_S)
    try:
        ds, entry = entries.get(str(request["dataset"]), dict(request["args"]), int(request["seed"]),
                                int(request["size"]), int(request["index"]))
    except BaseException as e:  # noqa: BLE001 - a bad request must not end the server
        send({"id": rid, "error": f"build: {type(e).__name__}: {e}"[:500]})
        return
    if question_hash(entry["question"]) != request.get("qhash"):
        send({"id": rid, "error": "mismatch"})
        return
    send({"id": rid, "phase": "built"})
    cpu_budget(float(request.get("timeout_s", 1.0)) + 1)
    try:
        value = ds.score_answer(str(request["answer"]), copy.deepcopy(entry))  # a scorer may write into the entry
        value = float(value)
        value = 0.0 if not math.isfinite(value) else min(1.0, max(0.0, value))
    except BaseException:  # noqa: BLE001 - MemoryError, RecursionError, anything the scorer raises: scores 0
        value = 0.0
    send({"id": rid, "score": value})


def probe(request: dict, send) -> None:
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE")}
    send({"id": request["id"], "env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid(),
          "limits": limits, "sys_path": list(sys.path)})


def serve(entries: Entries, out) -> None:
    """The forked server: announce itself, then answer requests until stdin closes."""

    def send(obj: dict) -> None:
        out.write(json.dumps(obj, ensure_ascii=True) + "\n")  # one line, written and flushed at once
        out.flush()

    send({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        try:
            request = json.loads(line)
            rid = request["id"]
        except Exception:  # noqa: BLE001
            continue
        if request.get("op") == "probe":
            probe(request, send)
        elif request.get("op", "score") == "score":
            score(entries, request, send)
        else:
            send({"id": rid, "error": "unknown op"})


def setup(settings: dict):
    """Limits, the import path and a protocol channel of our own; returns (create_dataset, out)."""
    here = os.path.dirname(os.path.abspath(__file__))
    # sys.path[0] is this file's folder (envs/), whose reasoning_gym.py would shadow the library: use the parent's
    # path instead (absolute entries only; a relative one meant the parent's working folder, not ours).
    sys.path[:] = [p for p in settings.get("sys_path", []) if os.path.isabs(p) and os.path.abspath(p) != here]
    out = os.fdopen(os.dup(1), "w", encoding="ascii")
    os.dup2(2, 1)  # anything a library (or an evaluated answer) prints goes to stderr: the parent's worker.log
    for name, key in (("RLIMIT_AS", "memory_bytes"), ("RLIMIT_FSIZE", "file_bytes")):
        limit = int(settings.get(key, 0))
        if limit > 0:
            resource.setrlimit(getattr(resource, name), (limit, limit))
    cpu_budget(_BUILD_CPU_S)  # the import and warm-up
    from reasoning_gym import create_dataset

    ds = create_dataset("basic_arithmetic", seed=0, size=2)  # warm-up: lazy imports of the scoring path
    ds.score_answer(ds[0]["answer"], ds[0])
    return create_dataset, out


def main() -> None:
    create_dataset, out = setup(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    # Zygote: this warmed process never scores anything itself; it forks a server and waits. SIGUSR1 from the
    # parent kills the server (a pid this process has not reaped yet, so never a reused one); a fresh fork follows.
    child = 0

    def interrupt(signum, frame):
        if child:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass

    signal.signal(signal.SIGUSR1, interrupt)
    while True:
        child = os.fork()
        if child == 0:
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            code = 1
            try:
                serve(Entries(create_dataset), out)
                code = 0
            finally:
                os._exit(code)  # never fall back into the zygote's loop
        _, status = os.waitpid(child, 0)
        child = 0
        if not os.WIFSIGNALED(status):
            return  # stdin closed (exit 0) or the pipes broke (exit 1): the parent is gone or done


if __name__ == "__main__":
    main()

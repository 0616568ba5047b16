"""The reasoning-gym scorer worker of this process: the shared sandbox client (envs/sandbox.py) under the scorers'
policy, running envs/_job_rg_score.py in the sandbox server (envs/sandbox_server.py).

Policy: started from `sys.executable -s -B` with a scrubbed environment (`scorer_env`: nothing inherited, so no API
keys or tokens), in its own empty temporary folder (its output goes to worker.log there, whose tail a failed start's
warning shows), under RLIMIT_AS (WORKER_MEMORY_BYTES), RLIMIT_FSIZE (WORKER_FILE_BYTES) and, per call, RLIMIT_CPU
(set by the job), with the import path of this process (absolute entries only). A score waits at most
BUILD_TIMEOUT_S for the entry to be rebuilt, then the task's timeout for the score; past it the server is killed and
a warm one forked (the answer then scores 0 with reason "timeout"). One worker per process, shared by every
reasoning_gym task in it; it stops at exit, and its folder goes with it.

A scorer that evaluates the answer (the task's `unsafe_scorer`) is run in a one-shot child of the worker per call
(envs/sandbox_server.py): only a private pipe open; when this process is root, under an unused uid/gid drawn at
each start (envs/sandbox_user.py; the folder is given to it) with at most WORKER_PROCESSES processes, every one
killed when the call ends or times out. What it can still do: docs/models-and-data.md ("The scorer sandbox").
"""

from __future__ import annotations

import os
import sys
import warnings

from .sandbox import SandboxError, SandboxSpec, SandboxTimeout, shared_client
from .sandbox_user import unused_id

WORKER_MEMORY_BYTES = 2 << 30
"""RLIMIT_AS of the scorer worker (it needs ~200 MB of address space after importing reasoning-gym)."""
WORKER_FILE_BYTES = 64 << 20
"""RLIMIT_FSIZE of the scorer worker: the largest file it may write (its log; whatever an evaluated answer writes)."""
WORKER_PROCESSES = 64
"""RLIMIT_NPROC of a scoring child: the processes (threads included) of the sandbox's uid when root; without root,
this many above the user's processes at the worker's start (envs/sandbox_server.py's process_bound)."""
STARTUP_TIMEOUT_S = 120.0
"""Seconds a call waits for a starting worker (import of reasoning-gym and sympy: ~2 s)."""
BUILD_TIMEOUT_S = 120.0
"""Seconds the worker may take to rebuild an entry (trusted generator code; creating a data set can take seconds)."""

_WORKER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_job_rg_score.py")
"""The per-job module of the scorer worker (read at each start: a test points it at a broken one)."""


def scorer_env(workdir: str) -> dict[str, str]:
    """The whole environment of the scorer worker: nothing inherited from this process (no API keys, tokens,
    proxies, PYTHONPATH), only what Python needs, single-threaded numerics, and PYTHONHASHSEED when it is fixed
    here (HASH_SEED_DEPENDENT generators must see the same one)."""
    env = {
        "PATH": os.defpath,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    hash_seed = os.environ.get("PYTHONHASHSEED", "")
    if hash_seed.isdigit():
        env["PYTHONHASHSEED"] = hash_seed
    return env


def _scorer_spec() -> SandboxSpec:
    """The worker's spec, read at each start: a fresh unused uid each time (when root)."""
    uid = unused_id()
    if uid is None and os.geteuid() == 0:
        warnings.warn("no unused uid could be drawn for the reasoning-gym scorer's children (envs/sandbox_user.py): "
                      "answers an opted-in scorer evaluates run as root, in a process of their own", stacklevel=2)
    settings = {"sys_path": [p for p in sys.path if p and os.path.isabs(p)], "memory_bytes": WORKER_MEMORY_BYTES,
                "file_bytes": WORKER_FILE_BYTES,
                "one_shot": {"uid": uid, "gid": uid, "max_processes": WORKER_PROCESSES}}
    return SandboxSpec(job=_WORKER_PATH, settings=settings, name="reasoning-gym scorer worker",
                       python_flags=("-s", "-B"), folder="objbench-rg-scorer-",
                       folder_owner=(uid, uid) if uid is not None else None, env=scorer_env, output="log",
                       start_warning="answers score 0 with reason 'timeout'", startup_timeout_s=STARTUP_TIMEOUT_S)


def sandbox_uid() -> int | None:
    """The uid the running worker's scoring children take (None: this process's own, or no worker yet)."""
    spec = _WORKER.spec
    return spec.settings["one_shot"]["uid"] if spec is not None and _WORKER.running else None


_WORKER = shared_client(_scorer_spec)


def score(payload: dict, timeout_s: float) -> dict:
    """One request to the worker (see envs/_job_rg_score.py): its reply, e.g. {"score": x} or {"error": ...}, or
    {"timeout": True} when it gave none within the bounds (the server was killed and is being replaced) or the
    worker failed (it starts again on the next request)."""
    try:
        return _WORKER.request(payload, (BUILD_TIMEOUT_S, timeout_s))
    except (SandboxTimeout, SandboxError):
        return {"timeout": True}


def start_worker() -> None:
    """Start the scorer worker now without waiting for it (the task does this on first use)."""
    _WORKER.start()


def stop_worker() -> None:
    """Stop the scorer worker and remove its folder (it restarts on the next score)."""
    _WORKER.stop()


def probe_worker(timeout_s: float = STARTUP_TIMEOUT_S) -> dict:
    """What the worker's server sees: {"env", "cwd", "pid", "limits", "sys_path"} (for tests and diagnostics)."""
    return score({"op": "probe"}, timeout_s)


def worker_stats() -> dict:
    """{"startup_s", "restarts", "workdir"} of this process's scorer worker."""
    return {"startup_s": _WORKER.startup_s, "restarts": _WORKER.restarts, "workdir": _WORKER.workdir}

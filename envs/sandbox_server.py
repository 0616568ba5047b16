"""The one server loop of objbench's worker processes (math-verify, reasoning-gym's scorers, reward functions).

Run by path, never imported by objbench: `python [-s -B] <this file> <job module path> <settings JSON>`; its client
is envs/sandbox.py. It imports nothing of objbench: the job module (the per-job part: what one request does) is
loaded from its path. It may define
- `warm(settings) -> context`: run once, in the zygote, before any server is forked (imports, warm-up; default: the
  settings themselves);
- `start(context) -> state`: run in each forked server before it announces itself (default: the context); an
  exception here is reported as {"error": ..., "traceback": ...} instead of the announcement, and the server ends;
- `handle(state, request, reply)`: answer one request; `reply(obj)` sends one line carrying the request's id (a job
  may send interim lines, e.g. {"phase": "built"}). An exception escaping it is answered {"error": "Type: message",
  "traceback": ...} and the server goes on.

Settings read here (the job gets all of them): "sys_path" (a list: replaces the import path, absolute entries only;
otherwise the path is kept), "memory_bytes" (RLIMIT_AS), "file_bytes" (RLIMIT_FSIZE), "respawn" (default true).
This file's folder (envs/) is always dropped from the import path, so no module there (envs/reasoning_gym.py) can
shadow a library module.

Protocol, JSON lines (ASCII: strings are \\u-escaped). The server announces itself with {"ready": true, "pid": p};
each request is one object with an "id"; each reply carries that id. Lines that are not such objects are skipped.
Everything a library or user code prints goes to stderr (fd 1 is pointed there): stdout carries the protocol only.

Zygote. The first process never answers requests itself: it forks a server and waits. SIGUSR1 to it kills the
server (SIGKILL: it also stops a C-level computation that no signal handler could; the pid is one the zygote has not
reaped, so never a reused one). When a server dies by a signal and "respawn" is set, a fresh fork (milliseconds,
already warm) announces itself; otherwise, and whenever a server exits, the zygote ends the way its server did
(exit code, or the same signal), so the client sees the server's own exit status. Everything ends when stdin closes.
"""

import importlib.util
import json
import os
import resource
import signal
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


def isolate_path(settings: dict) -> None:
    """The import path: the given "sys_path" (absolute entries; a relative one meant the parent's working folder)
    or the inherited one, without this file's folder."""
    paths = settings.get("sys_path")
    if paths is None:
        paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    else:
        paths = [p for p in paths if os.path.isabs(p) and os.path.abspath(p) != HERE]
    sys.path[:] = paths


def protocol_channel() -> int:
    """A private copy of stdout for the protocol; fd 1 (and sys.stdout) then point at stderr."""
    out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def apply_limits(settings: dict) -> None:
    """RLIMIT_AS ("memory_bytes") and RLIMIT_FSIZE ("file_bytes") for the whole process tree, when > 0 (never above
    an existing hard bound)."""
    for name, key in (("RLIMIT_AS", "memory_bytes"), ("RLIMIT_FSIZE", "file_bytes")):
        limit = int(settings.get(key, 0) or 0)
        if limit > 0:
            which = getattr(resource, name)
            hard = resource.getrlimit(which)[1]
            limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
            resource.setrlimit(which, (limit, limit))


def load_job(path: str):
    """The per-job module, loaded from its file."""
    spec = importlib.util.spec_from_file_location("objbench_sandbox_job", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def error_reply(e: BaseException) -> dict:
    """{"error": "Type: first line of the message", "traceback": ...} for an exception being handled."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return {"error": f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__,
            "traceback": traceback.format_exc()[-4000:]}


def writer(out: int):
    """send(obj): one JSON line on the protocol channel, in one write when it fits a pipe's atomic size."""

    def send(obj: dict) -> None:
        data = (json.dumps(obj, ensure_ascii=True) + "\n").encode("ascii")
        while data:
            data = data[os.write(out, data):]

    return send


def serve(job, context, out: int) -> None:
    """A forked server: start the job, announce itself, then answer requests until stdin closes."""
    send = writer(out)
    try:
        state = job.start(context) if hasattr(job, "start") else context
    except BaseException as e:  # noqa: BLE001 - reported to the client, which decides
        send(error_reply(e))
        return
    send({"ready": True, "pid": os.getpid()})
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            rid = request["id"]
        except Exception:  # noqa: BLE001 - not a request
            continue

        def reply(obj: dict, rid=rid) -> None:
            send({**obj, "id": rid})

        try:
            job.handle(state, request, reply)
        except BaseException as e:  # reported to the client; the server goes on
            if isinstance(e, KeyboardInterrupt):
                raise
            reply(error_reply(e))


def zygote(run_server, respawn: bool) -> None:
    """Fork servers (see the module docstring); return the last server's exit code, or end by its signal."""
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
                run_server()
                code = 0
            finally:
                os._exit(code)  # never fall back into the zygote's loop
        _, status = os.waitpid(child, 0)
        child = 0
        if not os.WIFSIGNALED(status):
            return os.WEXITSTATUS(status)  # stdin closed (0), the pipes broke (1), or the job's own exit code
        if not respawn:
            sig = os.WTERMSIG(status)
            try:
                signal.signal(sig, signal.SIG_DFL)  # (SIGKILL's cannot be changed, nor needs to be)
            except (OSError, ValueError):
                pass
            os.kill(os.getpid(), sig)
            return 128 + sig


def main() -> None:
    job_path = sys.argv[1]
    settings = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    isolate_path(settings)
    out = protocol_channel()
    apply_limits(settings)
    job = load_job(job_path)
    context = job.warm(settings) if hasattr(job, "warm") else settings
    sys.exit(zygote(lambda: serve(job, context, out), bool(settings.get("respawn", True))))


if __name__ == "__main__":
    main()

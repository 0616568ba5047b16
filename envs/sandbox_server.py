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
otherwise the path is kept), "memory_bytes" (RLIMIT_AS), "file_bytes" (RLIMIT_FSIZE), "respawn" (default true),
"one_shot" (below).
This file's folder (envs/) is always dropped from the import path, so no module there (envs/reasoning_gym.py) can
shadow a library module.

Protocol, JSON lines (ASCII: strings are \\u-escaped). The server announces itself with {"ready": true, "pid": p};
each request is one object with an "id"; each reply carries that id. Lines that are not such objects are skipped.
Everything a library or user code prints goes to stderr (fd 1 is pointed there): stdout carries the protocol only.

One-shot children ("one_shot" setting: {"uid", "gid", "max_processes"}; the reasoning-gym scorer's policy). The
server sets `job.one_shot`: `one_shot(fn, *args)` runs fn(*args) in a fresh child of the server that reaches nothing
but its own result: every descriptor is closed except a private pipe (0-2 read and write /dev/null), so it cannot
reach the protocol channel; it writes one JSON result there and exits; the server reads it, waits for the child, and
answers with the request's id itself. When the server runs as root and "uid" is set, the child first becomes that
otherwise unused uid/gid (supplementary groups dropped), so it cannot read /proc entries of the server, the zygote or
the trainer, nor signal them; RLIMIT_NPROC ("max_processes") then bounds every process of that uid. Without root
the child keeps the trainer's uid (see `process_bound` for its process limit). Zygote and server are then
subreapers: a descendant whose parent exits comes back to them. After a one-shot call that left a process behind,
and after a server dies (a time-out kills it), everything is swept: every process of the uid (SIGKILL from a process
of that uid: kill(-1) reaches exactly them), then every descendant (re-parented orphans, killed and reaped until
none is left). None is left when the next request is read.

Zygote. The first process never answers requests itself: it forks a server and waits. SIGUSR1 to it kills the
server (SIGKILL: it also stops a C-level computation that no signal handler could; the pid is one the zygote has not
reaped, so never a reused one). When a server dies by a signal and "respawn" is set, a fresh fork (milliseconds,
already warm) announces itself; otherwise, and whenever a server exits, the zygote ends the way its server did
(exit code, or the same signal), so the client sees the server's own exit status. Everything ends when stdin closes.
"""

import gc
import importlib.util
import json
import os
import resource
import signal
import sys
import time
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


# -- one-shot children (see the module docstring)

ONE_SHOT: dict = {}
"""The "one_shot" settings of this worker, with "nproc" (the children's RLIMIT_NPROC, 0 = none) added by main."""
RESULT_BYTES = 1 << 16
"""The most bytes of a one-shot child's result the server reads."""
TRAINER_HEADROOM = 256
"""Without root: processes of the user's own limit that a one-shot child's processes may never take."""
_PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER = 4, 36


def prctl(option: int, value: int) -> bool:
    """Linux prctl(option, value); False where that failed (another system)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children again; False where that failed."""
    return prctl(_PR_SET_CHILD_SUBREAPER, 1)


def user_tasks(uid: int) -> int:
    """Tasks (threads included: what RLIMIT_NPROC counts) of processes whose real uid is `uid`."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                total += int(fields[b"Threads"])
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return total


def process_bound(one_shot: dict) -> int:
    """RLIMIT_NPROC of the one-shot children (0 = none). Under their own uid (root): "max_processes". Under the
    trainer's uid (no root), RLIMIT_NPROC counts all of the user's processes, and only the children get the bound:
    the user's tasks now + "max_processes", and none when that would not leave TRAINER_HEADROOM below the user's
    own soft limit (the trainer's own limit is never changed; a process the user starts later takes from the
    children's share, so their forks may fail, never the trainer's)."""
    wanted = int(one_shot.get("max_processes", 0) or 0)
    if wanted <= 0:
        return 0
    if os.geteuid() == 0:
        return wanted if one_shot.get("uid") is not None else 0  # root itself is not bound by RLIMIT_NPROC
    bound = user_tasks(os.getuid()) + wanted
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    return bound if soft == resource.RLIM_INFINITY or bound + TRAINER_HEADROOM <= soft else 0


def children_of(parent: int) -> list[int]:
    """Pids whose parent is `parent` (read from /proc/<pid>/stat)."""
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
                if int(stat[stat.rindex(b")") + 2:].split()[1]) == parent:
                    kids.append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return kids


def reap_descendants() -> None:
    """Kill and reap every child of this process until none is left (a subreaper: the orphans of a killed one come
    back to it, so its whole tree goes, setsid or not)."""
    me = os.getpid()
    while True:
        kids = children_of(me)
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            pid, _ = os.waitpid(-1, 0 if kids else os.WNOHANG)
        except ChildProcessError:
            return  # none left
        if not kids and not pid:
            time.sleep(0.001)  # a child not listed yet (being re-parented)


def kill_user(uid: int, gid: int) -> None:
    """SIGKILL to every process of `uid`: sent from a fresh child that becomes that uid, where kill(-1) reaches
    exactly the processes of that uid (never root's), repeated until none is left (root only)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            for _ in range(1000):
                os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            code = 0  # no process of the uid is left
        finally:
            os._exit(code)
    os.waitpid(pid, 0)


def sweep() -> None:
    """End everything a one-shot child left: every process of the sandbox's uid, then every descendant."""
    uid = ONE_SHOT.get("uid")
    if uid is not None and os.geteuid() == 0:
        kill_user(int(uid), int(ONE_SHOT.get("gid", uid)))
    reap_descendants()


def enter_child(keep: int) -> None:
    """A one-shot child's setup: descriptor `keep` its only open one besides 0-2 (/dev/null), default signal
    handlers, the sandbox's uid and gid without supplementary groups (as root, when set), RLIMIT_NPROC."""
    for sig in (signal.SIGUSR1, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, keep)
    os.closerange(keep + 1, max(keep + 2, os.sysconf("SC_OPEN_MAX")))
    uid = ONE_SHOT.get("uid")
    if uid is not None and os.geteuid() == 0:
        gid = int(ONE_SHOT.get("gid", uid))
        os.setgroups([])
        os.setgid(gid)
        os.setuid(int(uid))
        if os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3 or os.getgroups():
            raise OSError(f"could not become uid {uid}")
    if ONE_SHOT.get("nproc", 0) > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (ONE_SHOT["nproc"], ONE_SHOT["nproc"]))


def _write_result(fd: int, obj) -> None:
    data = (json.dumps(obj, ensure_ascii=True, default=str) + "\n").encode("ascii")
    while data:
        data = data[os.write(fd, data):]


def _run_child(w: int, fn, args) -> None:
    """The one-shot child: set up, run fn, write its result to `w`, exit (never returns)."""
    code = 1
    try:
        gc.disable()  # a short life: a collection would only copy the server's pages
        try:
            enter_child(w)
        except BaseException as e:  # the server reports it
            _write_result(w, {"error": f"sandbox: {type(e).__name__}: {e}"[:500]})
            raise
        _write_result(w, fn(*args))
        code = 0
    finally:
        os._exit(code)


def one_shot(fn, *args) -> dict | None:
    """fn(*args) in a fresh child that reaches nothing but its own result (module docstring): the JSON object of the
    first line it wrote, or None when it wrote none (it died: a signal, RLIMIT_CPU, an exit of its own). Whatever it
    left running is swept before this returns."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _run_child(w, fn, args)
    os.close(w)
    data = b""
    try:
        while b"\n" not in data and len(data) < RESULT_BYTES:  # one line (a process it left may hold the pipe)
            chunk = os.read(r, RESULT_BYTES)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)  # a child still writing gets EPIPE
    os.waitpid(pid, 0)
    left = True  # without a subreaper, nothing tells: sweep
    if ONE_SHOT.get("subreaper"):
        try:
            os.waitpid(-1, os.WNOHANG)  # a process left running (or one just ended) is our child now
        except ChildProcessError:
            left = False  # nothing of the child's is alive
    if left:
        sweep()
    try:
        result = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        return None
    return result if isinstance(result, dict) else None


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


def wait_server(pid: int) -> int:
    """The wait status of the server `pid`. With one-shot children: orphans that come back meanwhile are reaped, and
    once the server has ended everything it left is swept."""
    if not ONE_SHOT:
        return os.waitpid(pid, 0)[1]
    while True:
        got, status = os.waitpid(-1, 0)
        if got == pid:
            sweep()
            return status


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
                if ONE_SHOT:
                    ONE_SHOT["subreaper"] = become_subreaper()
                run_server()
                code = 0
            finally:
                os._exit(code)  # never fall back into the zygote's loop
        status = wait_server(child)
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
    if settings.get("one_shot"):
        ONE_SHOT.update(settings["one_shot"], nproc=process_bound(settings["one_shot"]))
        ONE_SHOT["subreaper"] = become_subreaper()
        prctl(_PR_SET_DUMPABLE, 0)  # (inherited by forks) /proc/<pid>/fd and ptrace closed to a child of our uid
    job = load_job(job_path)
    job.one_shot = one_shot
    context = job.warm(settings) if hasattr(job, "warm") else settings
    sys.exit(zygote(lambda: serve(job, context, out), bool(settings.get("respawn", True))))


if __name__ == "__main__":
    main()

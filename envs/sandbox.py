"""The one client of objbench's worker processes: starts envs/sandbox_server.py with a caller's job and policy,
sends requests, bounds every wait, and kills and replaces (or stops) the worker.

    client = SandboxClient(lambda: SandboxSpec(job=JOB_PATH, settings={"memory_bytes": 2 << 30}, name="my worker"))
    reply = client.request({"pred": "1/2", "gold": "0.5"}, timeouts=(1.0,))   # SandboxTimeout, SandboxError

Callers and their policies (each in its own module): math-verify (envs/mathcheck.py: inherited environment,
RLIMIT_AS, output discarded), reasoning-gym's scorers (envs/rg_scorer.py: scrubbed environment, an empty temporary
folder, RLIMIT_AS and RLIMIT_FSIZE, output to worker.log there; each score in a one-shot child, under an unused uid
when root), reward functions (envs/reward_fns.py: the user's
environment and folder, output to the terminal, and any failure stops the worker). The spec is read again at each
start (a test may point a caller at another job file).

Two policies for failures (`SandboxSpec.replace`):
- replace (the scorers): the worker starts on first use (or early with `start()`), again after it died; a request
  past its bound has its server killed (SIGUSR1 to the zygote), and the warm zygote forks a replacement that the
  next request waits for; a server that died on its own (memory or CPU bound, a crash) is replaced the same way.
- stop (reward functions): one worker for the client's life; a time-out or any failure stops it, and later
  requests raise SandboxError.

Every request carries an id; a late reply of a killed server (an older id) is skipped. A reply with "phase" (an
interim line) starts the next of the request's `timeouts`. Requests from several threads take turns (a lock). In a
forked copy of the host process the worker is not ours: `after_fork_in_child` drops our copies of its pipes, and
stop() then kills nothing. POSIX only (fork, select on pipes).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

from .pipes import read_line

SERVER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_server.py")
"""The server loop every worker runs (started by path)."""


class SandboxTimeout(Exception):
    """No reply within the bound (the server was killed: replaced, or the worker stopped, by the policy), or the
    server died mid-request and was replaced."""


class SandboxError(Exception):
    """The worker failed (it did not start, exited, broke a pipe, or sent an error instead of announcing itself);
    it has been stopped. `exit_code`: its exit status when known; `reply`: the error line it sent at start."""

    def __init__(self, message: str, exit_code: int | None = None, reply: dict | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.reply = reply


@dataclass(frozen=True)
class SandboxSpec:
    """One caller's worker: which job runs, and the policy it runs under."""

    job: str
    """Path of the per-job module the server loads (see envs/sandbox_server.py)."""
    settings: dict = field(default_factory=dict)
    """JSON settings for the server ("sys_path", "memory_bytes", "file_bytes") and the job."""
    name: str = "worker"
    """What messages call it ("math-verify worker")."""
    python_flags: tuple[str, ...] = ()
    """Interpreter flags before the server's path (e.g. ("-s", "-B"))."""
    folder: str = ""
    """Prefix of a fresh temporary folder the worker runs in (removed by stop()); "" = the current folder."""
    folder_owner: tuple[int, int] | None = None
    """(uid, gid) the folder is given at each start (a sandbox user that must write there); None = this process's."""
    env: Callable[[str | None], dict] | None = None
    """The worker's whole environment, from its folder; None = this process's."""
    output: str = "discard"
    """Where the worker's stdout and stderr go: "discard", "log" (worker.log in its folder) or "inherit"."""
    replace: bool = True
    """The failure policy: replace the server (True) or stop the worker (False); see the module docstring."""
    start_warning: str = ""
    """When set, a request that finds the worker unable to start warns once: what that means for the caller."""
    startup_timeout_s: float = 120.0
    """Seconds a request or open() waits for a starting worker."""


class SandboxClient:
    """One worker process of this process, started from `spec()` (read at each start). See the module docstring."""

    def __init__(self, spec: Callable[[], SandboxSpec]) -> None:
        self._spec_of = spec
        self.spec: SandboxSpec | None = None
        """The spec of the last start."""
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = os.getpid()
        self._ready = False
        self._launched = False
        self._warned = False
        self._buf = b""
        self._next_id = 0
        self._started_at = 0.0
        self.workdir: str | None = None
        """The worker's folder when its spec asks for one (removed by stop())."""
        self.restarts = 0
        """Servers killed after a time-out, or replaced after they died or failed (tests, diagnostics)."""
        self.startup_s: float | None = None
        """Seconds from the first start to the first announcement (measured)."""

    @property
    def running(self) -> bool:
        """Whether the worker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, wait: bool = False) -> bool:
        """Start the worker if it is not running; with `wait`, until it has announced itself. False when that
        failed (the worker is then stopped)."""
        try:
            if wait:
                self.open()
            else:
                with self._lock:
                    self._ensure_started()
            return True
        except Exception:  # noqa: BLE001 - the next request reports it
            with self._lock:
                self._kill()
            return False

    def open(self) -> None:
        """Start the worker and wait for its announcement (spec.startup_timeout_s): SandboxTimeout when it does not
        come, SandboxError when the worker fails (it is then stopped)."""
        with self._lock:
            try:
                self._ensure_started()
                self._wait_ready(time.monotonic() + self.spec.startup_timeout_s)
            except TimeoutError as e:
                self._kill()
                raise SandboxTimeout(str(e)) from None
            except Exception as e:  # noqa: BLE001 - an exit, a broken pipe, an error line
                raise self._failed(e) from None

    def request(self, payload: dict, timeouts: tuple[float, ...]) -> dict:
        """Send one request (the worker starts first when needed), return the reply with its id. `timeouts`: the
        bound of the first reply, then one per interim {"phase": ...} reply. SandboxTimeout past a bound (or when
        the server died mid-request), SandboxError when the worker failed."""
        with self._lock:
            try:
                self._ensure_started()
                self._wait_ready(time.monotonic() + self.spec.startup_timeout_s)
                self._next_id += 1
                rid = self._next_id
                self._send({**payload, "id": rid}, time.monotonic() + timeouts[0])
                return self._reply(rid, timeouts)
            except SandboxTimeout:
                raise
            except Exception as e:  # noqa: BLE001 - the zygote died or never started, a pipe broke: start over
                self.restarts += 1
                if not self._ready:
                    self._warn_failed_start(e)
                raise self._failed(e) from None

    def stop(self) -> None:
        """Stop the worker and remove its folder (a replace-policy worker starts again on the next request)."""
        with self._lock:
            self._kill()
            if self.workdir and os.getpid() == self._owner:
                shutil.rmtree(self.workdir, ignore_errors=True)
                self.workdir = None

    def after_fork_in_child(self) -> None:
        """In a forked copy of this process the worker is not ours: drop our copies of its pipes (so it still sees
        EOF when its owner closes them) and of a lock another thread may have held."""
        self._lock = threading.Lock()
        proc, self._proc, self._owner, self._ready, self._buf = self._proc, None, os.getpid(), False, b""
        self.workdir = None
        for stream in (proc.stdin, proc.stdout) if proc is not None else ():
            try:
                stream.close()
            except Exception:  # noqa: BLE001
                pass

    # -- internals (called with the lock held)

    def _ensure_started(self) -> None:
        if self.running:
            return
        spec = self._spec_of()
        if self._launched and not spec.replace:
            raise SandboxError(f"the {spec.name} is not running")
        self._kill()
        self.spec, self._launched = spec, True
        if spec.folder and not (self.workdir and os.path.isdir(self.workdir)):
            self.workdir = tempfile.mkdtemp(prefix=spec.folder)
        if spec.folder and spec.folder_owner is not None:
            os.chown(self.workdir, *spec.folder_owner)
        settings = {**spec.settings, "respawn": spec.replace}
        out = self._output(spec)
        self._started_at = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, *spec.python_flags, SERVER_PATH, spec.job, json.dumps(settings)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=out,
                cwd=self.workdir if spec.folder else None,
                env=spec.env(self.workdir) if spec.env is not None else None,
                bufsize=0,
                close_fds=True,
                start_new_session=True,  # Ctrl-C in a terminal goes to the training process, not the worker
            )
        finally:
            if isinstance(out, int) and out >= 0:
                os.close(out)
        os.set_blocking(self._proc.stdin.fileno(), False)  # writes are bounded by a deadline (select)

    def _output(self, spec: SandboxSpec):
        """The worker's stderr: DEVNULL, None (inherited) or a descriptor of workdir/worker.log (new at each start)."""
        if spec.output == "inherit":
            return None
        if spec.output == "log" and self.workdir:
            with open(os.path.join(self.workdir, "worker.log"), "wb") as f:
                return os.dup(f.fileno())
        return subprocess.DEVNULL

    def _failed(self, error: Exception) -> SandboxError:
        """Stop the worker after `error`; the SandboxError to raise (with the exit status when it exited)."""
        if isinstance(error, EOFError) and self._proc is not None:
            try:
                self._proc.wait(timeout=5)  # it closed its pipe: it is exiting
            except Exception:  # noqa: BLE001
                pass
        code = self._kill()
        reply = error.reply if isinstance(error, SandboxError) else None
        return SandboxError(f"{type(error).__name__}: {error}", exit_code=code, reply=reply)

    def _warn_failed_start(self, error: Exception) -> None:
        spec = self.spec
        if spec is None or not spec.start_warning or self._warned:
            return
        self._warned = True
        tail = ""
        if spec.output == "log" and self.workdir:
            try:
                with open(os.path.join(self.workdir, "worker.log"), "rb") as f:
                    tail = f.read()[-600:].decode("utf-8", "replace").strip()
            except OSError:
                pass
        warnings.warn(f"the {spec.name} did not start ({type(error).__name__}: {error}); {spec.start_warning}. "
                      f"Its last output: {tail or '(none)'}", stacklevel=5)

    def _kill(self) -> int | None:
        """End the worker; its exit status (None when it was not ours or did not end)."""
        proc, self._proc, self._ready, self._buf = self._proc, None, False, b""
        if proc is None or os.getpid() != self._owner:
            return None
        try:
            proc.stdin.close()  # EOF: an idle server exits, and the zygote with it
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGUSR1)  # a busy server is killed; a replacement reads the EOF and exits
        except Exception:  # noqa: BLE001
            pass
        try:
            proc.stdout.close()
        except Exception:  # noqa: BLE001
            pass
        try:
            return proc.wait(timeout=2)
        except Exception:  # noqa: BLE001 - not ending: kill its whole session (zygote and server)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # not reaped yet, so the group is still the worker's
            except Exception:  # noqa: BLE001
                proc.kill()
            try:
                return proc.wait(timeout=5)
            except Exception:  # noqa: BLE001
                return None

    def _time_out(self) -> None:
        """A request ran past its bound: kill the server (the zygote forks a warm replacement) or stop the worker."""
        if not self.spec.replace:
            self._kill()
            return
        self.restarts += 1
        self._ready = False
        try:
            os.kill(self._proc.pid, signal.SIGUSR1)
        except Exception:  # noqa: BLE001
            self._kill()

    def _wait_ready(self, deadline: float) -> None:
        while not self._ready:
            line = self._readline(deadline)
            if line is None:
                raise TimeoutError(f"the {self.spec.name} did not start")
            reply = json.loads(line)
            if reply.get("ready"):
                self._ready = True
                if self.startup_s is None:
                    self.startup_s = time.monotonic() - self._started_at
            elif "error" in reply:
                raise SandboxError(f"the {self.spec.name} could not start: {reply['error']}", reply=reply)

    def _send(self, obj: dict, deadline: float) -> None:
        data = (json.dumps(obj, ensure_ascii=True, default=str) + "\n").encode("ascii")
        fd = self._proc.stdin.fileno()
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                raise TimeoutError(f"the {self.spec.name} does not read its requests")
            data = data[os.write(fd, data):]

    def _reply(self, rid: int, timeouts: tuple[float, ...]) -> dict:
        bounds = list(timeouts)
        deadline = time.monotonic() + bounds.pop(0)
        while True:
            line = self._readline(deadline)
            if line is None:
                self._time_out()
                raise SandboxTimeout(f"the {self.spec.name} did not answer in time")
            reply = json.loads(line)
            if reply.get("ready"):  # the server died (memory or CPU bound, a crash) and was replaced
                self.restarts += 1
                self._ready = True
                raise SandboxTimeout(f"the {self.spec.name}'s server died and was replaced")
            if reply.get("id") != rid:  # a late reply of a killed server (an older id)
                continue
            if "phase" in reply and bounds:
                deadline = time.monotonic() + bounds.pop(0)
                continue
            return reply

    def _readline(self, deadline: float) -> bytes | None:
        """One line from the worker, or None at the deadline. Raises EOFError when the worker has exited."""
        line, self._buf = read_line(self._proc.stdout.fileno(), self._buf, deadline, f"the {self.spec.name} exited")
        return line


def shared_client(spec: Callable[[], SandboxSpec]) -> SandboxClient:
    """A client for the whole process: stopped at exit, and dropped (not killed) in a forked child."""
    client = SandboxClient(spec)
    atexit.register(client.stop)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=client.after_fork_in_child)
    return client

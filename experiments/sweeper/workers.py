"""Local worker processes for sweeps: a failing job fails alone, and workers die with the sweep.

``run_jobs(jobs, envs)`` runs picklable ``fn(*args)`` jobs in at most ``len(envs)`` spawned worker processes,
worker slot i with the environment ``envs[i]`` added (its CUDA_VISIBLE_DEVICES). Unlike a
``concurrent.futures.ProcessPoolExecutor``, where one worker that dies (``os._exit``, a segfault, the OOM killer)
breaks every pending future, a job whose worker dies fails alone: the worker is replaced and the queue goes on.

A worker ends when the process that started it ends, however it ends: on Linux it asks the kernel for SIGTERM on
its parent's death (prctl PR_SET_PDEATHSIG), checks right after that the parent is still there, and a watchdog
thread checks every 2 s (other systems; a run that catches SIGTERM). So ``kill -9`` of a sweep leaves no worker
training on with nobody to collect it. Killing the whole process group (``kill -- -PGID``; Ctrl-C in a terminal
does this) stops everything at once as well.

This module imports nothing heavy (no torch), so starting a worker costs an interpreter; a job's own imports
happen when it is unpickled, once per worker.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing import connection, get_context
from typing import Callable

from objbench.experiments.config.errors import one_line

__all__ = ["Job", "Outcome", "run_jobs"]


@dataclass
class Job:
    name: str
    fn: Callable
    args: tuple
    after: str | None = None
    """name of a job that must succeed first (a run waits for its warm start); if it fails, so does this one"""


@dataclass
class Outcome:
    job: Job
    ok: bool
    value: object = None
    error: str = ""   # one line
    detail: str = ""  # traceback, or how the worker ended
    seconds: float = 0.0






def _exit_reason(code: int | None) -> str:
    if code is None:
        return "worker stopped answering"
    if code < 0:
        sig = signal.Signals(-code)
        hint = " (out of memory? see `dmesg`)" if sig == signal.SIGKILL else ""
        return f"worker killed by {sig.name}{hint}"
    return f"worker exited with code {code}"


def _die_with_parent(parent_pid: int):
    """End this worker when the sweep process ends, however it ends (kill -9 included)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still ends it
    if os.getppid() != parent_pid:  # the parent died before the kernel was asked
        os._exit(1)

    def watch():  # also covers other systems, and a SIGTERM that something in the run catches
        while True:
            time.sleep(2)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="objbench-parent-watch", daemon=True).start()


def _worker_main(conn, parent_pid: int, env: dict):
    _die_with_parent(parent_pid)
    os.environ.update(env)  # before anything initialises CUDA
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if task is None:
            return
        fn, args = task
        try:
            reply = ("ok", fn(*args))
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which replaces this worker
            reply = ("error", one_line(e), traceback.format_exc()[-20000:])
        try:
            conn.send(reply)
        except (OSError, ValueError):  # the parent is gone
            return
        except Exception as e:  # noqa: BLE001 - a result that does not pickle
            reply = ("error", f"result of the job could not be sent back: {one_line(e)}", "")
            conn.send(reply)
        if reply[0] == "error":
            return


@dataclass
class _Worker:
    proc: object
    conn: object
    slot: int
    job: Job | None = None
    t0: float = 0.0

    def stop(self, timeout: float = 10.0):
        if self.job is None and self.proc.is_alive():
            try:
                self.conn.send(None)
            except (OSError, ValueError):
                pass
            self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def run_jobs(jobs: list[Job], envs: list[dict], *, on_start: Callable | None = None,
             on_end: Callable | None = None) -> list[Outcome]:
    """Run ``jobs`` in at most ``len(envs)`` spawned worker processes; worker slot i runs with environment
    ``envs[i]`` added (its GPUs). Jobs start in list order once their ``after`` job succeeded. A job that raises,
    or whose worker dies, fails alone: its worker is replaced and the other jobs go on. Returns every outcome
    (in completion order); ``on_start(job)`` / ``on_end(outcome)`` are called as they happen.
    """
    return _Pool(jobs, envs, on_start, on_end).run()


class _Pool:
    """One run_jobs call. Jobs are ready (to start, in order) or waiting (for their ``after`` job); worker slots
    are free (no process), idle (a process without a job) or busy."""

    def __init__(self, jobs: list[Job], envs: list[dict], on_start: Callable | None, on_end: Callable | None):
        self.ctx = get_context("spawn")  # fresh interpreters: no torch thread pools or RNG state shared with the parent
        self.envs, self.on_start, self.on_end = envs, on_start, on_end
        self.ready = [j for j in jobs if j.after is None]
        self.waiting = [j for j in jobs if j.after is not None]
        self.free: list[int] = list(range(len(envs)))
        self.idle: list[_Worker] = []
        self.busy: list[_Worker] = []
        self.outcomes: list[Outcome] = []

    def run(self) -> list[Outcome]:
        try:
            while self.ready or self.busy:
                self._start_ready()
                if not self.busy:
                    break
                self._wait()
            while self.waiting:  # an `after` that names no job: a programming error, reported rather than hung
                d = self.waiting.pop(0)
                self._finish(Outcome(d, False, error=f"waits for an unknown job {d.after!r}"))
        finally:  # idle workers are asked to exit, busy ones (Ctrl-C, an error here) are terminated
            for w in self.idle + self.busy:
                w.stop(10)
        return self.outcomes

    def _spawn(self, slot: int) -> _Worker:
        parent_end, child_end = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker_main, args=(child_end, os.getpid(), self.envs[slot]),
                                name=f"objbench-worker-{slot}")
        proc.start()
        child_end.close()
        return _Worker(proc, parent_end, slot)

    def _start_ready(self):
        """Hand the ready jobs, in order, to idle workers, then to new workers in free slots."""
        while self.ready and (self.idle or self.free):
            w = self.idle.pop(0) if self.idle else self._spawn(self.free.pop(0))
            job = self.ready[0]
            try:
                w.conn.send((job.fn, job.args))
            except (OSError, ValueError):  # an idle worker died: replace it, retry the job
                w.stop(1)
                self.free.append(w.slot)
                continue
            self.ready.pop(0)
            w.job, w.t0 = job, time.time()
            self.busy.append(w)
            if self.on_start:
                self.on_start(job)

    def _wait(self):
        """Wait until busy workers answer or die, and end their jobs."""
        handles = {w.conn: w for w in self.busy} | {w.proc.sentinel: w for w in self.busy}
        for h in connection.wait(list(handles)):
            w = handles[h]
            if w not in self.busy:
                continue  # both of its handles fired
            self.busy.remove(w)
            self._end_job(w)

    def _end_job(self, w: _Worker):
        """The outcome of ``w``'s job: its reply, or how the worker ended. A worker whose job failed is stopped."""
        msg = None
        try:
            if w.conn.poll():
                msg = w.conn.recv()
        except (EOFError, OSError):
            pass
        job, secs = w.job, time.time() - w.t0
        w.job = None
        if msg is not None and msg[0] == "ok":
            self.idle.append(w)
            self._finish(Outcome(job, True, msg[1], seconds=secs))
            return
        if msg is not None:
            error, detail = msg[1], msg[2]
        else:
            w.proc.join(10)
            error = detail = _exit_reason(w.proc.exitcode)
        w.stop(10)  # a failed job may leave its process in a bad state (CUDA errors): a fresh one next
        self.free.append(w.slot)
        self._finish(Outcome(job, False, error=error, detail=detail, seconds=secs))

    def _finish(self, out: Outcome):
        """Record an outcome; the jobs waiting for it become ready, or fail too."""
        self.outcomes.append(out)
        if self.on_end:
            self.on_end(out)
        for d in [d for d in self.waiting if d.after == out.job.name]:
            self.waiting.remove(d)
            if out.ok:
                self.ready.append(d)
            else:
                self._finish(Outcome(d, False, error=f"its {out.job.name} failed: {out.error}", detail=out.detail))

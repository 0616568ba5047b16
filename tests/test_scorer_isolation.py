"""What an answer evaluated by an opted-in reasoning-gym scorer (task.allow_unsafe_scorer=true) can reach: nothing
but its own score. Each attack is the text a model could write, evaluated by spiral_matrix's scorer (eval(answer));
`exec("...")` lets that expression run statements. Root and Linux only (the scorer's children then run under an
unused uid of their own); without root they run as the user, which the docs say is not isolated. ~15 s on 2 cores."""

import json
import os
import sys
import threading
import time

import pytest

from objbench.envs import make_task, rg_scorer
from objbench.envs import reasoning_gym as R

pytest.importorskip("reasoning_gym")
pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the scorer's sandbox reads and sweeps Linux's /proc"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the scorer's children get a uid of their own only when the trainer "
                                                  "runs as root; as a user they run under the user's uid"),
]

SECRET = "objbench-secret-4f1d9c"
TIMEOUT_S = 1.0

ANCESTORS = (  # the scorer's ancestors, from /proc/<pid>/stat (readable by every uid): server, zygote, trainer, ...
    "def ppid(p):\n"
    "    s = open(f'/proc/{p}/stat').read()\n"
    "    return int(s[s.rindex(')') + 2:].split()[1])\n"
    "chain, p = [], os.getpid()\n"
    "while p > 1:\n"
    "    p = ppid(p)\n"
    "    chain.append(p)\n"
)


def _answer(code: str) -> str:
    """An answer spiral_matrix's scorer evaluates: exec of `code` in fresh globals (one line of text)."""
    return f"exec({code!r}, {{}})"


def _processes_of(uid: int) -> list[int]:
    """Pids whose real uid is `uid`."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    line = next(ln for ln in f if ln.startswith("Uid:"))
                if int(line.split()[1]) == uid:
                    out.append(int(name))
            except (OSError, StopIteration, ValueError):
                continue
    return out


def _none_left(uid: int, within_s: float = 30.0) -> list[int]:
    """The processes of `uid` still alive after polling up to `within_s` ([] as soon as none is)."""
    deadline = time.monotonic() + within_s
    while (left := _processes_of(uid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture(scope="module")
def task():
    R.stop_worker()  # a fresh worker of this process (its uid is drawn at start)
    t = make_task("reasoning_gym", dataset="spiral_matrix", eval_size=5, answer_format="full",
                  allow_unsafe_scorer=True, scorer_timeout_s=TIMEOUT_S)
    p = t.problem_at(0, 0)
    assert t.unsafe_scorer and t.reward(p, p.answer).correct  # the worker runs and has built the data set
    yield t
    R.stop_worker()


def _harmless(task, n: int, tag: str) -> list:
    """Rewards of n wrong answers never seen before (their true score is 0), then of the right answer (uncached:
    another problem)."""
    p = task.problem_at(0, 0)
    out = [task.reward(p, f"1 2 {tag} {i}") for i in range(n)]
    q = task.problem_at(0, 1)
    return out + [task.reward(q, q.answer)]


def test_a_scoring_child_runs_as_an_unused_uid_with_only_its_pipe(task):
    uid = rg_scorer.sandbox_uid()
    assert uid is not None and uid not in (0, os.getuid())
    child = R.probe_worker()["child"]
    assert child["uid"] == [uid] * 3 and child["gid"] == [uid] * 3 and child["groups"] == []
    assert child["limits"]["RLIMIT_NPROC"] == [rg_scorer.WORKER_PROCESSES] * 2
    assert child["limits"]["RLIMIT_AS"][0] == R.WORKER_MEMORY_BYTES
    assert child["limits"]["RLIMIT_FSIZE"][0] == R.WORKER_FILE_BYTES
    assert len(child["fds"]) == 5  # 0-2 (/dev/null), the result pipe, and the listing's own descriptor
    assert os.stat(R.worker_stats()["workdir"]).st_uid == uid  # its folder is writable by it


def test_forged_replies_for_later_requests_do_not_count(task):
    forge = (
        "import os, json\n" + ANCESTORS +
        "lines = b''.join(json.dumps({'id': i, 'score': 1.0}).encode() + b'\\n' for i in range(1, 2000))\n"
        "for fd in range(1024):\n"
        "    try: os.write(fd, lines)\n"
        "    except OSError: pass\n"
        "for pid in chain:\n"
        "    for n in range(64):\n"
        "        try: os.write(os.open(f'/proc/{pid}/fd/{n}', os.O_WRONLY | os.O_NONBLOCK), lines)\n"
        "        except OSError: pass\n"
    )
    p = task.problem_at(0, 0)
    task.reward(p, _answer(forge))  # its own score is its own business
    later = _harmless(task, 5, "forged")
    assert [(r.reward, r.correct) for r in later[:5]] == [(0.0, False)] * 5, later
    assert later[5].correct  # and a right answer is still right


def test_the_trainers_environment_is_out_of_reach(task, monkeypatch):
    monkeypatch.setenv("OBJBENCH_SECRET", SECRET)  # the trainer's environment (the worker starts again below)
    R.stop_worker()
    leak = (
        "import os, json\n" + ANCESTORS +
        "seen = {'chain': chain, 'environ': [], 'cmdline': [], 'data': repr(dict(os.environ))}\n"
        "for pid in [int(n) for n in os.listdir('/proc') if n.isdigit()]:\n"
        "    for part in ('environ', 'cmdline'):\n"
        "        try: seen['data'] += open(f'/proc/{pid}/{part}', 'rb').read().decode('latin-1')\n"
        "        except OSError: continue\n"
        "        seen[part].append(pid)\n"
        "open('LEAK', 'w').write(json.dumps(seen))\n"
    )
    p = task.problem_at(0, 0)
    assert task.reward(p, _answer(leak)).reason == "wrong"
    with open(os.path.join(R.worker_stats()["workdir"], "LEAK")) as f:
        seen = json.load(f)
    server, zygote, trainer = seen["chain"][:3]
    assert trainer == os.getpid()  # the answer found the trainer
    assert SECRET not in seen["data"] and "OBJBENCH_SECRET" not in seen["data"]
    assert not {server, zygote, trainer} & set(seen["environ"])  # no ancestor's environment could be read
    # /proc/<pid>/cmdline is readable by every uid on Linux (unless /proc is mounted with hidepid): a command line
    # is no place for a secret (the docs say so); the one here holds none, and the environments it read are its own.
    with open(f"/proc/{trainer}/cmdline") as f:
        assert trainer in seen["cmdline"] and SECRET not in f.read()
    assert len(seen["environ"]) <= rg_scorer.WORKER_PROCESSES  # its own processes' only (the root ones refused)


def test_killing_the_trainer_or_the_worker_fails(task):
    kill = (
        "import os, signal, json\n" + ANCESTORS +
        "errors = []\n"
        "for f, target in [(os.kill, pid) for pid in chain[:3]] + [(os.killpg, os.getpgid(chain[2]))]:\n"
        "    try: f(target, signal.SIGKILL); errors.append('sent')\n"
        "    except OSError as e: errors.append(type(e).__name__)\n"
        "open('KILLS', 'w').write(json.dumps([chain[:3], errors]))\n"
    )
    pid, restarts = rg_scorer._WORKER._proc.pid, R.worker_stats()["restarts"]
    p = task.problem_at(0, 0)
    assert task.reward(p, _answer(kill)).reason == "wrong"
    with open(os.path.join(R.worker_stats()["workdir"], "KILLS")) as f:
        chain, errors = json.load(f)
    assert chain[2] == os.getpid() and chain[1] == pid
    assert errors == ["PermissionError"] * 4  # server, zygote, trainer, and the trainer's process group: refused
    assert rg_scorer._WORKER._proc.pid == pid and R.worker_stats()["restarts"] == restarts  # nothing replaced
    assert _harmless(task, 1, "after-kill")[-1].correct


SPAWN = (
    "import os, time\n"
    "for mode in range(3):\n"
    "    if os.fork() == 0:\n"
    "        if mode == 1: os.setsid()\n"
    "        if mode == 2 and os.fork(): os._exit(0)\n"  # a double fork: the grandchild is orphaned
    "        if mode == 2: os.setsid()\n"
    "        time.sleep(600)\n"
    "        os._exit(0)\n"
)


def test_processes_it_starts_die_with_its_call(task):
    uid = rg_scorer.sandbox_uid()
    p = task.problem_at(0, 0)
    assert task.reward(p, _answer(SPAWN)).reason == "wrong"  # it returned at once, leaving three sleepers
    assert _processes_of(uid) == []  # swept before the reply
    start = time.perf_counter()
    r = task.reward(p, _answer(SPAWN + "time.sleep(600)\n"))
    assert (r.reason, r.reward) == ("timeout", 0.0) and time.perf_counter() - start < TIMEOUT_S + 3.0
    assert _none_left(uid) == []
    assert _harmless(task, 1, "after-spawn")[-1].correct


def test_a_fork_bomb_stops_at_the_process_limit(task):
    uid = rg_scorer.sandbox_uid()
    bomb = ("import os, time\n"
            "while True:\n"
            "    try: os.fork()\n"
            "    except OSError: time.sleep(600)\n")
    most, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            most[0] = max(most[0], len(_processes_of(uid)))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        r = task.reward(task.problem_at(0, 0), _answer(bomb))
    finally:
        done.set()
        watcher.join()
    assert (r.reason, r.reward) == ("timeout", 0.0)
    assert 8 <= most[0] <= rg_scorer.WORKER_PROCESSES  # it ran, and stopped at RLIMIT_NPROC
    assert _none_left(uid) == []
    assert os.kill(os.getpid(), 0) is None and _harmless(task, 1, "after-bomb")[-1].correct


def test_signals_of_its_own_uid_reach_only_its_own_processes(task):
    """kill(-1) from the answer (every process it may signal) ends only its own call."""
    p = task.problem_at(0, 0)
    r = task.reward(p, _answer("import os, signal\nos.kill(-1, signal.SIGKILL)\n"))
    assert r.reason in ("wrong", "timeout") and r.reward == 0.0
    assert _harmless(task, 2, "after-kill-all")[-1].correct

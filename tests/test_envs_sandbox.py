"""One worker mechanism: envs/sandbox_server.py is the only server loop (zygote, fork, kill and replace) and
envs/sandbox.py the only client; math-verify, reasoning-gym's scorers and reward functions plug per-job modules into
them. Structural checks on the source, then the client's two failure policies on small jobs written here (each
test starts a bare Python worker, ~0.1 s)."""

import ast
import json
import os
import sys
import time
from pathlib import Path

import pytest

from objbench.envs import mathcheck, reward_fns, rg_scorer, sandbox
from objbench.envs.sandbox import SandboxClient, SandboxError, SandboxSpec, SandboxTimeout

ENVS = Path(sandbox.__file__).resolve().parent
CALLERS = ("mathcheck.py", "rg_scorer.py", "reward_fns.py")
JOBS = ("_job_mathverify.py", "_job_rg_score.py", "_job_reward_fn.py")


def _calls(path: Path) -> set[str]:
    """Dotted names of everything called in a file ("os.fork", "subprocess.Popen", "SandboxClient")."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            parts, f = [], node.func
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name):
                out.add(".".join([f.id, *reversed(parts)]))
    return out


def _uses(path: Path) -> set[str]:
    """Attribute names and bare names used in a file (SIGUSR1, fork, Popen, ...)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.Name):
            out.add(node.id)
    return out


def test_one_server_loop_and_one_client_remain():
    process_words = {"fork", "waitpid", "SIGUSR1", "Popen", "subprocess", "killpg", "register_at_fork"}
    for path in sorted(ENVS.glob("*.py")):
        used = _uses(path) & process_words
        if path.name == "sandbox_server.py":
            assert {"fork", "waitpid", "SIGUSR1"} <= used
        elif path.name == "sandbox.py":
            assert {"Popen", "SIGUSR1"} <= used
        else:  # no other module forks, starts or signals a worker of its own
            assert not used, f"envs/{path.name} uses {sorted(used)}: workers go through envs/sandbox.py"
    for name in CALLERS:  # the three callers build the one client
        assert _calls(ENVS / name) & {"SandboxClient", "shared_client"}, name
    assert isinstance(mathcheck._WORKER.client, SandboxClient) and isinstance(rg_scorer._WORKER, SandboxClient)
    for name, path in (("mathcheck", mathcheck._WORKER_PATH), ("rg_scorer", rg_scorer._WORKER_PATH),
                       ("reward_fns", reward_fns._WORKER_PATH)):
        assert Path(path).name in JOBS, name


@pytest.mark.parametrize("job", JOBS)
def test_job_modules_plug_into_the_loop_and_import_no_objbench(job):
    """A job runs by path in the worker: a `handle`, no relative import, nothing of objbench."""
    tree = ast.parse((ENVS / job).read_text())
    assert "handle" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("objbench"), ast.dump(node)
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("objbench") for a in node.names)


JOB = '''
import os, sys, time

def warm(settings):
    return {"warmed_in": os.getpid()}

def start(context):
    if os.environ.get("SANDBOX_TEST_FAIL_START"):
        raise ValueError("cannot start\\nsecond line")
    return context

def handle(state, request, reply):
    op = request["op"]
    if op == "echo":
        print("noise on stdout must not reach the protocol")
        reply({"echo": request["x"], "pid": os.getpid(), "zygote": state["warmed_in"],
               "objbench": sorted(m for m in sys.modules if m.startswith("objbench")), "path": sys.path})
    elif op == "phased":
        reply({"phase": "built"})
        time.sleep(request["s"])
        reply({"done": True})
    elif op == "sleep":
        time.sleep(request["s"])
        reply({"done": True})
    elif op == "raise":
        raise KeyError("missing")
    elif op == "exit":
        os._exit(request["code"])
    elif op == "kill":
        os.kill(os.getpid(), 9)
    elif op == "one_shot":
        reply(one_shot(leave_a_sleeper) or {"none": True})


def leave_a_sleeper():
    """In a one-shot child: start a process in a session of its own that would sleep for ten minutes."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        time.sleep(600)
        os._exit(0)
    return {"sleeper": pid, "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")), "pid": os.getpid()}
'''


@pytest.fixture
def job(tmp_path) -> str:
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return str(path)


def _client(job: str, **kw) -> SandboxClient:
    return SandboxClient(lambda: SandboxSpec(job=job, name="test worker", startup_timeout_s=30.0, **kw))


def test_replace_policy_kills_a_late_server_and_the_next_request_works(job):
    client = _client(job)
    try:
        first = client.request({"op": "echo", "x": "\ud800 nul\x00"}, (10.0,))
        assert first["echo"] == "\ud800 nul\x00" and first["zygote"] != first["pid"]  # a forked server answers
        assert first["objbench"] == [] and str(ENVS) not in first["path"]  # nothing of objbench; envs/ not on the path
        start = time.monotonic()
        with pytest.raises(SandboxTimeout):
            client.request({"op": "sleep", "s": 30}, (0.3,))
        assert time.monotonic() - start < 2.0 and client.restarts == 1
        again = client.request({"op": "echo", "x": 1}, (10.0,))
        assert again["zygote"] == first["zygote"] and again["pid"] != first["pid"]  # a fresh fork of the same zygote
        assert client.request({"op": "phased", "s": 0.5}, (10.0, 5.0))["done"]
        with pytest.raises(SandboxTimeout):  # the second bound applies after the interim reply
            client.request({"op": "phased", "s": 30}, (10.0, 0.3))
        with pytest.raises(SandboxTimeout):  # a server that dies by a signal is replaced
            client.request({"op": "kill"}, (10.0,))
        assert client.restarts == 3
        error = client.request({"op": "raise"}, (10.0,))
        assert error["error"] == "KeyError: 'missing'" and "Traceback" in error["traceback"]
        assert client.request({"op": "echo", "x": 2}, (10.0,))["echo"] == 2
    finally:
        client.stop()
    assert not client.running


def test_stop_policy_ends_the_worker_and_reports_its_exit(job):
    client = _client(job, replace=False)
    client.open()
    with pytest.raises(SandboxError) as e:
        client.request({"op": "exit", "code": 3}, (10.0,))
    assert e.value.exit_code == 3 and not client.running
    with pytest.raises(SandboxError, match="not running"):  # no restart under this policy
        client.request({"op": "echo", "x": 1}, (10.0,))

    client = _client(job, replace=False)
    client.open()
    with pytest.raises(SandboxError) as e:
        client.request({"op": "kill"}, (10.0,))
    assert e.value.exit_code == -9  # the zygote ends the way its server did

    client = _client(job, replace=False)
    client.open()
    start = time.monotonic()
    with pytest.raises(SandboxTimeout):
        client.request({"op": "sleep", "s": 30}, (0.3,))
    assert not client.running and time.monotonic() - start < 3.0


def test_a_start_error_is_reported_with_its_reply(job, monkeypatch):
    monkeypatch.setenv("SANDBOX_TEST_FAIL_START", "1")
    client = _client(job, replace=False, env=None)
    with pytest.raises(SandboxError) as e:
        client.open()
    assert e.value.reply["error"] == "ValueError: cannot start" and not client.running


def test_scrubbed_folder_policy_and_log(job, tmp_path):
    client = _client(job, folder="objbench-sandbox-test-", env=lambda d: {"PATH": os.defpath, "HOME": d},
                      output="log", python_flags=("-s", "-B"), settings={"sys_path": [p for p in sys.path if p]})
    try:
        reply = client.request({"op": "echo", "x": 0}, (10.0,))
        assert client.workdir and Path(client.workdir, "worker.log").exists()
        assert "noise on stdout" in Path(client.workdir, "worker.log").read_text()
        assert json.dumps(reply)  # a plain JSON reply
    finally:
        workdir = client.workdir
        client.stop()
    assert not os.path.exists(workdir)


@pytest.mark.skipif(sys.platform != "linux", reason="one-shot children sweep through Linux's /proc")
def test_one_shot_children_leave_nothing_behind(job):
    """A job's one_shot(fn): a fresh child with only its result pipe (and 0-2) open, its id attached by the server,
    and a process it left (setsid) killed before the reply; under this process's own uid (uid None)."""
    client = _client(job, settings={"one_shot": {"uid": None, "max_processes": 64}})
    try:
        server = client.request({"op": "echo", "x": 0}, (10.0,))["pid"]
        reply = client.request({"op": "one_shot"}, (10.0,))
        assert reply["pid"] != server and len(reply["fds"]) == 5  # 0-2, the pipe, the listing's own descriptor
        assert not os.path.exists(f"/proc/{reply['sleeper']}")  # killed and reaped before the reply
        assert client.request({"op": "echo", "x": 1}, (10.0,))["pid"] == server  # the server goes on
    finally:
        client.stop()

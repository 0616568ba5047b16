"""The Ray executor against a separately started local Ray cluster (`ray start --head`), as on a real cluster.

The cluster runs from another working directory, with another HOME and without the driver's PYTHONPATH or
OBJBENCH_* variables, so the test sees what a cluster would get wrong: relative output folders, a warm-start
cache that is not passed on, code the workers cannot import. One arm crashes its worker (tests/crash_hook's
sitecustomize installs tests/crash_run.py's callback in every worker: OBJBENCH_TEST_CRASH_AT_STEP travels with
the other OBJBENCH_* variables, the hook folder with PYTHONPATH; reached only by the longer arm); the other must
finish, with a report and the failure listed. Skipped when Ray is not installed (pip install 'objbench[ray]'); takes about 1.5 minutes on 2 cores.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray")

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[1]
TINY = {"sft.steps": 20, "sft.batch_size": 32, "rollout.completions_per_step": 16, "train.eval_size": 6,
        "train.eval_samples": 2, "train.eval_every": 2, "train.checkpoint_every": 2, "objective": "grpo"}


@pytest.fixture
def cluster(tmp_path):
    """(address, working dir, HOME) of a one-node Ray cluster started in its own process group."""
    cwd, home = tmp_path / "cluster", tmp_path / "cluster_home"
    cwd.mkdir()
    home.mkdir()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 characters
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("OBJBENCH_", "RAY_"))}
    env["HOME"] = str(home)
    log = tmp_path / "ray_start.log"
    cmd = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()",
           "start", "--head", "--block", "--port", "0", "--num-cpus", "2", "--include-dashboard=false",
           "--disable-usage-stats", "--temp-dir", temp]
    with open(log, "w") as fh:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, address = time.time() + 180, None
        while time.time() < deadline and p.poll() is None and address is None:
            m = re.search(r"ray start --address='([^']+)'", log.read_text())
            address = m.group(1) if m else None
            time.sleep(0.5)
        assert address, log.read_text()[-3000:]
        yield address, cwd, home
    finally:  # the cluster's processes are all in the process group this fixture started
        for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 5)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.time() + wait
            while time.time() < deadline and p.poll() is None:
                time.sleep(0.2)
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_sweep_on_a_cluster_finishes_the_good_run_and_lists_the_failed_one(tmp_path, cluster):
    address, cluster_cwd, cluster_home = cluster
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "f.yaml").write_text(yaml.safe_dump(
        {"name": "f", "seeds": [0], "set": TINY, "arms": {"good": {"train.steps": 2}, "bad": {"train.steps": 4}}},
        sort_keys=False))
    cache = tmp_path / "cache"
    env = {**os.environ, "RAY_ADDRESS": address, "OBJBENCH_CACHE": str(cache), "OBJBENCH_TEST_CRASH_AT_STEP": "3",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests" / "crash_hook")])}
    cmd = [sys.executable, "-m", "objbench", "sweep", "f.yaml", "--out", "out", "--executor", "ray"]
    p = subprocess.run(cmd, cwd=driver, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("objbench: sweep f: 1 of 2 runs failed (bad__s0"), p.stderr[-3000:]
    assert "finished good__s0" in p.stdout and "FAILED bad__s0: WorkerCrashedError" in p.stdout

    sweep_dir = driver / "out" / "f"  # everything where the driver looks, nothing in the cluster's folder
    assert (sweep_dir / "sweep.json").is_file() and (sweep_dir / "good__s0" / "done").is_file()
    assert (sweep_dir / "report" / "report.md").is_file()
    assert not (cluster_cwd / "out").exists()
    fails = json.loads((sweep_dir / "failures.json").read_text())
    assert [(f["run"], f["last_step"]) for f in fails] == [("bad__s0", 3)]
    assert fails[0]["error"].startswith("WorkerCrashedError")
    # the warm start went to the driver's cache (passed through runtime_env), not to the cluster's HOME
    assert len(list((cache / "sft").glob("*/sft.json"))) == 1
    assert not (cluster_home / ".cache" / "objbench").exists()
    meta = json.loads((sweep_dir / "good__s0" / "meta.json").read_text())
    assert meta["sweep"] == "f" and meta["arm"] == "good"


def test_ray_tasks_load_the_spec_s_plugins_and_reward_functions(tmp_path, cluster):
    """A spec's imports: reach the Ray tasks (the cluster has neither the driver's PYTHONPATH nor its working
    directory): a plug-in surrogate arm trains, with a reward function from a file beside the spec."""
    address, cluster_cwd, _ = cluster
    driver = tmp_path / "driver"
    (driver / "plug").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "gpg_plugin.py", driver / "plug" / "gpg.py")
    (driver / "plug" / "rw.py").write_text("def brevity(prompts, completions, **columns):\n"
                                           "    return [1.0 / (1 + len(c)) for c in completions]\n")
    arms = {"grpo": {}, "gpg": {"objective.ratio.surrogate": "gpg", "objective.options.gpg.scale": 0.5,
                                "reward.fns": [str(driver / "plug" / "rw.py") + ":brevity"]}}
    (driver / "p.yaml").write_text(yaml.safe_dump(
        {"name": "p", "seeds": [0], "imports": ["plug/gpg.py"], "set": {**TINY, "train.steps": 2}, "arms": arms},
        sort_keys=False))
    env = {**os.environ, "RAY_ADDRESS": address, "OBJBENCH_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "objbench", "sweep", "p.yaml", "--out", "out", "--executor", "ray"]
    p = subprocess.run(cmd, cwd=driver, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    sweep_dir = driver / "out" / "p"
    meta = json.loads((sweep_dir / "gpg__s0" / "meta.json").read_text())
    assert [r["spec"] for r in meta["plugins"] if r["kind"] == "file"] == ["plug/gpg.py"]
    rows = [json.loads(line) for line in (sweep_dir / "gpg__s0" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and 0 < rows[0]["reward/brevity"] <= 1
    assert (sweep_dir / "report" / "report.md").is_file() and not (cluster_cwd / "out").exists()

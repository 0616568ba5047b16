"""objbench installs as one package: a non-editable install holds objbench/ and nothing else at the top level,
and from a folder that has its own experiments/ and analysis/, `import objbench.experiments` finds ours while
`import experiments` finds the user's."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):  # a copy: building writes build/ beside the sources
        shutil.copy(ROOT / name, src / name)
    for name in ("objbench", "algos", "envs", "rollout", "experiments", "analysis"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0 and "Could not find a version" in p.stderr + p.stdout:
        pytest.skip("no package index to fetch the build backend from")
    assert p.returncode == 0, p.stderr[-2000:]
    (whl,) = out.glob("objbench-*.whl")
    return whl


def test_the_wheel_installs_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"objbench", "objbench-0.1.0.dist-info"}
    for sub in ("algos", "envs", "rollout", "experiments", "analysis", "integrations", "experiments/studies",
                "analysis/studies"):
        assert f"objbench/{sub}/__init__.py" in names
    assert "objbench/integrations/trl.py" in names
    for init in sorted(p for d in ("algos", "envs", "rollout", "experiments", "analysis") for p in (ROOT / d).rglob(
            "__init__.py")):  # every package of the source tree, nested ones too (pyproject lists them one by one)
        assert f"objbench/{init.relative_to(ROOT).as_posix()}" in names, f"{init.parent} is not in the wheel"
    assert "objbench/experiments/sweeps/quickstart.yaml" in names  # the specs travel with the package
    assert "objbench/experiments/configs/default.yaml" in names
    assert not any(n.startswith(("objbench/studies", "objbench/tests", "objbench/benchmarks")) for n in names)


def test_installed_package_leaves_a_users_experiments_folder_alone(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    user = tmp_path / "research"  # a research repository with folders of its own named like ours
    for name in ("experiments", "analysis"):
        (user / name).mkdir(parents=True)
        (user / name / "__init__.py").write_text(f"WHOSE = 'user {name}'\n")
    code = ("import objbench.experiments.config as c, objbench.algos, experiments, analysis; "
            "print(c.__file__); print(experiments.WHOSE, analysis.WHOSE)")
    p = subprocess.run([sys.executable, "-c", code], cwd=user, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr[-2000:]
    ours, theirs = p.stdout.splitlines()
    assert ours.startswith(str(site)) and theirs == "user experiments user analysis"
    p = subprocess.run([sys.executable, "-c", "import experiments"], cwd=tmp_path, capture_output=True, text=True,
                       env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert p.returncode != 0 and "No module named 'experiments'" in p.stderr

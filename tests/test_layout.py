"""The layout's rules, checked on the source: imports inside objbench point one way (no cycle between modules, lazy
imports included; no package imports a package above it, by the layering docs/architecture.md states), no module
imports another package's private names, no function outside the tests grows past ~80 lines and no module past
~550 (one job per function and per file), and the training loop's file stays a driver (~400 lines)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("algos", "envs", "rollout", "experiments", "analysis")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 560  # "about 550"
MAX_LOOP_LINES = 400

# who may import whom: each package with the packages it may import (besides itself); experiments is split into
# the packages below, one per product, over the config layer. A package not named here imports nothing of ours.
LOWER = {"algos", "envs", "rollout"}
ALLOWED = {
    "algos": set(),
    "envs": set(),
    "rollout": {"algos", "envs"},
    "analysis": {"envs"},  # reads run folders; envs.passk only, the estimator it shares with the loop
    "experiments": set(),
    "experiments.config": LOWER,
    "experiments.run": LOWER | {"experiments.config"},
    "experiments.studies": LOWER | {"experiments.config", "experiments.run", "analysis"},
    "experiments.sweeper": LOWER | {"experiments.config", "experiments.run", "analysis"},
    "experiments.card": LOWER | {"experiments.config", "experiments.run", "experiments.sweeper", "analysis"},
    "experiments.cli": LOWER | {"experiments.config", "experiments.run", "experiments.sweeper", "experiments.card",
                                "experiments.studies", "analysis"},
}


def _sources(*folders):
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


def _module(path: Path) -> str:
    """objbench.<folder>.<module>; a package's __init__ keeps its own name (objbench.analysis.__init__), so an import
    of the package by its name (re-exports) is not an edge of the module graph."""
    return ".".join(("objbench", *path.relative_to(ROOT).with_suffix("").parts))


def _package(module: str) -> str:
    """The package a module belongs to for the layering rule: algos, envs, ..., or experiments.<product>."""
    parts = [p for p in module.split(".")[1:] if p != "__init__"]
    if parts[:1] == ["experiments"] and len(parts) > 2 or (parts[:1] == ["experiments"] and len(parts) == 2
                                                            and (ROOT / "experiments" / parts[1]).is_dir()):
        return ".".join(parts[:2])
    return parts[0] if parts else "objbench"


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every absolute import of objbench code in the file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("objbench"):
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names if a.name.startswith("objbench"))
    return out


def _targets(mod: str, names: list[str], modules: set, packages: bool = True) -> set:
    """The objbench modules an import statement reaches: the module itself, or `from pkg import module`; with
    ``packages``, also a package's __init__ when the package itself is imported."""
    def known(m):
        if not packages:
            return m if m in modules else None
        return m if m in modules else (f"{m}.__init__" if f"{m}.__init__" in modules else None)

    return {known(f"{mod}.{n}") for n in names if known(f"{mod}.{n}")} | ({known(mod)} - {None})


def test_no_import_cycle_between_modules():
    modules = {_module(p): p for p in _sources(*FOLDERS)}
    graph = {name: set().union(*[_targets(m, ns, set(modules), packages=False) for m, ns in _imports(path)]
                                 or [set()]) - {name}
             for name, path in modules.items()}
    state: dict = {}

    def visit(n, path):
        if state.get(n) == "done":
            return
        assert state.get(n) != "open", " -> ".join(path)
        state[n] = "open"
        for d in sorted(graph[n]):
            visit(d, path + [d])
        state[n] = "done"

    for n in sorted(graph):
        visit(n, [n])


def test_each_package_imports_only_the_packages_below_it():
    modules = {_module(p) for p in _sources(*FOLDERS)}
    wrong = []
    for path in _sources(*FOLDERS):
        own = _package(_module(path))
        for mod, names in _imports(path):
            for target in _targets(mod, names, modules) or {mod}:
                pkg = _package(target)
                if pkg != own and pkg not in ALLOWED.get(own, set()):
                    wrong.append(f"{path.relative_to(ROOT)} ({own}) imports {target} ({pkg})")
    assert not wrong, "\n".join(wrong)


def test_the_layering_rule_itself_catches_an_upward_import():
    assert _package("objbench.experiments.run.train") == "experiments.run"
    assert _package("objbench.experiments.config") == "experiments.config"
    assert _package("objbench.analysis.report") == "analysis"
    assert "experiments.sweeper" not in ALLOWED["experiments.run"]  # the loop never imports the sweep runner
    assert "analysis" not in ALLOWED["experiments.run"]  # nor analysis
    assert not ALLOWED["algos"]


def test_no_private_name_is_imported_across_packages():
    for path in _sources(*FOLDERS, "benchmarks"):
        own = _package(_module(path)) if path.relative_to(ROOT).parts[0] in FOLDERS else "benchmarks"
        for mod, names in _imports(path):
            if _package(mod) == own:
                continue
            private = [n for n in names if n.startswith("_")] + [p for p in mod.split(".") if p.startswith("_")]
            assert not private, f"{path.relative_to(ROOT)} imports {private} from {mod}"


def test_no_function_is_longer_than_a_screen():
    long = []
    for path in _sources(*FOLDERS, "benchmarks", "objbench"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


def test_no_module_is_longer_than_about_550_lines():
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in _sources(*FOLDERS, "benchmarks", "objbench")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, long


def test_the_loop_file_is_a_driver():
    n = len((ROOT / "experiments" / "run" / "train.py").read_text().splitlines())
    assert n <= MAX_LOOP_LINES, f"experiments/run/train.py has {n} lines"

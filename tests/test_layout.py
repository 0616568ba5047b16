"""The layout's rules, checked on the source: imports inside objbench point one way (no cycle, lazy imports
included), no module imports another package's private names, and no function outside the tests grows past ~80
lines (one job per function, readable at once)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("algos", "envs", "rollout", "experiments", "analysis", "experiments/studies", "analysis/studies")
MAX_FUNCTION_LINES = 80


def _sources(*folders):
    return sorted(p for f in folders for p in (ROOT / f).glob("*.py"))


def _module(path: Path) -> str:
    return "objbench." + ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every absolute import of objbench code in the file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("objbench"):
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names if a.name.startswith("objbench"))
    return out


def test_no_import_cycle_between_modules():
    modules = {_module(p): p for p in _sources(*PACKAGES)}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for mod, names in _imports(path):
            deps |= {f"{mod}.{n}" for n in names if f"{mod}.{n}" in modules} | ({mod} & set(modules))
        graph[name] = deps - {name}
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


def test_no_private_name_is_imported_across_packages():
    for path in _sources(*PACKAGES, "benchmarks"):
        own = f"objbench.{path.relative_to(ROOT).parts[0]}"
        for mod, names in _imports(path):
            if mod == own or mod.startswith(own + "."):
                continue
            private = [n for n in names if n.startswith("_")] + [p for p in mod.split(".") if p.startswith("_")]
            assert not private, f"{path.relative_to(ROOT)} imports {private} from {mod}"


def test_no_function_is_longer_than_a_screen():
    long = []
    for path in _sources(*PACKAGES, "benchmarks", "objbench"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long

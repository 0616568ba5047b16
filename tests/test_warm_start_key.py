"""The warm start's code fingerprint: any edit to the code changes it, moving code unchanged between the hashed
modules does not, and the hashed modules import objbench code only from each other."""

import ast
import importlib.util
import inspect

from objbench.experiments.run import warmstart
from objbench.experiments.config import build_task, load_config
from objbench.rollout.code_fingerprint import code_fingerprint


def _defined_in(module: str, name: str) -> str:
    """Where `from module import name` takes its code from: the submodule module.name, or the module that defines
    the function or class (a package re-exports names of its modules), or module itself for other values."""
    try:
        if importlib.util.find_spec(f"{module}.{name}") is not None:
            return f"{module}.{name}"
    except ModuleNotFoundError:
        pass
    home = inspect.getmodule(getattr(importlib.import_module(module), name))
    return home.__name__ if home is not None else module

F = '''def f(x):
    """Doubles."""
    return 2 * x  # a comment
'''
G = '''def g(x):
    return x + 1
'''
HEADER = "import math\nfrom objbench.rollout.decode import decode_responses\n"


def _modules(tmp_path, tag, a_src, b_src):
    out = []
    for name, src in (("a", a_src), ("b", b_src)):
        path = tmp_path / f"{tag}_{name}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"{tag}_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out.append(mod)
    return out


def test_moving_a_function_between_hashed_modules_keeps_the_key(tmp_path):
    together = code_fingerprint(*_modules(tmp_path, "t", HEADER + F + G, HEADER))
    moved = code_fingerprint(*_modules(tmp_path, "m", HEADER + F, '"""Module doc."""\n' + G))
    # an import of objbench code moves with the code: it names a place, not code
    imports = ("from objbench.experiments.run.warmstart import warm_start\n",
               "from objbench.rollout.sft import sft_train\n")
    moved_import = code_fingerprint(*_modules(tmp_path, "i", HEADER + imports[0] + F, imports[1] + G))
    assert together == moved == moved_import


def test_any_edit_of_the_code_changes_the_key_and_docs_do_not(tmp_path):
    base = code_fingerprint(*_modules(tmp_path, "b", HEADER + F, G))
    edited = code_fingerprint(*_modules(tmp_path, "e", HEADER + F.replace("2 * x", "3 * x"), G))
    other_lib = code_fingerprint(*_modules(tmp_path, "l", HEADER.replace("math", "cmath") + F, G))
    docs = code_fingerprint(*_modules(tmp_path, "d", HEADER + F.replace("Doubles.", "Twice x.").replace(
        "# a comment", "# another"), G))
    assert len({base, edited, other_lib}) == 3
    assert docs == base


def test_the_hashed_modules_import_objbench_code_only_from_each_other():
    """Code that a hashed module calls lives in a hashed module: moving a function out of the set (where an edit of
    it would no longer retrain the warm start) fails here."""
    hashed = {m.__name__: m for m in warmstart.warm_start_modules(build_task(load_config(None, [])))}
    # settings (their values are in the key), the key's own computation, and an engine a warm start never builds
    # (experiments.config was one module; split by job, its parts are these same settings)
    outside = {"objbench.envs", "objbench.experiments.config", "objbench.experiments.config.errors",
               "objbench.experiments.config.schema", "objbench.experiments.config.checks",
               "objbench.experiments.config.identity", "objbench.rollout.code_fingerprint",
               "objbench.rollout.vllm_engine"}
    for name, module in hashed.items():
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("objbench"):
                for alias in node.names:
                    target = _defined_in(node.module, alias.name)
                    assert target in hashed or target in outside, f"{name} imports {target}"


def test_the_default_key_is_deterministic_and_covers_the_task_module():
    task = build_task(load_config(None, []))
    assert warmstart.warm_start_code(task) == warmstart.warm_start_code(task)
    assert inspect.getmodule(type(task)) in warmstart.warm_start_modules(task)


def test_a_task_that_draws_on_another_tasks_module_hashes_it_too():
    """The scratchpad task makes its problems with the arithmetic task's code: an edit there must retrain its warm
    start. The default task's module list is unchanged by the rule (its only envs import, base, is hashed already)."""
    from objbench.envs import arithmetic, make_task, scratchpad

    mods = warmstart.warm_start_modules(make_task("scratchpad"))
    assert scratchpad in mods and arithmetic in mods
    default = warmstart.warm_start_modules(build_task(load_config(None, [])))
    assert default[-2:] == (arithmetic, warmstart) and len(default) == len(set(default)) == 14

"""The warm start's code fingerprint: any edit to the code changes it, moving code unchanged between the hashed
modules does not, and the warm-start file imports objbench code only from the modules it hashes."""

import ast
import importlib.util
import inspect

from objbench.experiments import warmstart
from objbench.experiments.config import build_task, load_config
from objbench.rollout.code_fingerprint import code_fingerprint

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
    # the import of objbench code moves with it: an import of objbench code names a place, not code
    moved_import = code_fingerprint(*_modules(tmp_path, "i", HEADER + "from objbench.experiments.warmstart import warm_start\n" + F,
                                              "from objbench.rollout.sft import sft_train\n" + G))
    assert together == moved == moved_import


def test_any_edit_of_the_code_changes_the_key_and_docs_do_not(tmp_path):
    base = code_fingerprint(*_modules(tmp_path, "b", HEADER + F, G))
    edited = code_fingerprint(*_modules(tmp_path, "e", HEADER + F.replace("2 * x", "3 * x"), G))
    other_lib = code_fingerprint(*_modules(tmp_path, "l", HEADER.replace("math", "cmath") + F, G))
    docs = code_fingerprint(*_modules(tmp_path, "d", HEADER + F.replace("Doubles.", "Twice x.").replace(
        "# a comment", "# another"), G))
    assert len({base, edited, other_lib}) == 3
    assert docs == base


def test_the_warm_start_file_imports_objbench_code_only_from_hashed_modules():
    cfg = load_config(None, [])
    hashed = {m.__name__ for m in warmstart.warm_start_modules(build_task(cfg))}
    # settings and the key's own computation: no code of theirs runs in the warm start
    data_only = {"objbench.envs", "objbench.experiments.config", "objbench.experiments.errors",
                 "objbench.rollout.code_fingerprint"}
    for node in ast.walk(ast.parse(inspect.getsource(warmstart))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("objbench"):
            for alias in node.names:  # `from objbench.x import y`: module x, or submodule x.y
                name = f"{node.module}.{alias.name}"
                assert name in hashed or node.module in hashed | data_only, name


def test_the_default_key_is_deterministic_and_covers_the_task_module():
    task = build_task(load_config(None, []))
    assert warmstart.warm_start_code(task) == warmstart.warm_start_code(task)
    assert inspect.getmodule(type(task)) in warmstart.warm_start_modules(task)

"""A fingerprint of the code in a set of modules that does not depend on which file of the set holds which
function: a warm start's cache key covers the code that builds it, so an edit to that code can never reuse a stale
start (no hand-bumped version number to forget), while moving code unchanged between the files does not retrain.

The modules are cut into units, one per top-level statement (a function, a class, an assignment, ...), each
written as its syntax tree (``ast.dump``: comments, blank lines, line numbers and docstrings left out). Imports of
objbench's own modules are left out too: they name where code lives, not what it does (the code itself is
hashed where it is in the set), and each other import is a unit per imported name. The fingerprint is the
sha256 of the sorted set of units.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
from types import ModuleType


def code_units(module: ModuleType) -> list[str]:
    """The module's top-level statements as syntax-tree dumps, without docstrings and objbench imports."""
    tree = ast.parse(inspect.getsource(module))
    units = []
    for i, node in enumerate(tree.body):
        if i == 0 and _is_docstring(node) or _imports_objbench(node):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):  # one unit per imported name
            units.extend(ast.dump(type(node)(**{**node.__dict__, "names": [a]})) for a in node.names)
        else:
            units.append(ast.dump(_without_docstrings(node)))
    return units


def code_fingerprint(*modules: ModuleType) -> str:
    """sha256 (16 hex digits) over the set of code units of the given modules, sorted: a unit found in two
    modules counts once (the same import in the file a function left and the file it moved to)."""
    units = sorted({u for m in modules for u in code_units(m)})
    h = hashlib.sha256()
    for u in units:
        h.update(u.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _imports_objbench(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "objbench"
    if isinstance(node, ast.Import):
        return all(a.name.split(".")[0] == "objbench" for a in node.names)
    return False


def _without_docstrings(node: ast.AST) -> ast.AST:
    """A copy of ``node`` whose functions and classes (at any depth) have no docstring statement."""
    node = ast.parse(ast.unparse(node)).body[0]  # a fresh copy
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and _is_docstring(body[0]):
            n.body = body[1:] or [ast.Pass()]
    return node

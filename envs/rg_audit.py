"""The audit of reasoning-gym (pinned 0.1.25) behind the reasoning_gym task's refusals: which data sets' scorers
evaluate the answer as code (UNSAFE_SCORERS, and `scorer_sinks`, the AST scanner that finds such calls in the
installed package), and which generators are not reproducible across processes (HASH_SEED_DEPENDENT,
NONDETERMINISTIC). `check_dataset(cfg)` is the task's refusal of what cannot run safely or reproducibly;
`unsafe_reason(dataset)` says why a scorer counts as evaluating, and on another reasoning-gym version than
PINNED_VERSION it scans the installed scorer instead of trusting the lists.
"""

from __future__ import annotations

import ast
import builtins
import importlib.metadata
import inspect
import os
import sys
import textwrap

PINNED_VERSION = "0.1.25"
"""The reasoning-gym version UNSAFE_SCORERS and HASH_SEED_DEPENDENT were derived from."""

UNSAFE_SCORERS: tuple[str, ...] = (
    "binary_matrix",  # eval(answer) (algorithmic/binary_matrix.py)
    "countdown",  # sympy parse_expr(answer) (games/countdown.py)
    "intermediate_integration",  # sympy.parse_expr(answer) (algebra/intermediate_integration.py)
    "n_queens",  # eval(answer) (games/n_queens.py)
    "polynomial_multiplication",  # sp.parse_expr(answer) (algebra/polynomial_multiplication.py)
    "puzzle24",  # sympy parse_expr(answer) (games/puzzle24.py)
    "simple_integration",  # sympy.parse_expr(answer) (algebra/simple_integration.py)
    "spiral_matrix",  # eval(answer) (algorithmic/spiral_matrix.py)
    "string_insertion",  # "".join(eval(answer)) (algorithmic/string_insertion.py)
)
"""Data sets of reasoning-gym 0.1.25 whose score_answer evaluates the answer text as Python (eval, or sympy's
parse_expr, which is eval of a rewritten string). Derived by reading every score_answer of the 106 registered data
sets and every function of reasoning_gym they call, then confirmed by `scorer_sinks` over the installed package,
which also flags bitwise_arithmetic and number_sorting: see ORACLE_ONLY_EVAL. "composite" is refused separately."""

ORACLE_ONLY_EVAL: dict[str, str] = {
    "bitwise_arithmetic": "verify_solution() evals entry['metadata']['problem'] (generated); the answer goes to int()",
    "number_sorting": "evals entry['answer'] (generated) when it is not JSON; the answer goes to json.loads",
}
"""Scorers the scanner flags whose eval() reads only the generated entry, never the answer (reviewed by hand in
0.1.25). The worker rebuilds entries itself, so this text never comes from the model."""

HASH_SEED_DEPENDENT: tuple[str, ...] = (
    "isomorphic_strings",
    "knight_swap",
    "polynomial_multiplication",
    "ransom_note",
    "word_ladder",
)
"""Data sets of 0.1.25 whose entries differ between processes with different PYTHONHASHSEED (they iterate over
sets of strings), measured by generating each data set's entries under two hash seeds (tests/test_reasoning_gym.py,
marked slow). They need a fixed PYTHONHASHSEED in the environment, which the worker then gets too."""

NONDETERMINISTIC: tuple[str, ...] = ("codeio", "list_functions")
"""Data sets of 0.1.25 whose entries depend on the process's global random state (list_functions' generators call
random.randint; codeio runs its snippets' own unseeded randomness): two fresh processes with the same seed and
PYTHONHASHSEED generate different problems (measured as for HASH_SEED_DEPENDENT). Refused: their stream is not a
function of (seed, index), and the scorer worker could not rebuild an entry."""


def installed_version() -> str | None:
    """The installed reasoning-gym version (its distribution metadata; its __version__ lags), or None."""
    try:
        return importlib.metadata.version("reasoning_gym")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_dataset(cfg) -> bool:
    """Refuse the data set of a ReasoningGymConfig when it cannot run safely or reproducibly; return whether its scorer
    evaluates answers (then allowed by allow_unsafe_scorer)."""
    from reasoning_gym.factory import DATASETS

    name = cfg.dataset
    if name == "composite":
        raise ValueError("reasoning-gym's 'composite' data set is not supported: use task.name=mixture with "
                         "reasoning_gym components (each keeps its own held-out set, scorer and safety checks)")
    if name not in DATASETS:
        raise ValueError(f"unknown reasoning-gym data set {name!r}; valid: {', '.join(sorted(DATASETS))}")
    if name in NONDETERMINISTIC:
        raise ValueError(
            f"reasoning-gym data set {name!r} is not supported: its generator draws from the process's global random "
            "state, so the same (seed, index) gives different problems in different processes (no reproducible "
            "stream, and the scorer worker could not rebuild an entry to score)"
        )
    reason = unsafe_reason(name)
    if reason is not None and not cfg.allow_unsafe_scorer:
        raise ValueError(
            f"reasoning-gym data set {name!r} is refused: {reason}, so a model's answer would run as code. Set "
            "task.allow_unsafe_scorer=true to run it anyway: it is then scored in an isolated worker process "
            "(scrubbed environment, empty temporary folder, CPU and memory limits, killed after "
            "task.scorer_timeout_s), but evaluated text can still read files and use the network from there"
        )
    if name in HASH_SEED_DEPENDENT and not os.environ.get("PYTHONHASHSEED", "").isdigit():
        raise ValueError(
            f"reasoning-gym data set {name!r} generates different problems in processes with different string "
            "hashing (it iterates over sets of strings), so its stream would not be reproducible and its scorer "
            "worker would rebuild other entries: run with a fixed PYTHONHASHSEED (e.g. PYTHONHASHSEED=0) in the "
            "environment"
        )
    return reason is not None


# ---------------------------------------------------------------------------------------------------------------
# The scanner behind UNSAFE_SCORERS

_EVAL_BUILTINS = frozenset({"eval", "exec", "compile", "__import__"})
_SINK_MODULES = frozenset({"sympy", "pickle", "marshal", "shelve", "dill", "subprocess", "importlib", "ctypes",
                           "code", "codeop", "runpy", "pty"})
_SINK_ATTRS = frozenset({("os", "system"), ("os", "popen"), ("yaml", "load"), ("yaml", "unsafe_load"),
                         ("yaml", "full_load"), ("numpy", "load")})
_SINK_NAMES = frozenset({"eval", "exec", "parse_expr", "sympify", "simplify", "parse_latex", "literal_eval"})


def scorer_sinks(dataset_cls: type, follow: tuple[str, ...] = ("reasoning_gym",)) -> list[str]:
    """Calls that may evaluate text, reachable from `dataset_cls.score_answer`: builtin eval/exec/compile/
    __import__, getattr/setattr with a computed name, anything in sympy (its functions sympify strings, and
    sympify is eval), pickle, subprocess, os.system, yaml.load, ...; and, for calls it cannot resolve, names like
    parse_expr or sympify. Follows every function and method of reasoning_gym that the scorer calls (static
    resolution through the defining module's globals and the class; an unresolved method call follows the methods
    of that name in the same module; `follow` are the module prefixes whose code is read). Sorted "where: what"
    strings; [] = nothing found.

    Conservative by design (it flags eval of the generated entry too, see ORACLE_ONLY_EVAL); it does not read
    code outside reasoning_gym (magiccube, zss, numpy were read by hand for 0.1.25)."""
    found: set[str] = set()
    seen: set[int] = set()
    owner = next(k for k in dataset_cls.__mro__ if "score_answer" in vars(k))
    todo = [(vars(owner)["score_answer"], owner)]
    while todo:
        fn, owner = todo.pop()
        fn = inspect.unwrap(getattr(fn, "__func__", fn))
        if id(fn) in seen or not inspect.isfunction(fn):
            continue
        seen.add(id(fn))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            continue
        where = f"{fn.__module__}.{fn.__qualname__}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                todo.extend(_scan_call(node, fn, owner, where, found, follow))
    return sorted(found)


def _scan_call(node: ast.Call, fn, owner: type, where: str, found: set[str], follow: tuple[str, ...]) -> list:
    """Record a sink for one call node; return the reasoning_gym functions it leads to, as (function, class)."""
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    target = _resolve(func, fn, owner)
    module = (getattr(target, "__module__", None) or "") if target is not None else ""
    if isinstance(target, type(sys)):
        module = target.__name__
    if target is not None and name in _EVAL_BUILTINS and target is getattr(builtins, name, None):
        found.add(f"{where}: {name}()")
    elif target is not None and target in (getattr, setattr, delattr) and not (
        len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
    ):
        found.add(f"{where}: {name}() with a computed name")
    root = module.split(".")[0]
    if root in _SINK_MODULES or (root, name) in _SINK_ATTRS:
        found.add(f"{where}: {module}.{name}()")
    if target is None:
        if not isinstance(func, ast.Attribute):
            if name in _SINK_NAMES:
                found.add(f"{where}: {name}() (unresolved)")
            return []
        mod = sys.modules.get(fn.__module__)
        same = [(vars(c)[name], c) for c in vars(mod).values()
                if inspect.isclass(c) and c.__module__ == fn.__module__ and name in vars(c)] if mod else []
        if not same and name in _SINK_NAMES:
            found.add(f"{where}: .{name}() (unresolved)")
        return same
    if not module.startswith(follow):
        return []
    if inspect.isclass(target):
        return [(v, target) for v in vars(target).values() if inspect.isfunction(v) or isinstance(v, staticmethod)]
    qual = getattr(target, "__qualname__", "")
    cls = getattr(sys.modules.get(module), qual.split(".")[0], None) if "." in qual else None
    return [(target, cls if inspect.isclass(cls) else owner)]


def _resolve(node: ast.expr, fn, owner: type):
    """The object a call's function expression names, statically: globals, builtins, self./cls. attributes."""
    if isinstance(node, ast.Name):
        g = getattr(fn, "__globals__", {})
        return g[node.id] if node.id in g else getattr(builtins, node.id, None)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            return inspect.getattr_static(owner, node.attr, None) if owner is not None else None
        base = _resolve(node.value, fn, owner)
        if base is not None:
            try:
                return getattr(base, node.attr, None)
            except Exception:  # noqa: BLE001 - a property that raises on the class
                return None
    return None


def unsafe_reason(dataset: str) -> str | None:
    """Why `dataset`'s scorer counts as evaluating the answer, or None. From UNSAFE_SCORERS on the pinned version;
    on any other version, from a scan of the installed scorer (ORACLE_ONLY_EVAL is not trusted there)."""
    if dataset in UNSAFE_SCORERS:
        return "its score_answer evaluates the answer (eval or sympy's parse_expr, read in reasoning-gym " \
               f"{PINNED_VERSION})"
    if installed_version() == PINNED_VERSION:
        return None
    from reasoning_gym.factory import DATASETS

    sinks = scorer_sinks(DATASETS[dataset][0]) if dataset in DATASETS else []
    if sinks:
        return (f"reasoning-gym {installed_version()} is not the audited {PINNED_VERSION}, and a scan of its scorer "
                f"finds calls that may evaluate text: {'; '.join(sinks[:4])}")
    return None


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
import dataclasses
import functools
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import textwrap
import types

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
which also flags bitwise_arithmetic, number_sorting and word_ladder: see ORACLE_ONLY_EVAL. "composite" is refused separately."""

ORACLE_ONLY_EVAL: dict[str, str] = {
    "bitwise_arithmetic": "verify_solution() evals entry['metadata']['problem'] (generated); the answer goes to int()",
    "number_sorting": "evals entry['answer'] (generated) when it is not JSON; the answer goes to json.loads",
    "word_ladder": "score_answer reads self.word_sets, which __init__ fills from get_data_file_path('words.csv'): "
                   "importlib.resources.files('reasoning_gym.data'), a constant package name, at construction",
}
"""Scorers the scanner flags whose flagged call never sees the answer (reviewed by hand in 0.1.25): an eval() that
reads only the generated entry (the worker rebuilds entries itself, so that text never comes from the model), or
an import by a constant name. word_ladder was found when the scanner began following what __init__ assigns to the
instance attributes a scorer reads."""

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
            "task.allow_unsafe_scorer=true to run it anyway: each answer is then scored in a one-shot process of "
            "its own (an unused uid when run as root; CPU, memory, file and process limits; killed with everything "
            "it started after task.scorer_timeout_s), but evaluated text can still read world-readable files, write "
            "where that uid may and use the network (docs/models-and-data.md, 'The scorer sandbox')"
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
_NAME_BUILTINS = frozenset({"getattr", "setattr", "delattr"})
_SINK_MODULES = frozenset({"sympy", "pickle", "marshal", "shelve", "dill", "subprocess", "importlib", "ctypes",
                           "code", "codeop", "runpy", "pty"})
_SINK_ATTRS = frozenset({("os", "system"), ("os", "popen"), ("posix", "system"), ("nt", "system"),
                         ("yaml", "load"), ("yaml", "unsafe_load"), ("yaml", "full_load"), ("numpy", "load")})
_SINK_NAMES = frozenset({"eval", "exec", "parse_expr", "sympify", "simplify", "parse_latex", "literal_eval"})
_CONTAINERS = (list, tuple, set, frozenset, dict)

SCAN_BLIND_SPOTS = (
    "calls through objects it cannot resolve statically (parameters, data, results of calls, attributes of "
    "instances of unknown type: an unresolved method call is followed only to methods of that name in the same "
    "module; instance attributes set other than by self.x = ... or setattr), names looked up with computed "
    "strings outside builtins and the sink modules, code outside reasoning_gym, and sources it cannot read"
)
"""What `scorer_sinks` cannot see: the caveat printed when its scan is the only guard."""


@dataclasses.dataclass
class _Frame:
    """One function being read: the function, the class its self/cls names, its "module.qualname", and its local
    names (bound once by an import or an assignment the scanner resolves: that object; otherwise None, unknown)."""

    fn: object
    owner: type | None
    where: str
    local: dict


def scorer_sinks(dataset_cls: type, follow: tuple[str, ...] = ("reasoning_gym",)) -> list[str]:
    """Code reachable from `dataset_cls.score_answer` that may evaluate text: builtin eval/exec/compile/__import__,
    getattr/setattr with a computed name, anything in sympy (sympify is eval), pickle, subprocess, os.system,
    yaml.load, ...; for calls it cannot resolve, names like parse_expr. Sinks are recognised as objects, whatever
    they are called: aliases (module-level, local, class or instance attributes assigned in any method, `from
    builtins import exec as f`, `import builtins as b; b.eval`), getattr(builtins, "eval"), builtins.__dict__[...],
    vars(builtins)[...], __builtins__[...], functools.partial. Any other reference to a sink (an argument as in
    map(eval, xs), a return value, a container's element, an assignment) is a sink too, as are a computed lookup in
    builtins or a sink module and a module-level container holding a sink. Follows the functions and classes of
    reasoning_gym the scorer calls or refers to (static resolution through locals, the module's globals and the
    data set's class; an unresolved method call follows the same module's methods of that name; `follow` are the
    module prefixes whose code is read). Sorted "where: what" strings; [] = nothing found.

    Conservative by design (it flags eval of the generated entry too, see ORACLE_ONLY_EVAL); what it cannot see
    is SCAN_BLIND_SPOTS (magiccube, zss, numpy were read by hand for 0.1.25)."""
    scan = _Scan(follow)
    owner = next(k for k in dataset_cls.__mro__ if "score_answer" in vars(k))
    scan.todo.append((vars(owner)["score_answer"], dataset_cls, None))  # self is a dataset_cls, wherever defined
    scan.run()
    return sorted(scan.found)


class _Scan:
    """The state of one `scorer_sinks` run: what was found, what is still to read, what was read."""

    def __init__(self, follow: tuple[str, ...]) -> None:
        self.follow = follow
        self.found: set[str] = set()
        self.todo: list = []  # (function, class, None) to read, or (None, class, attribute) to find assignments
        self.seen: set = set()
        self.frames: dict[tuple, tuple | None] = {}

    def run(self) -> None:
        while self.todo:
            fn, owner, attr = self.todo.pop()
            if attr is not None:
                self._read_assignments(owner, attr)
                continue
            fn = inspect.unwrap(getattr(fn, "__func__", fn))
            if (id(fn), id(owner)) in self.seen or not inspect.isfunction(fn):
                continue
            self.seen.add((id(fn), id(owner)))
            read = self._parse(fn, owner)
            if read is not None:
                self._scan(read[0], read[1])

    def _parse(self, fn, owner):
        """(tree, frame) of a function's source read as a method of `owner`, or None when it cannot be read."""
        key = (id(fn), id(owner))
        if key not in self.frames:
            tree = _parse_source(fn)
            if tree is None:
                self.frames[key] = None
                return None
            frame = _Frame(fn, owner, f"{fn.__module__}.{fn.__qualname__}", {})
            frame.local = _bindings(tree, frame)
            self.frames[key] = (tree, frame)
        return self.frames[key]

    def _read_assignments(self, owner: type, attr: str) -> None:
        """Scan what any method of `owner` (and its classes in `follow`) assigns to self.<attr> or cls.<attr>."""
        if (id(owner), attr) in self.seen:
            return
        self.seen.add((id(owner), attr))
        for k in owner.__mro__:
            if not (k.__module__ or "").startswith(self.follow):
                continue
            for v in list(vars(k).values()):
                fn = v.fget if isinstance(v, property) else getattr(v, "__func__", v)
                read = self._parse(fn, owner) if inspect.isfunction(fn) else None
                for value in _assigned_values(read[0], attr) if read else ():
                    self._scan(value, dataclasses.replace(read[1], where=f"{read[1].where} (self.{attr} =)"))

    def _scan(self, tree: ast.AST, frame: _Frame) -> None:
        """Record the sinks of one tree (a function, or a value assigned to an attribute); queue what it leads to."""
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, (ast.Attribute, ast.Subscript))}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._imports(node, frame)
            if isinstance(node, ast.Attribute) and _is_self(node.value, frame) and \
                    _static(frame.owner, node.attr) is None:
                self.todo.append((None, frame.owner, node.attr))  # an instance attribute: what is assigned to it
            if isinstance(node, ast.Subscript):
                self._computed_lookup(node, frame)
            if isinstance(node, ast.Call):
                self._computed_name(node, frame)
            if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
                self._container(node, frame)
            if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) and id(node) not in inner \
                    and not isinstance(getattr(node, "ctx", ast.Load()), (ast.Store, ast.Del)):
                self._reference(node, frame, id(node) in called)

    def _reference(self, node: ast.expr, frame: _Frame, called: bool) -> None:
        """One complete name/attribute/subscript expression: a sink when it names one (a call, or a value that
        escapes); a function or class of `follow` it names is queued."""
        obj = _unwrap(_resolve(node, frame))
        text = _text(node)
        label = _sink_label(obj)
        if label is not None and called:
            alias = "" if text.rsplit(".", 1)[-1] == label.rsplit(".", 1)[-1] else f" via {text}"
            self.found.add(f"{frame.where}: {label}(){alias}")
        elif label is not None or (not called and _is_name_builtin(obj)):
            self.found.add(f"{frame.where}: {label or obj.__name__} as a value ({text})")
        if obj is None:
            if called:
                self._unresolved_call(node, frame)
            return
        module = getattr(obj, "__module__", None) if inspect.isfunction(obj) or inspect.isclass(obj) else None
        if not isinstance(module, str) or not module.startswith(self.follow):
            return
        if inspect.isclass(obj):
            self.todo.extend((v.fget if isinstance(v, property) else v, obj, None) for v in vars(obj).values()
                             if inspect.isfunction(v) or isinstance(v, (staticmethod, classmethod, property)))
            return
        qual = obj.__qualname__
        cls = getattr(sys.modules.get(module), qual.split(".")[0], None) if "." in qual else None
        keep = not inspect.isclass(cls) or (frame.owner is not None and issubclass(frame.owner, cls))
        self.todo.append((obj, frame.owner if keep else cls, None))  # a method of self's class keeps self's class

    def _unresolved_call(self, node: ast.expr, frame: _Frame) -> None:
        """A call the scanner cannot resolve: flagged by a sink's name; a method call leads to the methods of that
        name in the same module."""
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        if not isinstance(node, ast.Attribute):
            if name in _SINK_NAMES:
                self.found.add(f"{frame.where}: {name}() (unresolved)")
            return
        mod = sys.modules.get(frame.fn.__module__)
        same = [(vars(c)[name], c, None) for c in list(vars(mod).values()) if inspect.isclass(c)
                and c.__module__ == frame.fn.__module__ and name in vars(c)] if mod else []
        if not same and name in _SINK_NAMES:
            self.found.add(f"{frame.where}: .{name}() (unresolved)")
        self.todo.extend(same)

    def _computed_name(self, node: ast.Call, frame: _Frame) -> None:
        """getattr/setattr/delattr called with a name that is not a constant string."""
        fn = _unwrap(_resolve(node.func, frame))
        if _is_name_builtin(fn) and not (len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
            self.found.add(f"{frame.where}: {fn.__name__}() with a computed name")

    def _computed_lookup(self, node: ast.Subscript, frame: _Frame) -> None:
        """A subscript with a computed key into builtins, sys.modules, a sink module's namespace, or globals."""
        if isinstance(node.slice, ast.Constant):
            return
        base = _resolve(node.value, frame)
        if base is vars(builtins) or base is sys.modules or base is getattr(frame.fn, "__globals__", None) or (
            isinstance(base, dict) and isinstance(base.get("__name__"), str) and _sink_label(
                sys.modules.get(base["__name__"])) is not None and base is vars(sys.modules[base["__name__"]])):
            self.found.add(f"{frame.where}: a computed lookup in a namespace ({_text(node)})")

    def _imports(self, node: ast.Import | ast.ImportFrom, frame: _Frame) -> None:
        """An import inside the function of a sink (not a module: uses of a module are judged where they are)."""
        for name, obj, source in _import_targets(node, frame):
            label = _sink_label(obj) if not isinstance(obj, type(sys)) else None
            if label is None and obj is None and (source.split(".")[0] in _SINK_MODULES or
                                                  source.rsplit(".", 1)[-1] in _SINK_NAMES | _EVAL_BUILTINS):
                label = f"{source} (unresolved)"
            if label is not None:
                self.found.add(f"{frame.where}: import of {label} as {name}")

    def _container(self, node: ast.expr, frame: _Frame) -> None:
        """A name for a container (list, tuple, set, dict) that holds a sink."""
        obj = _resolve(node, frame)
        if isinstance(obj, _CONTAINERS):
            items = list(obj.values()) if isinstance(obj, dict) else list(obj)
            labels = sorted({_sink_label(_unwrap(v)) for v in items if not isinstance(v, type(sys))} - {None})
            if labels:
                more = f" and {len(labels) - 3} more" if len(labels) > 3 else ""
                self.found.add(f"{frame.where}: {_text(node)} holds {', '.join(labels[:3])}{more}")


def _parse_source(fn) -> ast.Module | None:
    """A function's source as a module holding its definition, or None when it cannot be read. A method whose
    body has string lines indented less than the def is parsed inside a block (textwrap.dedent cannot dedent it)."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    try:
        return ast.parse(textwrap.dedent(source))
    except SyntaxError:
        pass
    try:
        return ast.Module(body=ast.parse("if 1:\n" + source).body[0].body, type_ignores=[])
    except SyntaxError:
        return None


def _bindings(tree: ast.AST, frame: _Frame) -> dict:
    """A function's local names: each name bound exactly once by an import or an assignment that resolves
    statically, to that object; every other local name (parameters, loop targets, rebound names...) to None."""
    root = tree.body[0] if isinstance(tree, ast.Module) and tree.body else None
    counts: dict[str, int] = {}
    statements = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names = [node.id]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not root:
            names = [node.name]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [t[0] for t in _import_targets(node, frame)]
            statements.append(node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            statements.append(node)
        for n in names:
            counts[n] = counts.get(n, 0) + 1
    frame.local = dict.fromkeys(counts)
    for node in sorted(statements, key=lambda n: (n.lineno, n.col_offset)):
        pairs = _import_targets(node, frame) if not isinstance(node, ast.Assign) else [
            (node.targets[0].id, _resolve(node.value, frame), "")]
        for name, obj, _ in pairs:
            if counts.get(name) == 1:
                frame.local[name] = obj
    return frame.local


def _import_targets(node: ast.Import | ast.ImportFrom, frame: _Frame) -> list[tuple[str, object, str]]:
    """(bound name, object or None, dotted source) of each name an import statement binds; modules are looked up
    among those already imported, never imported here."""
    if isinstance(node, ast.Import):
        return [(a.asname or a.name.split(".")[0], sys.modules.get(a.name if a.asname else a.name.split(".")[0]),
                 a.name) for a in node.names]
    base = node.module or ""
    if node.level:
        package = getattr(sys.modules.get(frame.fn.__module__), "__package__", None) or ""
        try:
            base = importlib.util.resolve_name("." * node.level + base, package)
        except (ImportError, ValueError):
            return [(a.asname or a.name, None, a.name) for a in node.names]
    mod = sys.modules.get(base)
    return [(a.asname or a.name, getattr(mod, a.name, None) if mod is not None else
             sys.modules.get(f"{base}.{a.name}"), f"{base}.{a.name}") for a in node.names]


def _assigned_values(tree: ast.AST, attr: str) -> list[ast.expr]:
    """The values a function assigns to self.<attr> / cls.<attr> (plain, annotated, augmented, or setattr)."""
    out = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for elt in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                if isinstance(elt, ast.Attribute) and elt.attr == attr and isinstance(elt.value, ast.Name) \
                        and elt.value.id in ("self", "cls") and node.value is not None:
                    out.append(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and \
                len(node.args) == 3 and (not isinstance(node.args[1], ast.Constant) or node.args[1].value == attr):
            out.append(node.args[2])
    return out


def _resolve(node: ast.expr, frame: _Frame):
    """The object an expression names, statically, or None: locals, globals, builtins; self./cls. attributes
    (the class's, static lookup) and super(); attributes; constant subscripts of dicts, lists and tuples;
    getattr(x, "name"), vars(x), globals()."""
    if isinstance(node, ast.Name):
        if node.id in frame.local and not _is_self(node, frame):
            return frame.local[node.id]
        g = getattr(frame.fn, "__globals__", {})
        return g[node.id] if node.id in g else getattr(builtins, node.id, None)
    if isinstance(node, ast.Attribute):
        if _is_self(node.value, frame):
            return _static(frame.owner, node.attr)
        if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and \
                node.value.func.id == "super" and frame.owner is not None:
            mro = frame.owner.__mro__
            here = next((i for i, k in enumerate(mro) if _unwrap(vars(k).get(frame.fn.__name__)) is frame.fn), 0)
            return next((vars(k)[node.attr] for k in mro[here + 1:] if node.attr in vars(k)), None)
        return _attribute(_resolve(node.value, frame), node.attr)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        base = _resolve(node.value, frame)
        try:
            return base[node.slice.value] if isinstance(base, (dict, types.MappingProxyType, list, tuple)) else None
        except (KeyError, IndexError, TypeError):
            return None
    if isinstance(node, ast.Call):
        return _call_result(node, frame)
    return None


def _call_result(node: ast.Call, frame: _Frame):
    """What getattr(x, "name"[, default]), vars(x) and globals() return, statically; None for any other call."""
    fn = _resolve(node.func, frame)
    args = node.args
    if fn is getattr and len(args) in (2, 3) and isinstance(args[1], ast.Constant) and isinstance(
            args[1].value, str):
        return _attribute(_resolve(args[0], frame), args[1].value)
    if fn is vars and len(args) == 1:
        base = _resolve(args[0], frame)
        return vars(base) if isinstance(base, (type(sys), type)) else None
    if fn is globals and not args:
        return getattr(frame.fn, "__globals__", None)
    return None


def _attribute(base, name: str):
    """getattr(base, name) for a resolved base, or None (no base, no such attribute, or it raises)."""
    if base is None:
        return None
    try:
        return getattr(base, name, None)
    except Exception:  # noqa: BLE001 - a property that raises on the class
        return None


def _static(owner: type | None, name: str):
    """A class attribute found without running descriptors, or None."""
    return inspect.getattr_static(owner, name, None) if owner is not None else None


def _is_self(node: ast.expr, frame: _Frame) -> bool:
    """Whether an expression is the plain name self or cls inside a method."""
    return isinstance(node, ast.Name) and node.id in ("self", "cls") and frame.owner is not None


def _unwrap(obj):
    """The function behind a static/class method, bound method, property getter or functools.partial."""
    for _ in range(8):
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif isinstance(obj, property):
            obj = obj.fget
        elif isinstance(obj, (staticmethod, classmethod, types.MethodType)):
            obj = obj.__func__
        else:
            break
    return obj


def _is_name_builtin(obj) -> bool:
    """Whether obj is builtins.getattr, setattr or delattr."""
    return any(obj is getattr(builtins, n) for n in _NAME_BUILTINS)


def _sink_label(obj) -> str | None:
    """A name for a sink object, or None: the builtins eval/exec/compile/__import__; builtins itself, its
    namespace, a sink module; anything defined in a sink module (sympy, pickle, ...); os.system, yaml.load, ..."""
    if obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return None
    for name in _EVAL_BUILTINS:
        if obj is getattr(builtins, name):
            return name
    if obj is builtins or obj is vars(builtins):
        return "builtins" if obj is builtins else "builtins.__dict__"
    if isinstance(obj, type(sys)):
        return obj.__name__ if obj.__name__.split(".")[0] in _SINK_MODULES else None
    try:
        module, name = getattr(obj, "__module__", None), getattr(obj, "__name__", None)
    except Exception:  # noqa: BLE001 - an object whose attribute lookup raises
        return None
    if not isinstance(module, str):
        return None
    name = name if isinstance(name, str) else type(obj).__name__
    root = module.split(".")[0]
    return f"{module}.{name}" if root in _SINK_MODULES or (root, name) in _SINK_ATTRS else None


def _text(node: ast.AST) -> str:
    """An expression's source text, cut at 60 characters."""
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


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


_REPORTED: set[str] = set()


def report_scan(dataset: str) -> str | None:
    """On a reasoning-gym version other than PINNED_VERSION, print to stderr (once per process and data set) the
    scan's verdict on `dataset`'s scorer with its caveat: the scan is then the only guard, and SCAN_BLIND_SPOTS is
    what it cannot see. Returns what it printed; None on the pinned version (its lists were read by hand)."""
    version = installed_version()
    if version == PINNED_VERSION or dataset in _REPORTED:
        return None
    from reasoning_gym.factory import DATASETS

    _REPORTED.add(dataset)
    sinks = scorer_sinks(DATASETS[dataset][0]) if dataset in DATASETS else []
    found = f"finds {len(sinks)} call(s) that may evaluate text ({'; '.join(sinks[:2])})" if sinks else \
        "finds nothing that evaluates text"
    text = (f"objbench: reasoning-gym {version} is not the audited {PINNED_VERSION}: a static scan of the scorer "
            f"of data set {dataset!r} {found}. That scan is the only guard on this version; it cannot see "
            f"{SCAN_BLIND_SPOTS}")
    print(text, file=sys.stderr)
    return text

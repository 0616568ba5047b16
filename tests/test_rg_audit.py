"""The scorer scanner of envs/rg_audit.py (`scorer_sinks`) on synthetic scorers: every way of reaching eval, exec,
compile or sympy's parsers under another name (aliases, attributes, getattr/__dict__/vars access on builtins, sinks
passed as values) is flagged, and scorers that do nothing unsafe stay clean. Then the verdict on a reasoning-gym
version other than the pinned one, printed once per process and data set."""

import importlib
import sys
import textwrap

import pytest

from objbench.envs import make_task
from objbench.envs import rg_audit as R

HEADER = "import builtins\nimport functools\nimport re\nimport sys\n"

UNSAFE = {
    # the eight variants of issue 44 item 5
    "module_alias": ("_p = eval\n", "return _p(answer)"),
    "local_alias": ("", "p = eval\n        return p(answer)"),
    "instance_attribute": ("", "return self.f(answer)", "self.f = eval"),
    "from_builtins_import": ("from builtins import exec as f\n", "return f(answer)"),
    "getattr_builtins": ("", 'return getattr(builtins, "eval")(answer)'),
    "builtins_dict": ("", 'return builtins.__dict__["eval"](answer)'),
    "map_eval": ("", "return list(map(eval, answer.split()))"),
    "partial_eval": ("", "return functools.partial(eval)(answer)"),
    # direct calls
    "direct_eval": ("", "return eval(answer)"),
    "direct_exec": ("", "exec(answer)"),
    "direct_compile": ("", 'return compile(answer, "<a>", "eval")'),
    "direct_parse_expr": ("import sympy\n", "return sympy.parse_expr(answer)"),
    "direct_sympify": ("from sympy import sympify\n", "return sympify(answer)"),
    # more of the same
    "class_attribute": ("", "return self.g(answer)", None, "g = staticmethod(eval)"),
    "local_from_import": ("", "from builtins import exec as f\n        f(answer)"),
    "local_import_builtins": ("", "import builtins as b\n        return b.eval(answer)"),
    "module_import_builtins": ("import builtins as bb\n", "return bb.eval(answer)"),
    "vars_builtins": ("", 'return vars(builtins)["eval"](answer)'),
    "dunder_builtins": ("", 'return __builtins__["eval"](answer)'),
    "sys_modules": ("", 'return sys.modules["builtins"].eval(answer)'),
    "computed_getattr": ("", "return getattr(builtins, answer[:4])(answer)"),
    "computed_dict_key": ("", "return builtins.__dict__[answer[:4]](answer)"),
    "module_partial": ("_p = functools.partial(eval)\n", "return _p(answer)"),
    "returned": ("def _get():\n    return eval\n", "return _get()(answer)"),
    "in_container": ("", "return [eval][0](answer)"),
    "module_container": ("_OPS = {'e': eval}\n", "return _OPS[answer[0]](answer)"),
    "sympy_alias": ("import sympy\n", "sp = sympy\n        return sp.parse_expr(answer)"),
    "instance_via_helper": ("def _make():\n    return eval\n", "return self.h(answer)", "self.h = _make()"),
    "bound_as_argument": ("def _apply(f, x):\n    return f(x)\n", "return _apply(eval, answer)"),
}

SAFE = {
    "evaluate_method": ("", "return self.evaluate(answer)", None,
                        "def evaluate(self, text):\n        return float(text == '1')"),
    "compile_regex": ("", "return float(self.compile_regex().fullmatch(answer) is not None)", None,
                      "def compile_regex(self):\n        return re.compile(r'\\d+')"),
    "re_compile": ("", "return float(re.compile(r'\\d+').fullmatch(answer) is not None)"),
    "compiled_attribute": ("", "return float(self.rx.fullmatch(answer) is not None)", "self.rx = re.compile('a')"),
    "names_like_sinks": ("", "evaluation = {'eval': 1}\n        return float(evaluation.get(answer, 0))"),
    "plain_builtins": ("", "return float(builtins.len(answer) == getattr(self, 'n', 1))"),
}


def _source(body: str, init: str | None = None, extra: str | None = None, top: str = "") -> str:
    lines = [HEADER + top, "class D:"]
    if extra:
        lines.append(textwrap.indent(extra, "    "))
    if init:
        lines.append(f"    def __init__(self):\n        {init}")
    lines.append(f"    def score_answer(self, answer, entry):\n        {body}\n")
    return "\n".join(lines)


def _scan(tmp_path, monkeypatch, name: str, spec: tuple) -> list[str]:
    top, body, *rest = spec
    module = f"rgscan_{name}"
    (tmp_path / f"{module}.py").write_text(_source(body, *rest, top=top))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    try:
        mod = importlib.import_module(module)
        return R.scorer_sinks(mod.D, follow=(module,))
    finally:
        sys.modules.pop(module, None)


@pytest.mark.parametrize("name", sorted(UNSAFE))
def test_every_route_to_a_sink_is_flagged(name, tmp_path, monkeypatch):
    sinks = _scan(tmp_path, monkeypatch, name, UNSAFE[name])
    assert sinks, name
    assert all(s.startswith(f"rgscan_{name}.") for s in sinks), sinks


@pytest.mark.parametrize("name", sorted(SAFE))
def test_safe_scorers_stay_clean(name, tmp_path, monkeypatch):
    assert _scan(tmp_path, monkeypatch, name, SAFE[name]) == []


def test_findings_say_how_the_sink_is_reached(tmp_path, monkeypatch):
    assert _scan(tmp_path, monkeypatch, "direct_eval", UNSAFE["direct_eval"]) == [
        "rgscan_direct_eval.D.score_answer: eval()"]
    assert _scan(tmp_path, monkeypatch, "module_alias", UNSAFE["module_alias"]) == [
        "rgscan_module_alias.D.score_answer: eval() via _p"]
    assert any("eval as a value (eval)" in s for s in _scan(tmp_path, monkeypatch, "map_eval", UNSAFE["map_eval"]))
    inst = _scan(tmp_path, monkeypatch, "instance_attribute", UNSAFE["instance_attribute"])
    assert inst == ["rgscan_instance_attribute.D.__init__ (self.f =): eval as a value (eval)"], inst


INHERITED = """
class Base:
    def score_answer(self, answer, entry):
        return self.parse(answer) + self.f(answer)

    def parse(self, text):
        return len(text)


class Child(Base):
    def __init__(self):
        self.f = len

    def parse(self, text):
        return super().parse(text) + len(self.convert(text))


class Grandchild(Child):
    def __init__(self):
        super().__init__()
        self.convert = {NAME}
"""


def test_self_is_the_scanned_class(tmp_path, monkeypatch):
    """A scorer defined in a base class reaches the overrides and the instance attributes of the data set's class."""
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, sink in (("rgscan_inherited_safe", "str"), ("rgscan_inherited", "eval")):
        (tmp_path / f"{name}.py").write_text(INHERITED.replace("{NAME}", sink))
        mod = importlib.import_module(name)
        try:
            assert R.scorer_sinks(mod.Base, follow=(name,)) == []
            found = R.scorer_sinks(mod.Grandchild, follow=(name,))
        finally:
            sys.modules.pop(name, None)
        expect = [] if sink == "str" else [f"{name}.Grandchild.__init__ (self.convert =): eval as a value (eval)"]
        assert found == expect, found


def test_the_scan_verdict_is_printed_once_off_the_pinned_version(monkeypatch, capsys):
    pytest.importorskip("reasoning_gym")
    monkeypatch.setattr(R, "_REPORTED", set())
    make_task("reasoning_gym", dataset="chain_sum", eval_size=3)
    assert capsys.readouterr().err == ""  # the pinned version: its lists were read by hand, nothing to say
    monkeypatch.setattr(R, "installed_version", lambda: "9.9.9")
    for _ in range(2):
        make_task("reasoning_gym", dataset="chain_sum", eval_size=3)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reasoning-gym 9.9.9 is not the audited 0.1.25" in err, err
    assert "'chain_sum'" in err and "finds nothing" in err and "only guard" in err and "cannot see" in err
    with pytest.raises(ValueError, match="not the audited 0.1.25, and a scan of its scorer finds"):
        make_task("reasoning_gym", dataset="number_sorting", eval_size=3)  # refused: the error says why instead
    assert capsys.readouterr().err == ""
    make_task("reasoning_gym", dataset="number_sorting", eval_size=3, allow_unsafe_scorer=True)
    make_task("reasoning_gym", dataset="number_sorting", eval_size=3, allow_unsafe_scorer=True)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'number_sorting'" in err and "finds 1 call(s)" in err and "eval()" in err, err

import time
from fractions import Fraction

import pytest

from objbench.envs.safe_eval import ERRORS, SafeEvalLimits, safe_eval


@pytest.mark.parametrize(
    "source, value, literals",
    [
        ("(1+2)*3/4", Fraction(9, 4), (1, 2, 3, 4)),
        ("1-(2-3)", Fraction(2), (1, 2, 3)),
        ("1-2-3", Fraction(-4), (1, 2, 3)),
        ("2*3+4*5", Fraction(26), (2, 3, 4, 5)),
        ("8/(3-8/3)", Fraction(24), (8, 3, 8, 3)),
        ("-3", Fraction(-3), (3,)),
        ("--3", Fraction(3), (3,)),
        (" 1 + 2 ", Fraction(3), (1, 2)),
        ("0", Fraction(0), (0,)),
        ("(((7)))", Fraction(7), (7,)),
        ("1/3+1/6", Fraction(1, 2), (1, 3, 1, 6)),
        ("999999999999*999999", Fraction(999999999999 * 999999), (999999999999, 999999)),
    ],
)
def test_exact_values(source, value, literals):
    r = safe_eval(source)
    assert r.ok and r.error is None
    assert r.value == value and isinstance(r.value, Fraction)
    assert r.literals == literals


@pytest.mark.parametrize(
    "source, error",
    [
        ("9**9**9", "disallowed"),
        ("2**10", "disallowed"),
        ("7//2", "disallowed"),
        ("7%2", "bad_char"),
        ("__import__('os').system('x')", "bad_char"),
        ("(lambda: 1)()", "bad_char"),
        ("print(1)", "bad_char"),
        ("().__class__", "bad_char"),
        ("1 if 1 else 2", "bad_char"),
        ("True+1", "bad_char"),
        ("1.5", "bad_char"),
        ("1e9", "bad_char"),
        ("0x10", "bad_char"),
        ("1_000", "bad_char"),
        ("\u0663+1", "bad_char"),  # Arabic-Indic three
        ("\uff11+1", "bad_char"),  # fullwidth one
        ("1\n+1", "bad_char"),
        ("1\t+1", "bad_char"),
        ("", "empty"),
        ("   ", "empty"),
        ("1+", "syntax_error"),
        ("()", "disallowed"),
        ("(1,2)", "bad_char"),
        ("1 2", "syntax_error"),
        ("007", "syntax_error"),
        ("(1", "syntax_error"),
        ("1)", "syntax_error"),
        ("1/0", "division_by_zero"),
        ("1/(2-2)", "division_by_zero"),
        ("1" + "0" * 1000, "too_long"),
        ("1" + "0" * 100, "int_too_large"),
        ("1+" * 127 + "1", "too_deep"),
        ("(" * 200 + "1" + ")" * 200, "too_long"),
        ("(" * 100 + "1" + ")" * 100, "too_deep"),
        ("999999999999*999999999999*999999999999", "magnitude"),
        ("1/999999999999/999999999999", "magnitude"),
    ],
)
def test_rejections(source, error):
    r = safe_eval(source)
    assert not r.ok
    assert r.value is None
    assert r.error == error
    assert r.error in ERRORS


@pytest.mark.parametrize("garbage", [None, 42, 1.5, b"1+1", ["1", "+", "1"], {"a": 1}, object()])
def test_non_strings(garbage):
    r = safe_eval(garbage)
    assert (r.ok, r.error) == (False, "not_a_string")


def test_limits_are_configurable():
    chain = "+".join(["1"] * 30)
    assert safe_eval(chain).value == 30
    assert safe_eval(chain, SafeEvalLimits(max_depth=10)).error == "too_deep"
    assert safe_eval(chain, SafeEvalLimits(max_nodes=20)).error == "too_many_nodes"
    assert safe_eval("-3", SafeEvalLimits(allow_unary_minus=False)).error == "disallowed"
    assert safe_eval("123", SafeEvalLimits(max_int_digits=2)).error == "int_too_large"
    assert safe_eval("10*10", SafeEvalLimits(max_abs=99)).error == "magnitude"
    big = SafeEvalLimits(max_len=100_000, max_depth=10_000, max_nodes=100_000)
    # Even with loose caps, a deep tree is refused (never a RecursionError escaping) and nothing raises.
    r = safe_eval("(" * 5000 + "1" + ")" * 5000, big)
    assert not r.ok
    r = safe_eval("+".join(["1"] * 20_000), big)
    assert r.ok or r.error in ERRORS


def test_hostile_inputs_are_fast():
    hostile = ["9**9**9", "9" * 10_000, "(" * 10_000, "1+" * 10_000, "\u0663" * 10_000, "x" * 1_000_000]
    start = time.perf_counter()
    for src in hostile * 10:
        assert not safe_eval(src).ok
    assert time.perf_counter() - start < 1.0


def test_source_never_reaches_eval(monkeypatch):
    import builtins

    def boom(*args, **kwargs):
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "eval", boom)
    monkeypatch.setattr(builtins, "exec", boom)
    assert safe_eval("(1+2)*3").value == 9
    assert not safe_eval("__import__('os')").ok

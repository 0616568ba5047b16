import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from objbench.envs import mathcheck
from objbench.envs.mathcheck import REASONS, STYLES, MathVerdict, check_answer, extract_answer, normalize_answer, numeric_value

# The stated bound of one symbolic check once the worker is up: timeout_s plus kill-and-reap (measured ~20 ms),
# with margin for a shared 2-core machine.
KILL_MARGIN_S = 0.5


@pytest.fixture(scope="module")
def worker():
    """A ready symbolic worker (its start, ~2 s, is paid once per module)."""
    assert mathcheck.start_worker(wait=True)
    return mathcheck._WORKER


# ------------------------------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, style, expected",
    [
        ("Tom has 3 + 4 = 7 apples.\n#### 7", "gsm8k", "7"),
        ("#### $1,000.", "gsm8k", "1,000"),
        ("#### -3", "gsm8k", "-3"),
        ("#### 2.50 dollars", "gsm8k", "2.50"),
        ("#### 1\n#### 2\nmore text", "gsm8k", "2"),  # the last marker
        ("#### \\frac{1}{2}", "gsm8k", "1"),  # the first number of the marker line
        ("#### seven", "gsm8k", "seven"),  # no number on the marker line: the line
        ("no marker, 3 then 12 apples", "gsm8k", "12"),  # no marker: the last number
        ("####", "gsm8k", None),
        ("nothing here", "gsm8k", None),
        ("so \\boxed{\\frac{1}{2}}.", "boxed", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{ 2 }", "boxed", "2"),
        ("\\boxed{\\{1,2\\}}", "boxed", "\\{1,2\\}"),  # escaped braces are content
        ("\\boxed{\\frac{a}{b^{2}}}", "boxed", "\\frac{a}{b^{2}}"),
        ("\\fbox{5}", "boxed", "5"),
        ("\\boxed {7}", "boxed", "7"),
        ("\\boxed{1} and \\boxed{2", "boxed", None),  # the last one is cut off
        ("\\boxed{}", "boxed", None),
        ("the answer is 5", "boxed", None),
        ("x = -3", "last_number", "-3"),
        ("5 - 3", "last_number", "3"),  # a minus after a number is an operator
        ("costs 1,000, then", "last_number", "1,000"),
        ("1,000,000.5 units", "last_number", "1,000,000.5"),
        ("step2 is 3.5.", "last_number", "3.5"),  # "2" glued to a word is not a number
        ("ratio 3/4", "last_number", "3/4"),
        ("no digits", "last_number", None),
    ],
)
def test_extract_answer(text, style, expected):
    assert extract_answer(text, style) == expected


def test_extract_answer_rejects_unknown_style_and_non_strings():
    with pytest.raises(ValueError, match="answer style"):
        extract_answer("1", "latex")
    for style in STYLES:
        assert extract_answer(None, style) is None
        assert extract_answer(b"#### 1", style) is None


def test_normal_form_and_numeric_value():
    assert normalize_answer("\\$ 1{,}000.") == "1,000"
    assert normalize_answer("\\dfrac{1}{2}") == normalize_answer("\\frac{1}{2}")
    assert normalize_answer("\\text{Monday}") == "Monday"
    assert normalize_answer("50\\%") == "50"
    values = {"1,000": 1000, "42.0": 42, "-.5": -0.5, "\\frac{1}{2}": 0.5, "\\frac12": 0.5, "-\\frac{3}{4}": -0.75,
              "3/4": 0.75, "$42": 42, "007": 7}
    for text, value in values.items():
        assert numeric_value(text) == value, text
    for text in ("1/0", "\\frac{1}{0}", "x", "1e5", "\\sqrt{2}", "1,00", "9" * 300):
        assert numeric_value(text) is None, text


# ------------------------------------------------------------------------------------------ verdicts by hand


@pytest.mark.parametrize(
    "completion, truth, style, reason",
    [
        # gsm8k style: the fast exact path
        ("3 + 4 = 7.\n#### 7", "7", "gsm8k", "correct"),
        ("#### 1,000", "1000", "gsm8k", "correct"),
        ("#### 42.0", "42", "gsm8k", "correct"),
        ("#### $42", "42", "gsm8k", "correct"),
        ("#### 42 apples", "42", "gsm8k", "correct"),
        ("so the answer is 42", "42", "gsm8k", "correct"),  # no marker: the last number
        ("#### 41", "42", "gsm8k", "wrong"),
        ("#### -42", "42", "gsm8k", "wrong"),
        ("#### 42.5", "42", "gsm8k", "wrong"),
        ("I don't know", "42", "gsm8k", "unparseable"),
        # boxed style
        ("\\boxed{\\frac{1}{2}}", "0.5", "boxed", "correct"),
        ("\\boxed{0.5}", "\\frac{1}{2}", "boxed", "correct"),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac12", "boxed", "correct"),
        ("\\boxed{1/2}", "\\frac{1}{2}", "boxed", "correct"),
        ("\\boxed{50\\%}", "50", "boxed", "correct"),
        ("\\boxed{0.33}", "\\frac{1}{3}", "boxed", "wrong"),  # exact: a rounded decimal is not the fraction
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", "boxed", "wrong"),
        ("\\boxed{\\text{Monday}}", "\\text{Monday}", "boxed", "correct"),
        ("the answer is 1/2", "\\frac{1}{2}", "boxed", "unparseable"),
        ("\\boxed{1/2", "\\frac{1}{2}", "boxed", "unparseable"),
        # last_number style
        ("7 apples, so 12", "12", "last_number", "correct"),
        ("x = -3", "-3", "last_number", "correct"),
        ("3/4 of it", "0.75", "last_number", "correct"),
        ("12 then 13", "12", "last_number", "wrong"),
        ("none", "12", "last_number", "unparseable"),
    ],
)
def test_fast_path_verdicts(completion, truth, style, reason):
    v = check_answer(completion, truth, style=style)
    assert isinstance(v, MathVerdict)
    assert (v.reason, v.correct) == (reason, reason == "correct")


@pytest.mark.parametrize(
    "pred, truth, reason",
    [
        ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", "correct"),
        ("\\sqrt{12}", "2\\sqrt{3}", "correct"),
        ("\\frac{2}{\\sqrt{2}}", "\\sqrt{2}", "correct"),
        ("(1, 2]", "(1,2]", "correct"),
        ("1+x^2", "x^2+1", "correct"),
        ("\\frac{\\pi}{2}", "\\pi/2", "correct"),
        ("5 \\text{ cm}", "5", "correct"),
        ("x^2+2", "x^2+1", "wrong"),
        ("\\sqrt{2}", "2", "wrong"),
        ("[1, 2]", "(1,2]", "wrong"),
        ("__import__('os')", "3", "unparseable"),
        ("\\input{/etc/passwd}", "3", "unparseable"),
    ],
)
def test_symbolic_verdicts(worker, pred, truth, reason):
    v = check_answer(f"The answer is \\boxed{{{pred}}}.", truth, style="boxed", timeout_s=10.0)
    assert (v.reason, v.correct, v.extracted) == (reason, reason == "correct", pred)


def test_too_long_is_checked_before_parsing():
    text = "#### 7" + " " * 100
    assert check_answer(text, "7", style="gsm8k", max_chars=50) == MathVerdict(False, "too_long", None)
    assert check_answer(text, "7", style="gsm8k", max_chars=len(text)).correct


def test_timeout_kills_the_worker_and_the_next_call_works(worker):
    before = worker.restarts
    start = time.perf_counter()
    v = check_answer("\\boxed{9^{9^{9}}}", "3", style="boxed", timeout_s=0.5)
    elapsed = time.perf_counter() - start
    assert (v.reason, v.correct, v.extracted) == ("timeout", False, "9^{9^{9}}")
    assert elapsed < 0.5 + KILL_MARGIN_S
    assert worker.restarts == before + 1
    # The replacement was started in the background; the next symbolic call waits for it, then answers.
    start = time.perf_counter()
    assert check_answer("\\boxed{\\sqrt{27}}", "3\\sqrt{3}", style="boxed", timeout_s=10.0).reason == "correct"
    elapsed = time.perf_counter() - start
    print(f"first call after a kill (includes the replacement's fork): {1e3 * elapsed:.0f} ms")
    assert elapsed < 2.0  # a fork of the warm zygote, not a fresh import (~2-3 s)


def test_settings_are_validated():
    with pytest.raises(ValueError, match="answer style"):
        check_answer("1", "1", style="exact")
    for bad in (0, -1, True, "1", 601):
        with pytest.raises(ValueError, match="timeout_s"):
            check_answer("1", "1", style="last_number", timeout_s=bad)
    with pytest.raises(ValueError, match="max_chars"):
        check_answer("1", "1", style="last_number", max_chars=0)


def test_odd_ground_truths_never_raise():
    assert check_answer("#### 7", 7, style="gsm8k").correct  # numbers are accepted
    assert check_answer("#### 7", 7.0, style="gsm8k").correct
    for truth in (None, True, ["7"], {"a": 1}, "", "\x00", "{" * 1000):
        v = check_answer("#### 7", truth, style="gsm8k")
        assert v.reason in REASONS and not v.correct


# -------------------------------------------------------------------------------------------------- fuzzing


def _hostile(canary: Path) -> list[str]:
    c = str(canary)
    return [
        f"__import__('os').system('touch {c}')",
        f"open('{c}', 'w').write('x')",
        "9**9**9",
        "(lambda: 1)()",
        "().__class__.__bases__[0].__subclasses__()",
        "9^{9^{9}}",
        "2^{2^{2^{2^{2^{2}}}}}",
        "(10^{100})!",
        f"\\input{{{c}}}",
        f"\\immediate\\write18{{touch {c}}}",
        "\\def\\x{\\x}\\x",
        "\\newcommand{\\a}{\\a}\\a",
        "\\csname relax\\endcsname",
        "{" * 10_000 + "1" + "}" * 10_000,
        "{" * 10_000,
        "}" * 10_000,
        "(" * 5_000 + "1" + ")" * 5_000,
        "1" * 100_000,
        "-" + "9" * 100_000,
        "1," * 20_000,
        "\x00" * 100 + "1",
        "1\x00+1",
        "\ud800\udfff 7",  # lone surrogates
        "\ufffd\ufeff\u202e 7",
        "\u0663\u0664",  # Arabic-Indic digits
        "\uff11\uff12",  # fullwidth digits
        "\\frac{" * 3_000,
        "\\sqrt{" * 50 + "2" + "}" * 50,
        "\\\\" * 10_000,
        "$" * 10_000,
        "#" * 10_000,
        "x" * 1_000_000,
    ]


def _wrappings(h: str) -> list[str]:
    return [h, "#### " + h, "\\boxed{" + h + "}", "\\boxed{" + h, "so " + h + " is 7"]


def test_fuzz_hostile_inputs(worker, tmp_path, monkeypatch):
    """No exception escapes, no side effect (the canary file is never created), every reason is known, and every
    call stays under its bound: `timeout_s` + kill margin once the worker is ready."""
    monkeypatch.chdir(tmp_path)
    canary = tmp_path / "CANARY"
    timeout_s = 0.25
    worst = 0.0
    worst_input = ""
    times = []
    for h in _hostile(canary):
        for text in _wrappings(h):
            for style in STYLES:
                for truth in ("7", h[:300]):  # hostile ground truths too
                    assert mathcheck.start_worker(wait=True)  # the bound is stated for a started worker
                    start = time.perf_counter()
                    v = check_answer(text, truth, style=style, timeout_s=timeout_s, max_chars=200_000)
                    elapsed = time.perf_counter() - start
                    times.append(elapsed)
                    assert isinstance(v, MathVerdict) and v.reason in REASONS
                    assert v.correct == (v.reason == "correct")
                    if elapsed > worst:
                        worst, worst_input = elapsed, f"{style}: {text[:60]!r}"
    assert not canary.exists()
    assert not (tmp_path / "CANARY").exists()
    assert worst < timeout_s + KILL_MARGIN_S, worst_input
    times.sort()
    print(f"fuzz: {len(times)} calls, median {1e3 * times[len(times) // 2]:.2f} ms, worst {1e3 * worst:.0f} ms "
          f"({worst_input}), restarts {worker.restarts}")


def test_fuzz_default_cap_rejects_long_hostile_text_fast():
    start = time.perf_counter()
    for h in ("9" * 100_000, "{" * 100_000, "\\boxed{" * 20_000):
        for style in STYLES:
            assert check_answer(h, "7", style=style).reason == "too_long"
    assert time.perf_counter() - start < 0.1


def test_non_string_completions():
    for garbage in (None, 42, b"#### 7", ["#### 7"], object()):
        for style in STYLES:
            assert check_answer(garbage, "7", style=style) == MathVerdict(False, "unparseable", None)


def test_typical_call_is_microseconds():
    completion = "Tom has 3 apples and buys 4 more, so he has 3 + 4 = 7 apples.\n#### 7" * 5
    check_answer(completion, "7", style="gsm8k")
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        check_answer(completion, "7", style="gsm8k")
    per_call = (time.perf_counter() - start) / n
    print(f"gsm8k fast path: {1e6 * per_call:.1f} us per call")
    assert per_call < 1e-3


# --------------------------------------------------------------------------------------- threads and the audit


def test_bound_holds_off_the_main_thread(worker):
    results: dict[str, tuple[MathVerdict, float]] = {}

    def run(name, text, truth, timeout_s):
        start = time.perf_counter()
        v = check_answer(text, truth, style="boxed", timeout_s=timeout_s)
        results[name] = (v, time.perf_counter() - start)

    threads = [
        threading.Thread(target=run, args=("bomb", "\\boxed{10^{10^{10}}}", "3", 0.5)),
        threading.Thread(target=run, args=("sqrt", "\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 30.0)),
        threading.Thread(target=run, args=("frac", "\\boxed{\\frac{2}{4}}", "0.5", 30.0)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results["bomb"][0].reason == "timeout"
    assert results["sqrt"][0].reason == "correct"
    assert results["frac"][0].reason == "correct"
    assert results["frac"][1] < 0.05  # the fast path never waits for the worker


def test_math_verify_latex_path_never_parses_model_text_as_python(tmp_path):
    """The audit in mathcheck.py, as a regression test for math-verify upgrades: through the worker's checker,
    sympy's parse_expr (eval) only ever sees number tokens, never text with names or operators. (sympy's own
    module constants also pass through sympify when sympy.physics.units is imported, so it is imported first.)"""
    code = f"""
import json, sys, importlib.util
import sympy.physics.units  # imported lazily by the LaTeX path; its module constants ("kilo") go through sympify
import sympy.parsing.sympy_parser as sp
seen = []
orig = sp.parse_expr
def spy(s, *a, **k):
    seen.append(s)
    return orig(s, *a, **k)
sp.parse_expr = spy
import math_verify.parser, latex2sympy2_extended.latex2sympy2 as l2
math_verify.parser.parse_expr = spy
l2.parse_expr = spy
spec = importlib.util.spec_from_file_location("w", {str(Path(mathcheck._WORKER_PATH))!r})
w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
check = w.make_checker()
for text in json.loads(sys.stdin.read()):
    check(text, "3")
print(json.dumps(seen))
"""
    hostile = ["__import__('os').system('true')", "9**9**9", "1+2*3", "x**2", "\\frac{1}{2}", "2.5\\times10^{3}",
               "1,000", "(1,2]", "10!", "a_{1}", "\\operatorname{exec}(1)", "1e5", "\\$42", "5\\%"]
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(hostile), capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen, "the spy saw nothing: math-verify's code path changed, redo the audit"
    for s in seen:
        assert all(c in "0123456789.," for c in s), s


def test_worker_survives_fork_of_the_host(worker):
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    pid = os.fork()
    if pid == 0:  # child: must start its own worker, not talk over the parent's pipes
        code = 1
        try:
            ok = check_answer("\\boxed{\\sqrt{12}}", "2\\sqrt{3}", style="boxed", timeout_s=30.0).correct
            mathcheck.stop_worker()
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert check_answer("\\boxed{\\sqrt{18}}", "3\\sqrt{2}", style="boxed", timeout_s=30.0).correct

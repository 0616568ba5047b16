"""Verified math answers: extract the final answer of a completion and check it against a ground truth.

    extract_answer("... so 3 + 4 = 7.\\n#### 7", "gsm8k")        -> "7"
    check_answer("... \\boxed{\\frac{1}{2}}", "0.5", style="boxed") -> MathVerdict(True, "correct", "\\frac{1}{2}")

Answer styles (`STYLES`):
- "gsm8k": the text after the last "####" marker (its first number when that line has one, so "#### $1,000." gives
  "1,000"); without a marker, the last number of the text.
- "boxed": the contents of the last `\\boxed{...}` (or `\\fbox{...}`) with balanced braces; None when there is none
  or the last one is unbalanced (a cut-off final answer is not an answer).
- "last_number": the last number of the text ("-3", "1,000", "2.5", "3/4"; a "-" right after a letter, digit or ")"
  is an operator, not a sign).

`check_answer` is a pure function of its inputs that never raises on any completion or ground truth and never
executes model text. Tiers, cheapest first:
1. type and length cap (`max_chars`, checked before anything is parsed): reason "too_long";
2. extraction (linear-time regexes and a brace scan): nothing found -> "unparseable";
3. fast exact path, microseconds, in this process: normalised strings equal ("\\dfrac12" ~ "\\frac{1}{2}", "$42"
   ~ "42", "1{,}000" ~ "1,000") -> "correct"; both sides exact numbers -> exact rational comparison ("1,000" =
   "1000", "42.0" = "42", "\\frac{1}{2}" = "0.5" = "1/2", "50\\%" = "50"; "0.33" != "\\frac{1}{3}": a decimal
   that only approximates a fraction is wrong here, where math-verify would round it to 6 places);
4. symbolic path: math-verify's `parse`/`verify` (LaTeX extraction only) in a separate worker process, for answers
   that pass structural caps (<= 256 characters, printable, braces balanced, nesting <= 16, digit runs <= 64);
   "correct", "wrong", or "unparseable" when math-verify cannot read the prediction, "timeout" when the worker
   does not answer within `timeout_s` (its server is then killed and replaced) or dies (e.g. out of its 2 GiB
   address space). Verdicts of this tier are cached per (answer, ground truth) in the process, timeouts
   included, so a policy that repeats a pathological answer pays its timeout once.

Time bound (it holds in any thread: nothing relies on signals in this process). Tiers 1-3 are linear in the capped
input. Tier 4 waits at most `timeout_s` for the worker's answer, then has the server killed. The worker (the sandbox
server, envs/sandbox_server.py, running envs/_job_mathverify.py; its client is envs/sandbox.py) is a zygote: it
imports sympy and math-verify once, warms them up, and forks the server that answers; a kill (SIGKILL, which also
stops a C-level big-integer computation that no signal handler could) is followed by a fresh fork of the warm
zygote, so a timed-out call does not make the next one pay an import. The zygote starts on the first symbolic check
(or earlier, non-blocking, with `start_worker()`, as the dataset task does at construction); a call that finds it
still starting waits for it (up to STARTUP_TIMEOUT_S), so a verdict never depends on whether the worker was warm.
Calls from several threads share one worker and take turns on it (the fast tiers do not wait). Measured on this
project's 2 shared cores (`python -m benchmarks.mathcheck_timing`; ranges over runs at different machine load) and
in tests/test_envs_mathcheck.py:
- fast path: 9-30 us for a GSM8K-sized completion, 28-70 us for 1.9k characters, 10-25 ms for the worst hostile
  text at the 32,768-character cap; the fuzz test's median call is 0.05 ms;
- worker start: 1.2-3.5 s once per process (import and warm-up);
- symbolic check, fresh pair: median 12-24 ms, up to ~0.2 s for the first expression of a kind; cached ~45 us;
- timed-out call: `timeout_s` + under 10 ms (kill included), in the main thread or any other; the next call, which
  waits for the replacement fork, 60-100 ms. Worst call of the fuzz set (960 calls, timeout_s=0.25): 256 ms.

Audit of math-verify 0.9.0 / latex2sympy2_extended 1.11.0 (read in site-packages, then confirmed by spying on
sympy's `parse_expr` and `sympify` while parsing hostile strings):
- `math_verify.parse` with its default extraction configs includes ExprExtractionConfig, whose `extract_expr`
  calls `sympy.parse_expr(expr.replace("^", "**"), evaluate=False)` on a regex match of the model text: that is
  `eval` of transformed model text. Its regex admits only digits, ".", whitespace and + - * × / ^ ( ) ÷, so
  names cannot reach it, but "9**9**9" does (confirmed). We never pass ExprExtractionConfig: the worker uses
  `LatexExtractionConfig` only, on the already-extracted answer wrapped in `\\boxed{}`.
- The LaTeX path (`normalize_latex` regex rewrites, then `latex2sympy`'s ANTLR parser) builds sympy objects
  directly. Function names reach `getattr` only from fixed lists; unknown macros (`\\input`, `\\def`, `\\write`)
  are parse errors (nothing runs TeX, nothing opens files). Its one route into `sympify` (hence `parse_expr`/
  `eval`) is `sympy.Number(text)` for NUMBER/E_NOTATION tokens, whose text is digits, "," and "." (the spy saw
  only such strings); `FiniteSet`/`And` call `sympify` on already-built sympy objects. The parser's
  `variable_values` argument (the other `parse_expr` call) is never set by math-verify.
- The LaTeX path does build unevaluated powers and factorials that `verify` later evaluates: comparing
  "9^{9^{9}}" with "3" computes 9^387420489 in C, which no signal can interrupt (math-verify's own timeout is
  signal.alarm, main thread only). Hence the separate process with a hard kill and an address-space limit.
- `verify` compares sympy objects (simplify, evalf, set/interval logic) or normalised strings; it parses nothing.
- (The unit handling imports `sympy.physics.units` lazily, which passes sympy's own constant names such as
  "kilo" through `sympify` once: library text, not model text; the audit test imports it before spying.)
The worker is POSIX-only (fork, select on pipes), like the rest of objbench's process handling.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction

from .sandbox import SandboxClient, SandboxError, SandboxSpec, SandboxTimeout, shared_client

STYLES: tuple[str, ...] = ("gsm8k", "boxed", "last_number")
REASONS: tuple[str, ...] = ("correct", "wrong", "unparseable", "timeout", "too_long")

DEFAULT_MAX_CHARS = 32_768
"""Completions longer than this are "too_long" without being examined (a few thousand tokens of reasoning)."""
DEFAULT_TIMEOUT_S = 1.0
"""Seconds the symbolic tier may take for one check before the worker is killed."""
MAX_ANSWER_CHARS = 256
"""Extracted answers longer than this never reach the symbolic tier (MATH's longest answers are ~100 characters)."""
MAX_NESTING = 16
"""Deepest nesting of (), [], {} in an answer sent to the symbolic tier."""
MAX_DIGIT_RUN = 64
"""Longest run of digits in an answer sent to the symbolic tier."""
STARTUP_TIMEOUT_S = 120.0
"""Seconds a call waits for a starting worker before it gives up ("timeout")."""
WORKER_MEMORY_BYTES = 2 << 30
"""Address-space limit of the worker process (RLIMIT_AS)."""

_WORKER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_job_mathverify.py")
"""The per-job module of the symbolic worker (run by the sandbox server, envs/sandbox_server.py)."""

# A number: optional sign (only where it cannot be a binary minus), thousands groups, decimals, or a/b.
_NUMBER_RE = re.compile(
    r"(?:(?<![\w).])-)?(?<![\w.])(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d|,\d)|\d+(?:\.\d+)?(?:/\d+)?|\.\d+)"
)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
GSM8K_MARKER = "####"
"""The final-answer marker of GSM8K solutions."""


@dataclass(frozen=True)
class MathVerdict:
    """Outcome of `check_answer`."""

    correct: bool
    """The extracted answer equals the ground truth."""
    reason: str
    """One of REASONS: correct, wrong, unparseable (nothing extracted, or unreadable), timeout, too_long."""
    extracted: str | None
    """The extracted answer text (None when nothing was extracted or the completion was not examined)."""


# ---------------------------------------------------------------------------------------------------------------
# Extraction


def extract_answer(text: object, style: str) -> str | None:
    """The final answer of `text` in `style` (see module docstring), stripped; None when there is none.

    Never raises on any `text` (non-strings give None); an unknown `style` is a programming error (ValueError).
    """
    _check_style(style)
    if not isinstance(text, str):
        return None
    try:
        if style == "boxed":
            answer = _last_boxed(text)
        elif style == "gsm8k":
            answer = _gsm8k_answer(text)
        else:
            answer = _last_number(text)
    except Exception:  # pragma: no cover - the helpers are total; this keeps the promise if one is not
        return None
    if answer is None:
        return None
    answer = answer.strip()
    return answer or None


def _check_style(style: object) -> None:
    if style not in STYLES:
        raise ValueError(f"answer style must be one of {STYLES}, got {style!r}")


def _last_number(text: str) -> str | None:
    last = None
    for m in _NUMBER_RE.finditer(text):
        last = m
    return None if last is None else last.group(0)


def _gsm8k_answer(text: str) -> str | None:
    at = text.rfind(GSM8K_MARKER)
    if at < 0:
        return _last_number(text)
    line = text[at + len(GSM8K_MARKER) :].split("\n", 1)[0].strip()
    m = _NUMBER_RE.search(line)
    return m.group(0) if m else line


def _last_boxed(text: str) -> str | None:
    last = None
    for m in _BOXED_RE.finditer(text):
        last = m
    if last is None:
        return None
    depth, i, n = 1, last.end(), len(text)
    start = i
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # an escaped character (\{ \} \\) is content, not a group delimiter
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return None


# ---------------------------------------------------------------------------------------------------------------
# Fast exact path

_SPACING = re.compile(r"\\[,;:! ]|\\left|\\right|~|\s+")
_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox)\{([^{}]*)\}")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_FRAC = re.compile(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}")
_FRAC_SHORT = re.compile(r"(-?)\\frac(\d)(\d)")
_SLASH = re.compile(r"(-?\d+)/(\d+)")


def normalize_answer(answer: str) -> str:
    """Canonical text of an answer for exact comparison: no spacing macros or whitespace, no "$" or "\\$", no
    trailing "." or "%", "\\dfrac"/"\\tfrac" -> "\\frac", "\\text{x}" -> "x", "{,}" -> ",".

    A cheap rewrite, not a parser: two answers with equal normal forms are equal; unequal forms decide nothing.
    """
    s = _TEXT.sub(r"\1", answer)
    s = _SPACING.sub("", s)
    s = s.replace("\\$", "").replace("$", "").replace("{,}", ",")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.rstrip(".")
    if s.endswith("\\%"):
        s = s[:-2]
    elif s.endswith("%"):
        s = s[:-1]
    return s


def numeric_value(answer: str) -> Fraction | None:
    """The exact value of an answer that is a plain number (after `normalize_answer`), else None.

    Accepted: integers and decimals (with thousands commas), "a/b", "\\frac{a}{b}", "\\frac12". No exponents, no
    expressions; answers longer than MAX_ANSWER_CHARS are not examined.
    """
    if len(answer) > MAX_ANSWER_CHARS:
        return None
    s = normalize_answer(answer)
    try:
        if _THOUSANDS.fullmatch(s):
            return Fraction(s.replace(",", ""))
        if _DECIMAL.fullmatch(s):
            return Fraction(s)
        for pattern in (_FRAC, _FRAC_SHORT):
            m = pattern.fullmatch(s)
            if m:
                value = Fraction(int(m.group(2)), int(m.group(3)))
                return -value if m.group(1) else value
        m = _SLASH.fullmatch(s)
        if m:
            return Fraction(int(m.group(1)), int(m.group(2)))
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _symbolic_candidate(answer: str) -> bool:
    """Structural caps an answer must pass before the symbolic tier sees it (cheap, linear)."""
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return False
    try:
        answer.encode("utf-8")  # lone surrogates
    except UnicodeEncodeError:
        return False
    if any(not c.isprintable() and c not in " \t\n\r" for c in answer):  # NUL, control characters, unassigned
        return False
    depth = braces = run = 0
    i = 0
    while i < len(answer):
        c = answer[i]
        if c == "\\":
            i += 2
            run = 0
            continue
        if c in "([{":
            depth += 1
            if depth > MAX_NESTING:
                return False
        elif c in ")]}":
            depth = max(0, depth - 1)  # intervals like (1, 2] mix bracket kinds
        if c == "{":
            braces += 1
        elif c == "}":
            braces -= 1
            if braces < 0:
                return False
        run = run + 1 if c.isdigit() else 0
        if run > MAX_DIGIT_RUN:
            return False
        i += 1
    return braces == 0


# ---------------------------------------------------------------------------------------------------------------
# The check


def check_answer(
    completion: object,
    ground_truth: object,
    *,
    style: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> MathVerdict:
    """Whether the final answer of `completion` (extracted in `style`) equals `ground_truth` (a final answer, not
    a solution: "72", "\\frac{1}{2}"). See the module docstring for the tiers and the time bound.

    Never raises on any completion or ground truth; `style`, `timeout_s` and `max_chars` are settings, and invalid
    ones raise ValueError.
    """
    _check_style(style)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 600:
        raise ValueError(f"timeout_s must be a number in (0, 600], got {timeout_s!r}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"max_chars must be a positive int, got {max_chars!r}")
    try:
        if not isinstance(completion, str):
            return MathVerdict(False, "unparseable", None)
        if len(completion) > max_chars:
            return MathVerdict(False, "too_long", None)
        pred = extract_answer(completion, style)
        if pred is None:
            return MathVerdict(False, "unparseable", None)
        if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float)):
            return MathVerdict(False, "wrong", pred)  # no usable ground truth: nothing can match it
        gold = str(ground_truth).strip()
        return MathVerdict(*_compare(pred, gold, float(timeout_s)), pred)
    except Exception:  # a verifier must never take the training loop down
        return MathVerdict(False, "unparseable", None)


def _compare(pred: str, gold: str, timeout_s: float) -> tuple[bool, str]:
    if len(pred) <= MAX_ANSWER_CHARS and len(gold) <= MAX_ANSWER_CHARS:
        pred_norm, gold_norm = normalize_answer(pred), normalize_answer(gold)
        if pred_norm and pred_norm == gold_norm:
            return True, "correct"
        pred_value, gold_value = numeric_value(pred), numeric_value(gold)
        if pred_value is not None and gold_value is not None:
            return (True, "correct") if pred_value == gold_value else (False, "wrong")
    if not _symbolic_candidate(pred):
        return False, "unparseable"
    if not _symbolic_candidate(gold):
        return False, "wrong"  # a ground truth the symbolic tier cannot take is matched by normal form only
    result = _WORKER.check(pred, gold, timeout_s)
    return result == "correct", result


# ---------------------------------------------------------------------------------------------------------------
# The symbolic worker process (the shared sandbox client, envs/sandbox.py, under math-verify's policy)


def _worker_spec() -> SandboxSpec:
    """math-verify's policy: this process's environment and folder, RLIMIT_AS, output discarded, servers replaced
    after a time-out or a death."""
    return SandboxSpec(job=_WORKER_PATH, settings={"memory_bytes": WORKER_MEMORY_BYTES}, name="math-verify worker",
                       startup_timeout_s=STARTUP_TIMEOUT_S)


class _SymbolicChecks:
    """The verdicts of the symbolic tier: the worker's, cached per (pred, gold), timeouts included (a pair that
    once ran past its bound is not retried, so a policy repeating a pathological answer costs one timeout)."""

    _CACHE_SIZE = 4096

    def __init__(self, client: SandboxClient) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], str] = OrderedDict()

    @property
    def restarts(self) -> int:
        """Servers killed after a timeout, or replaced after they died (for tests and diagnostics)."""
        return self.client.restarts

    def check(self, pred: str, gold: str, timeout_s: float) -> str:
        key = (pred, gold)
        with self._lock:  # held while asking, so a pair asked by two threads at once is computed once
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
            result = self._ask(pred, gold, timeout_s)
            self._cache[key] = result
            if len(self._cache) > self._CACHE_SIZE:
                self._cache.popitem(last=False)
        return result

    def _ask(self, pred: str, gold: str, timeout_s: float) -> str:
        try:
            result = self.client.request({"pred": pred, "gold": gold}, (timeout_s,)).get("result")
        except (SandboxTimeout, SandboxError):  # past the bound, died, or could not start: the next call starts over
            return "timeout"
        return result if result in ("correct", "wrong", "unparseable") else "unparseable"


_WORKER = _SymbolicChecks(shared_client(_worker_spec))


def start_worker(wait: bool = False) -> bool:
    """Start the symbolic worker now, so that the first symbolic check does not wait for it; with `wait`, block
    until it is ready (up to STARTUP_TIMEOUT_S). Returns False when waiting failed."""
    return _WORKER.client.start(wait)


def stop_worker() -> None:
    """Kill the symbolic worker (it restarts on the next symbolic check)."""
    _WORKER.client.stop()

"""A safe evaluator for arithmetic expressions written by a model (countdown-style answers).

Never eval() model text (see REFERENCE.md, "Safety of verifiers"): a regex filter followed by eval() is open to
`9**9**9` (denial of service) and to code execution. This module instead

1. rejects anything that is not a str, is longer than `max_len`, or holds a character other than ASCII digits,
   `+ - * / ( )` and spaces (so no names, attributes, calls, `**` survives as Pow and is refused below, no unicode
   digits, no floats, no underscores);
2. rejects integer literals longer than `max_int_digits` and parenthesis nesting deeper than `max_depth` before
   parsing, so the parser never sees pathological input;
3. parses with `ast.parse(mode="eval")` (which builds a tree only, no code object) and walks the tree iteratively,
   allowing only int constants, binary + - * /, unary minus (optional) and the Expression root, with caps on node
   count and tree depth;
4. evaluates with exact `fractions.Fraction` arithmetic, refusing division by zero and any intermediate whose
   numerator or denominator exceeds `max_abs`.

`safe_eval` never raises on any input; it returns a `SafeEvalResult` with either a value or an error reason.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from fractions import Fraction

ERRORS = (
    "not_a_string",
    "empty",
    "too_long",
    "bad_char",
    "int_too_large",
    "too_deep",
    "too_many_nodes",
    "syntax_error",
    "disallowed",
    "division_by_zero",
    "magnitude",
    "internal",
)

_ALLOWED_CHARS = re.compile(r"[0-9+\-*/() ]*")
_DIGIT_RUN = re.compile(r"[0-9]+")
_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div)


@dataclass(frozen=True)
class SafeEvalResult:
    """value is the exact result when ok; error is one of ERRORS otherwise. literals: the integer constants in
    source order (what countdown checks against the given numbers); empty when the input was rejected early."""

    value: Fraction | None
    error: str | None
    literals: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class SafeEvalLimits:
    max_len: int = 256
    """Source characters."""
    max_int_digits: int = 12
    """Digits of any integer literal."""
    max_depth: int = 32
    """Parenthesis nesting and AST depth."""
    max_nodes: int = 256
    """AST nodes."""
    max_abs: int = 10**18
    """Bound on |numerator| and denominator of every intermediate value."""
    allow_unary_minus: bool = True
    """Whether "-x" is allowed (countdown forbids it: the given numbers are used as they are)."""


DEFAULT_LIMITS = SafeEvalLimits()


class _Reject(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def safe_eval(source: object, limits: SafeEvalLimits = DEFAULT_LIMITS) -> SafeEvalResult:
    """Evaluate an integer expression exactly, or say why not. Never raises, never executes the text."""
    try:
        return _safe_eval(source, limits)
    except _Reject as e:
        return SafeEvalResult(None, e.reason)
    except RecursionError:
        return SafeEvalResult(None, "too_deep")
    except Exception:  # anything unforeseen is a rejection, never a crash
        return SafeEvalResult(None, "internal")


def _safe_eval(source: object, limits: SafeEvalLimits) -> SafeEvalResult:
    if not isinstance(source, str):
        raise _Reject("not_a_string")
    if len(source) > limits.max_len:
        raise _Reject("too_long")
    if _ALLOWED_CHARS.fullmatch(source) is None:
        raise _Reject("bad_char")
    # The parser refuses leading indentation in eval mode; spaces around the expression are harmless.
    source = source.strip(" ")
    if not source:
        raise _Reject("empty")
    if any(len(run) > limits.max_int_digits for run in _DIGIT_RUN.findall(source)):
        raise _Reject("int_too_large")
    depth = 0
    for ch in source:
        if ch == "(":
            depth += 1
            if depth > limits.max_depth:
                raise _Reject("too_deep")
        elif ch == ")":
            depth -= 1
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError):
        raise _Reject("syntax_error") from None
    literals = _check_tree(tree, limits)
    value = _evaluate(tree.body, limits)
    return SafeEvalResult(value, None, literals)


def _check_tree(tree: ast.Expression, limits: SafeEvalLimits) -> tuple[int, ...]:
    """Whitelist every node (iteratively, so depth cannot overflow the stack); return the int literals in order."""
    literals: list[int] = []
    stack: list[tuple[ast.AST, int]] = [(tree.body, 1)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise _Reject("too_many_nodes")
        if depth > limits.max_depth:
            raise _Reject("too_deep")
        if isinstance(node, ast.BinOp) and isinstance(node.op, _BINOPS):
            stack.append((node.right, depth + 1))  # pushed first so the left operand is visited first
            stack.append((node.left, depth + 1))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and limits.allow_unary_minus:
            stack.append((node.operand, depth + 1))
        elif isinstance(node, ast.Constant) and type(node.value) is int:  # not bool, float, complex, str
            literals.append(node.value)
        else:
            raise _Reject("disallowed")
    return tuple(literals)


def _evaluate(node: ast.AST, limits: SafeEvalLimits) -> Fraction:
    # Recursion depth is bounded by limits.max_depth, checked in _check_tree.
    if isinstance(node, ast.Constant):
        return _bounded(Fraction(node.value), limits)
    if isinstance(node, ast.UnaryOp):
        return -_evaluate(node.operand, limits)
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left, limits)
        right = _evaluate(node.right, limits)
        if isinstance(node.op, ast.Add):
            return _bounded(left + right, limits)
        if isinstance(node.op, ast.Sub):
            return _bounded(left - right, limits)
        if isinstance(node.op, ast.Mult):
            return _bounded(left * right, limits)
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise _Reject("division_by_zero")
            return _bounded(left / right, limits)
    raise _Reject("disallowed")  # unreachable after _check_tree


def _bounded(x: Fraction, limits: SafeEvalLimits) -> Fraction:
    # Both operands of every operation are bounded, so no single step can build a huge number before this check.
    if abs(x.numerator) > limits.max_abs or x.denominator > limits.max_abs:
        raise _Reject("magnitude")
    return x

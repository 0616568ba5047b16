"""The math-verify job of the sandbox server (envs/sandbox_server.py): `envs.mathcheck`'s symbolic tier.

Loaded by path in the worker process, never imported by objbench. Requests {"pred": str, "gold": str}, both
already-extracted answers that passed mathcheck's structural caps; replies {"result": r} with r in "correct", "wrong",
"unparseable". The zygote imports math-verify and warms it up (`warm`); its forked servers answer. Nothing here has a
timeout of its own (math-verify's use signal.alarm, which cannot interrupt a long C-level big-integer operation
anyway): the client's wall clock and the server's kill are the bound.

Only math-verify's LaTeX extraction is used, never its ExprExtractionConfig (see the audit in mathcheck.py).
"""


def make_checker():
    """check(pred, gold) -> "correct" | "wrong" | "unparseable", through math-verify's LaTeX path only."""
    import logging

    logging.disable(logging.CRITICAL)  # math-verify warns once per process that its timeouts are off
    import sympy
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(try_extract_without_anchor=False, boxed_match_priority=0)]

    def parse_answer(text: str) -> list:
        # The answer is wrapped in \boxed{} (its braces are balanced, mathcheck checked), so exactly the boxed
        # pattern matches; fallback_mode="first_match" adds the normalised string for string equality.
        return parse("\\boxed{" + text + "}", config, parsing_timeout=None)

    def check(pred: str, gold: str) -> str:
        gold_parsed = parse_answer(gold)
        pred_parsed = parse_answer(pred)
        if not pred_parsed:
            return "unparseable"
        if gold_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None):
            return "correct"
        symbolic = any(isinstance(p, (sympy.Basic, sympy.MatrixBase)) for p in pred_parsed)
        return "wrong" if symbolic else "unparseable"

    return check


def warm(settings: dict):
    """The checker, warmed up: the first parse of each construct is slow (lazy imports, ANTLR tables)."""
    check = make_checker()
    for gold, pred in (("\\frac{1}{2}", "0.5"), ("x^2+1", "1+x^2"), ("(1,2]", "(1, 2]"), ("\\sqrt{2}", "2")):
        check(pred, gold)
    return check


def handle(check, request: dict, reply) -> None:
    """One check; anything it raises is "unparseable"."""
    try:
        result = check(str(request["pred"]), str(request["gold"]))
    except BaseException:  # noqa: BLE001 - MemoryError under the address-space limit, RecursionError, sympy bugs
        result = "unparseable"
    reply({"result": result})

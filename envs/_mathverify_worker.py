"""Worker process of `envs.mathcheck`'s symbolic tier; run by path (`python <this file> <memory limit bytes>`).

Protocol: one JSON object per line on stdin, {"id": n, "pred": str, "gold": str}, both already-extracted answers
that passed mathcheck's structural caps; one JSON object per line on stdout, {"id": n, "result": r} with r in
"correct", "wrong", "unparseable". This process imports math-verify, warms it up, then forks the server that
answers; each server starts by writing {"ready": true, "pid": p}. The parent enforces the time bound: SIGUSR1
to this process kills the server, and a fresh fork (milliseconds, already warm) announces itself. Nothing here
has a timeout of its own (math-verify's use signal.alarm, which cannot interrupt a long C-level big-integer
operation anyway). Everything exits when stdin closes.

Only math-verify's LaTeX extraction is used, never its ExprExtractionConfig (see the audit in mathcheck.py).
"""

import json
import os
import signal
import sys


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


def serve(check, out) -> None:
    """The forked server: announce itself, then answer requests until stdin closes (exit 0)."""
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            rid = request["id"]
        except Exception:
            continue
        try:
            result = check(str(request["pred"]), str(request["gold"]))
        except BaseException:  # MemoryError under the address-space limit, RecursionError, sympy bugs
            result = "unparseable"
        out.write(json.dumps({"id": rid, "result": result}) + "\n")  # one write: < PIPE_BUF, atomic
        out.flush()


def main() -> None:
    # sys.path[0] is this file's folder (envs/): drop it so no module there can shadow a library module.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    # Keep the protocol channel private: anything a library prints goes to stderr (the parent discards it).
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    try:
        import resource

        limit = int(sys.argv[1]) if len(sys.argv) > 1 else 0
        if limit > 0:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a huge expression dies here, not the host
    except Exception:
        pass

    check = make_checker()
    for gold, pred in (("\\frac{1}{2}", "0.5"), ("x^2+1", "1+x^2"), ("(1,2]", "(1, 2]"), ("\\sqrt{2}", "2")):
        check(pred, gold)  # warm-up: the first parse of each construct is slow (lazy imports, ANTLR tables)

    # Zygote: this warmed process never checks anything itself; it forks a server and waits. The parent interrupts
    # a server stuck past its deadline with SIGUSR1 to this process, which kills the server (a pid this process
    # has not reaped yet, so never a reused one) and forks a fresh, warm one in milliseconds.
    child = 0

    def interrupt(signum, frame):
        if child:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass

    signal.signal(signal.SIGUSR1, interrupt)
    while True:
        child = os.fork()
        if child == 0:
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            code = 1
            try:
                serve(check, out)
                code = 0
            finally:
                os._exit(code)  # never fall back into the zygote's loop
        _, status = os.waitpid(child, 0)
        child = 0
        if not os.WIFSIGNALED(status):
            return  # stdin closed (exit 0) or the pipes broke (exit 1): the parent is gone or done


if __name__ == "__main__":
    main()

"""Time bound of envs.mathcheck.check_answer: the numbers quoted in the envs/mathcheck.py docstring.

    python -m benchmarks.mathcheck_timing

Prints per-call times of the fast exact path (typical and at the character cap), the symbolic worker's start,
fresh and cached symbolic checks, and timed-out calls (overrun past timeout_s, in the main thread and in another
thread, and the call after the kill). About 15 s on 2 cores; nothing is written.
"""

from __future__ import annotations

import statistics
import threading
import time

from objbench.envs import mathcheck


def _timed(f, n: int = 1):
    start = time.perf_counter()
    for _ in range(n):
        out = f()
    return (time.perf_counter() - start) / n, out


def main() -> None:
    check = mathcheck.check_answer
    short = "Tom has 3 apples and buys 4 more, so he has 3 + 4 = 7 apples.\n#### 7"
    t, _ = _timed(lambda: check(short, "7", style="gsm8k"), 5000)
    print(f"fast path, {len(short)}-char gsm8k completion: {1e6 * t:.1f} us")
    longer = "Reasoning with 12 numbers like 3.5 and 1,000. " * 40 + "\\boxed{\\frac{1}{2}}"
    t, _ = _timed(lambda: check(longer, "0.5", style="boxed"), 2000)
    print(f"fast path, {len(longer)}-char boxed completion: {1e6 * t:.1f} us")
    cap = mathcheck.DEFAULT_MAX_CHARS
    hostile = ["1," * cap, "-1" * cap, "1." * cap, "{" * cap, "\\boxed{" * cap, "- " * cap, "9" * cap, "a1 " * cap]
    worst = max(_timed(lambda: check(h[:cap], "7", style=s))[0] for h in hostile for s in mathcheck.STYLES)
    print(f"fast path, worst hostile text at the {cap}-char cap: {1e3 * worst:.1f} ms")

    t, _ = _timed(lambda: mathcheck.start_worker(wait=True))
    print(f"worker start (import sympy and math-verify, warm-up): {t:.2f} s")
    fresh = []
    for k in range(2, 40):
        pred, truth = f"\\boxed{{\\sqrt{{{2 * k * k}}}}}", f"{k}\\sqrt{{2}}"
        t, v = _timed(lambda: check(pred, truth, style="boxed", timeout_s=30))
        assert v.correct, v
        fresh.append(t)
    print(f"symbolic check, fresh pair: median {1e3 * statistics.median(fresh):.1f} ms, max {1e3 * max(fresh):.1f} ms")
    t, _ = _timed(lambda: check("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", style="boxed"), 1000)
    print(f"symbolic check, cached pair: {1e6 * t:.1f} us")

    timeout_s = 0.25
    for k in range(3):
        t, v = _timed(lambda: check(f"\\boxed{{{7 + k}^{{9^{{9}}}}}}", "3", style="boxed", timeout_s=timeout_s))
        assert v.reason == "timeout", v
        after, _ = _timed(lambda: check(f"\\boxed{{\\sqrt{{{50 + k}}}}}", "1", style="boxed", timeout_s=30))
        print(f"timed-out call: timeout_s + {1e3 * (t - timeout_s):.1f} ms; next call (new fork) {1e3 * after:.0f} ms")
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(t=_timed(lambda: check("\\boxed{5^{9^{9}}}", "3", style="boxed", timeout_s=0.5)))
    )
    thread.start()
    thread.join()
    t, v = result["t"]
    print(f"timed-out call off the main thread: timeout_s + {1e3 * (t - 0.5):.1f} ms ({v.reason})")
    mathcheck.stop_worker()


if __name__ == "__main__":
    main()

"""Progress on the console: a tqdm bar when stderr is a terminal; otherwise (a log file, a pipe) no bar at all, only
whole lines (a bar redrawn into a file floods it with carriage-return fragments)."""

from __future__ import annotations

import sys


class LineProgress:
    """What the loop and the sweep call on a tqdm bar (write, update, set_postfix, close), for a log file: ``write``
    prints its line to stdout (as tqdm.write does); the rest print nothing. A run prints one line per evaluation
    instead (``eval_line``)."""

    def __init__(self, total: int, initial: int = 0):
        self.total, self.n = total, initial

    def write(self, text: str) -> None:
        print(text, flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, **values) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, unit: str, initial: int = 0, terminal: bool | None = None):
    """A tqdm bar on a terminal (``terminal``: None asks stderr), else a LineProgress."""
    if terminal is None:
        terminal = sys.stderr.isatty()
    if not terminal:
        return LineProgress(total, initial)
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True)


def eval_line(name: str, step: int, steps: int, row: dict) -> str:
    """One line per evaluation, for a log file: the run, the step and the held-out metrics."""
    shown = [f"{k} {row[k]:.3f}" for k in ("eval/pass@1", "eval/acc", "reward/acc") if isinstance(row.get(k), float)]
    return f"{name} step {step}/{steps}: " + ", ".join(shown)

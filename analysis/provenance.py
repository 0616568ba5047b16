"""Where a report came from: the code that made it (commit, clean or dirty tree), library versions, the command, and
the runs' wall time; and the rule that a report is not written into the repository's results/ from a dirty tree.

Decisions:

- "Dirty" means a tracked file differs from the commit (``git status --porcelain --untracked-files=no``), as the
  training loop's ``-dirty`` commit suffix does, leaving out changes under ``results/``: a report's own files
  there are outputs, not the code that made the numbers.
- The refusal applies to an output folder inside ``<repository>/results/`` that git does not ignore (the committed
  results); ``results/runs/`` is ignored, so ``objbench sweep`` still writes its report there from any tree.
- Versions are read with ``importlib.metadata`` (no import of torch just to print its version); a package that is
  not installed is listed as "not installed".
- Wall time comes from each run's meta.json ``start``/``end`` (ISO times). A resumed run's meta.json holds the
  start of its last segment only, so its wall time undercounts; the report says how many runs were resumed.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

__all__ = [
    "LIBRARIES",
    "DirtyTreeError",
    "git_state",
    "library_versions",
    "repo_root",
    "committed_results_path",
    "check_clean",
    "wall_time",
]

LIBRARIES = ("torch", "transformers", "numpy", "scipy", "pandas", "matplotlib", "datasets", "math-verify")
"""Packages whose versions a report records (python's too)."""


class DirtyTreeError(RuntimeError):
    """A report would be written into the committed results/ from a tree with uncommitted changes."""


def _git(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None


def repo_root(path: str | Path | None = None) -> Path | None:
    """The git work tree holding ``path`` (default: this package's checkout), or None outside git."""
    here = Path(path) if path is not None else Path(__file__).resolve().parent
    p = _git(["rev-parse", "--show-toplevel"], here if here.is_dir() else here.parent)
    if p is None or p.returncode != 0 or not p.stdout.strip():
        return None
    return Path(p.stdout.strip())


def git_state(path: str | Path | None = None) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None, "changed": [paths]}`` of the work tree holding ``path``
    (default: the checkout this package runs from). ``changed`` lists modified tracked files outside results/."""
    root = repo_root(path)
    if root is None:
        return {"commit": None, "dirty": None, "changed": []}
    head = _git(["rev-parse", "HEAD"], root)
    commit = head.stdout.strip() if head is not None and head.returncode == 0 else None
    st = _git(["status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"], root)
    if st is None or st.returncode != 0:
        return {"commit": commit, "dirty": None, "changed": []}
    changed = [ln[3:] for ln in st.stdout.splitlines() if ln.strip()]
    return {"commit": commit, "dirty": bool(changed), "changed": changed}


def library_versions(names: Sequence[str] = LIBRARIES) -> dict[str, str]:
    """``{"python": "3.11.7", "torch": ..., ...}`` from installed package metadata; "not installed" if absent."""
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = "not installed"
    return out


def committed_results_path(out_dir: str | Path, root: Path | None = None) -> bool:
    """True when ``out_dir`` lies in ``<root>/results/`` (root: this checkout) and git does not ignore it."""
    root = root if root is not None else repo_root()
    if root is None:
        return False
    out = Path(out_dir).resolve()
    results = (root / "results").resolve()
    if out != results and results not in out.parents:
        return False
    probe = out / "report.md"  # check-ignore answers for paths that need not exist
    p = _git(["check-ignore", "-q", str(probe)], root)
    return not (p is not None and p.returncode == 0)


def check_clean(out_dir: str | Path, force: bool = False, state: dict | None = None,
                root: Path | None = None) -> dict:
    """Refuse (DirtyTreeError) to write a report into the committed results/ from a dirty tree unless ``force``.

    Returns the git state used (see :func:`git_state`), so the report can record it.
    """
    state = state if state is not None else git_state(root)
    if state.get("dirty") and not force and committed_results_path(out_dir, root):
        changed = ", ".join(state.get("changed", [])[:8])
        raise DirtyTreeError(
            f"refusing to write a report into {out_dir} (the committed results/) from a dirty tree: uncommitted "
            f"changes to {changed}. Commit them first, or pass force=True (objbench report --force), and the report "
            "will say at its top that it was made from a dirty tree.")
    return state


def _parse_time(s) -> datetime | None:
    if not isinstance(s, str) or not s:
        return None
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None


def wall_time(runs: Sequence[dict]) -> dict[str, Any]:
    """Wall time of runs from their meta.json ``start``/``end``.

    Args:
        runs: dicts with ``start``, ``end`` (ISO strings or None) and optionally ``resumed_from_step``.

    Returns:
        ``{"runs_timed", "runs_untimed", "runs_resumed", "total_s" (sum over runs), "longest_s", "span_s" (first
        start to last end), "first_start", "last_end"}``; seconds as floats, None where nothing was timed.
    """
    spans, starts, ends = [], [], []
    untimed = resumed = 0
    for r in runs:
        a, b = _parse_time(r.get("start")), _parse_time(r.get("end"))
        if r.get("resumed_from_step"):
            resumed += 1
        if a is None or b is None or (a.tzinfo is None) != (b.tzinfo is None):
            untimed += 1
            continue
        spans.append((b - a).total_seconds())
        starts.append(a)
        ends.append(b)
    span = None
    if starts and len({s.tzinfo is None for s in starts + ends}) == 1:
        span = (max(ends) - min(starts)).total_seconds()
    return {"runs_timed": len(spans), "runs_untimed": untimed, "runs_resumed": resumed,
            "total_s": float(sum(spans)) if spans else None, "longest_s": float(max(spans)) if spans else None,
            "span_s": span, "first_start": min(starts).isoformat() if starts else None,
            "last_end": max(ends).isoformat() if ends else None}


def format_seconds(s: float | None) -> str:
    """``3725.0 -> '1h 2m 5s'``; None -> 'n/a'."""
    if s is None:
        return "n/a"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m}m {sec}s" if h else (f"{m}m {sec}s" if m else f"{sec}s")

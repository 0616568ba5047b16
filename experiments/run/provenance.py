"""What a run records about where it ran: git commit, library versions, the CPU's kernel path, peak memory."""

from __future__ import annotations

import hashlib
import platform
import resource
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from objbench.experiments.config.plugins import records as plugin_records
from objbench.rollout.models import n_params

if TYPE_CHECKING:  # annotations only
    from objbench.experiments.config import TrainConfig
    from objbench.experiments.run.loop_state import LoopState
    from objbench.experiments.run.setup import Setup


def git_commit() -> str:
    try:
        here = Path(__file__).resolve().parents[2]
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def unknown_commit_warning(commit: str) -> str | None:
    """The warning to print when runs cannot be tied to a commit: objbench's code is not in a git checkout (a
    ``pip install`` without ``-e``, or ``--target`` copy), so meta.json and sweep.json record "unknown". None when
    the commit is known."""
    if commit != "unknown":
        return None
    where = Path(__file__).resolve().parents[2]
    return (f"warning: objbench runs from {where}, which is not a git checkout, so these runs record commit "
            f"'unknown' and their report cannot name the code that made them; for results you will cite, install "
            f"from a clean checkout at the commit you want (pip install -e .)")


def cpu_signature() -> str:
    """The CPU model, the kernel set torch dispatches to and a digest of the CPU flags ("Intel(R) Xeon(R)
    Processor | AVX512 | flags 1a2b3c4d"). Float32 CPU training is bit-identical only on the same kernel path: the
    same config and seed on another CPU kind give other numbers (measured: the quickstart's 6000-step warm start,
    see tests/test_reproduce.py)."""
    info: dict[str, str] = {}  # the first "model name" and "flags" lines of /proc/cpuinfo
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
                if "model name" in info and "flags" in info:
                    break
    except OSError:
        pass
    model = info.get("model name") or platform.processor() or platform.machine()
    # virtual machines often hide the model; the flags tell kinds apart
    flags = hashlib.sha256(" ".join(sorted(info["flags"].split())).encode()).hexdigest()[:8] if "flags" in info else ""
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - older torch
        cap = "unknown"
    return f"{model} | {cap}" + (f" | flags {flags}" if flags else "")


def versions() -> dict:
    import numpy
    import transformers
    v = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
         "numpy": numpy.__version__, "platform": platform.platform(), "cpu": cpu_signature()}
    try:
        import importlib.metadata as md
        v["objbench"] = md.version("objbench")
    except Exception:  # not installed (running from a checkout)
        v["objbench"] = "checkout"
    for package in ("reasoning-gym", "math-verify", "vllm"):  # where installed: tasks, verifier, engine
        try:
            v[package] = md.version(package)
        except Exception:
            pass
    return v


def _vmhwm_kb() -> int | None:
    """VmHWM of /proc/self/status in KiB (None where there is no such file: not Linux)."""
    try:
        with open("/proc/self/status", "rb") as f:  # plain bytes: ~4x cheaper than Path.read_text().splitlines()
            text = f.read()
        i = text.find(b"VmHWM:")
        if i >= 0:
            return int(text[i + 6:text.index(b"\n", i)].split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return None


# ru_maxrss (KiB) inherited from the parent at exec, where it exceeded this process's own peak; -1 once
# ru_maxrss is known to be this process's own peak; None before the first call
_INHERITED_MAXRSS: int | None = None


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB, its own peak even in a worker: on Linux ru_maxrss = max(the
    peak inherited from the parent across fork + exec, own peak), so VmHWM (reset at exec) is read until
    ru_maxrss has grown past what was inherited, and ru_maxrss from then on: the same high-water mark, read from
    the kernel's per-CPU RSS counters without summing them (so within their slack: measured 0.27 MB of 465 MB),
    at ~10 us instead of the ~100 us that reading /proc/self/status takes right after a training step's
    multi-threaded kernels. Elsewhere ru_maxrss."""
    global _INHERITED_MAXRSS
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if _INHERITED_MAXRSS is not None and ru > _INHERITED_MAXRSS:
        return ru / 1024
    hwm = _vmhwm_kb()
    if hwm is None:
        return ru / 1024
    if _INHERITED_MAXRSS is None:
        # ru == hwm: ru is the own peak from now on (it only grows); ru > hwm: ru is the parent's peak
        _INHERITED_MAXRSS = -1 if ru <= hwm else ru
    return hwm / 1024


def run_meta(cfg: TrainConfig, s: Setup, state: LoopState, model_info: dict | None, extra: dict | None) -> dict:
    """meta.json: what identifies the run beside its config (commit, versions, host, threads, start policy)."""
    return {"run": cfg.run_name, "seed": cfg.seed, "data_seed": cfg.effective_data_seed,
            "objective": cfg.objective.name, "commit": git_commit(), "versions": versions(),
            "host": socket.gethostname(), "threads": torch.get_num_threads(),
            "start": datetime.now(timezone.utc).isoformat(timespec="seconds"), "end": None,
            "resumed_from_step": state.step or None, "sft": s.sft_info,
            "device": str(s.device), "dtype": cfg.model.dtype, "special_ids": s.codec.special,
            "chat_template": s.codec.chat, "model": model_info or {"arch": cfg.model.arch},
            "n_params": n_params(s.policy), "argv": sys.argv,
            # a reasoning-gym scorer that evaluates the model's text, allowed by task.allow_unsafe_scorer=true
            "unsafe_scorer": bool(getattr(s.task, "unsafe_scorer", False)),
            "plugins": plugin_records(), **(extra or {})}

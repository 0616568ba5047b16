"""Test-only: a folder to put on PYTHONPATH so that every Python process started with OBJBENCH_TEST_CRASH_AT_STEP
set installs tests/crash_run.py's crash callback at start-up. For processes that never run crash_run.py as
their main module: a Ray cluster's workers (tests/test_sweep_ray.py)."""

import os
import sys

if os.environ.get("OBJBENCH_TEST_CRASH_AT_STEP"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import crash_run  # noqa: F401  (installs the callback on import)

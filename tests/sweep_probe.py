"""A job for experiments.workers tests, in a module that imports nothing heavy (a worker unpickles it by
importing this module; the test module itself imports torch)."""

import os
import time


def probe(delay: float):
    """(pid, CUDA_VISIBLE_DEVICES, start, end) of a job that sleeps ``delay`` seconds."""
    t0 = time.time()
    time.sleep(delay)
    return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES"), t0, time.time()

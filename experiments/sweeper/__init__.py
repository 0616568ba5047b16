"""Sweeps: a spec's arms x seeds run as jobs (sweep.py), the spec's keys and checks (spec.py), the local and Ray
workers (workers.py), and regenerating a committed run (reproduce.py). The spec files themselves live in
experiments/sweeps/. Stands on the run and on analysis (a sweep ends with its report)."""

"""python -m objbench ... : the same as the ``objbench`` command."""

from objbench.experiments.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())

"""One-off studies outside the installed package, run from the repository root: python -m studies.<name>."""

"""The command line (main.py: `objbench ...`), the Python API (api.py: `objbench.train`, `objbench.sweep`, ...),
`objbench bench` and the greedy probe. The top layer: may import every other package."""

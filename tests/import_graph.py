"""What an import statement names of objbench (for the tests that check which package imports which)."""

import ast


def objbench_subpackages(node) -> list[str]:
    """The objbench subpackages an import statement names: `import objbench.envs.x`, `from objbench.envs import
    y` and `from objbench import envs` all give 'envs'. Relative imports stay inside their own package."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
        mod = node.module or ""
        names = [f"{mod}.{a.name}" for a in node.names] if mod == "objbench" else [mod]
    else:
        return []
    return [n.split(".")[1] for n in names if n.startswith("objbench.")]

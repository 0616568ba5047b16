"""Every config field with its type, default and doc line, read from the dataclasses' source with `ast`.

`objbench train --help` prints this without importing torch (the config modules import algos, which imports
torch; reading the source keeps `--help` instant). The source is the single place the fields are documented,
so this listing cannot drift from them; tests/test_cli.py checks it against the live dataclasses.
"""

from __future__ import annotations

import ast
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]  # the repository (or the installed objbench/ folder)
_SOURCES = (_ROOT / "experiments" / "config" / "schema.py", _ROOT / "algos" / "config.py",
            _ROOT / "algos" / "schedules.py")
_TOP = "TrainConfig"


def _classes() -> dict[str, list[tuple[str, str, str, str]]]:
    """class name -> [(field, type, default source, doc line)] for every dataclass in the config sources."""
    out: dict[str, list] = {}
    for src in _SOURCES:
        tree = ast.parse(src.read_text())
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            rows = []
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    doc = ""
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant) \
                            and isinstance(nxt.value.value, str):
                        doc = " ".join(nxt.value.value.split())
                    default = ast.get_source_segment(src.read_text(), stmt.value) if stmt.value is not None else ""
                    rows.append((stmt.target.id, ast.unparse(stmt.annotation), default or "", doc))
            if rows:
                out[node.name] = rows
    return out


def _default_text(default: str) -> str:
    """What `--help` prints as a field's default: the value's source, or for ``field(...)`` its ``default=``
    keyword's source (``preset NAME`` for a preset factory, nothing for another factory)."""
    node = ast.parse(default, mode="eval").body if default else None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "field"):
        return default
    kw = {k.arg: k.value for k in node.keywords}
    if "default" in kw:
        return ast.unparse(kw["default"])
    factory = kw.get("default_factory")
    if isinstance(factory, ast.Lambda) and isinstance(factory.body, ast.Subscript) \
            and getattr(factory.body.value, "id", "") == "PRESETS":
        return f"preset {ast.literal_eval(factory.body.slice)}"
    return ""


def field_rows() -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, doc) for every leaf field of the run config, objective included."""
    classes = _classes()
    rows: list = []

    def walk(cls: str, prefix: str):
        for name, typ, default, doc in classes[cls]:
            if typ in classes:
                walk(typ, f"{prefix}{name}.")
            else:
                rows.append((f"{prefix}{name}", typ, _default_text(default), doc))

    walk(_TOP, "")
    return rows


def format_fields(width: int = 110) -> str:
    import textwrap

    lines = ["config fields (key=value on the command line; `objbench config ...` prints the resolved config):"]
    for key, typ, default, doc in field_rows():
        head = f"  {key} ({typ}{', default ' + default if default else ''})"
        lines.append(head)
        if doc:
            lines.extend(textwrap.wrap(doc, width=width, initial_indent="      ", subsequent_indent="      "))
    lines.append("  task.<setting>: the chosen task's own settings (envs/<task>.py), validated when the config loads")
    return "\n".join(lines)

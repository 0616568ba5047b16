"""Plug-ins: a researcher's own objective parts, tasks or engines, loaded into objbench's registries.

A plug-in is a Python file or an importable module that registers members into the registries the built-ins use
(``objbench.algos.SURROGATES``, ``ADVANTAGE_ESTIMATORS``, ``AGGREGATION_MODES``, ``KL_ESTIMATORS``, ...,
``objbench.envs.register_task``, ``objbench.rollout.register_engine``). Three ways to load one:

- ``objbench train|config|sweep|bench --import my_gpg.py`` (repeatable; a file path or a module name);
- ``imports: [my_gpg.py]`` in a sweep spec (file paths relative to the spec's folder);
- the entry-point group ``objbench.plugins`` of an installed package (loaded by every command, always).

``load_plugins(specs)`` loads them in the process that validates the config; sweeps hand the loaded ``Plugin``
records to every local worker and Ray task (``ensure_loaded``), which load them before they touch a config: a Ray
node without the file loads the source text that travelled with the task. A plug-in that is missing or raises stops
the command with ``PluginError`` naming it, before any config is validated or run folder written.

Each run's meta.json lists the plug-ins it ran with (``records()``: what was asked, the file, its sha256). The
plug-ins are not part of a run's identity (its config): resuming a run whose plug-in file has changed since warns
(``resume_warning``) and goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from objbench.experiments.config.errors import ConfigError, one_line

__all__ = ["ENTRY_POINT_GROUP", "Plugin", "PluginError", "load_plugins", "ensure_loaded", "loaded", "records",
           "resume_warning"]

ENTRY_POINT_GROUP = "objbench.plugins"


class PluginError(ConfigError):
    """A plug-in that cannot be loaded (missing, or raised while importing), or a member that fails its check."""


@dataclass(frozen=True)
class Plugin:
    """One loaded plug-in: ``spec`` as the user wrote it, ``kind`` file | module | entry point, the file it came
    from, that file's sha256 and (files only) its source text, which travels to Ray nodes."""

    spec: str
    kind: str
    path: Optional[str]
    sha256: Optional[str]
    source: Optional[str] = None

    @property
    def label(self) -> str:
        return self.spec if self.kind != "entry point" else f"entry point {self.spec}"

    def record(self) -> dict:
        return {"spec": self.spec, "kind": self.kind, "path": self.path, "sha256": self.sha256}


_LOADED: dict = {}  # key (absolute path, module name or entry point) -> Plugin
_ENTRY_POINTS_LOADED = [False]  # set once this process has loaded the installed entry points


def _sha256(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


def _is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec


IMPORT_TIMEOUT_S = 120.0  # a plug-in whose import takes longer (a hang, a download) stops the command


class _ImportTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise _ImportTimeout in the block after ``seconds`` (SIGALRM; only in the main thread, elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise _ImportTimeout()

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _exec_plugin(label: str, run) -> None:
    """Run ``run()`` (an import) with every registration tagged as ``label``; any exception becomes PluginError."""
    from objbench.algos.registry import registering_as

    try:
        with registering_as(label), _time_limit(IMPORT_TIMEOUT_S):
            run()
    except PluginError:
        raise
    except _ImportTimeout:
        raise PluginError(f"plug-in {label}: its import did not finish within {IMPORT_TIMEOUT_S:g} s "
                          f"(experiments.plugins.IMPORT_TIMEOUT_S)") from None
    except BaseException as e:  # noqa: BLE001 - SystemExit or KeyboardInterrupt in a plug-in's import too
        if isinstance(e, KeyboardInterrupt):
            raise
        raise PluginError(f"plug-in {label}: {one_line(e)}") from e


def _load_file(spec: str, base_dir: Optional[Path], source: Optional[str] = None,
               label: Optional[str] = None) -> Plugin:
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    path = path.resolve()
    key = str(path)
    if key in _LOADED:
        return _LOADED[key]
    if source is None:
        if not path.is_file():
            where = f" (relative to {base_dir})" if base_dir and not Path(spec).is_absolute() else ""
            raise PluginError(f"plug-in file not found: {spec}{where}")
        source = path.read_text()
    name = f"objbench_plugin_{path.stem}_{_sha256(key.encode())[:8]}"

    def run():
        mod_spec = importlib.util.spec_from_loader(name, loader=None, origin=key)
        module = importlib.util.module_from_spec(mod_spec)
        module.__file__ = key
        sys.modules[name] = module
        if str(path.parent) not in sys.path:  # a plug-in may import the modules beside it
            sys.path.append(str(path.parent))
        try:
            exec(compile(source, key, "exec"), module.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            raise

    _exec_plugin(label or spec, run)
    _LOADED[key] = Plugin(label or spec, "file", key, _sha256(source.encode()), source)
    return _LOADED[key]


def _load_module(spec: str) -> Plugin:
    if spec in _LOADED:
        return _LOADED[spec]
    if not spec.replace(".", "").replace("_", "").isalnum():
        raise PluginError(f"plug-in {spec!r} is neither a .py file nor a module name")
    _exec_plugin(spec, lambda: importlib.import_module(spec))
    _LOADED[spec] = _module_plugin(spec, "module", spec)
    return _LOADED[spec]


def _module_plugin(spec: str, kind: str, module_name: str) -> Plugin:
    file = getattr(sys.modules.get(module_name), "__file__", None)
    digest = _sha256(Path(file).read_bytes()) if file and Path(file).is_file() else None
    return Plugin(spec, kind, file, digest)


def _load_entry_points() -> None:
    """Every installed package's ``objbench.plugins`` entry point, once per process."""
    if _ENTRY_POINTS_LOADED[0]:
        return
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        label = f"{ep.name} = {ep.value}"
        _exec_plugin(f"entry point {label}", ep.load)
        _LOADED[f"entry point {label}"] = _module_plugin(label, "entry point", ep.value.split(":")[0].strip())
    _ENTRY_POINTS_LOADED[0] = True


def load_plugins(specs: Iterable[str] = (), base_dir: Optional[Path] = None) -> list:
    """Load the installed entry points, then each spec (a ``.py`` file, relative to ``base_dir`` or the working
    directory, or a module name), in order; a spec already loaded in this process is not loaded again. Returns the
    ``Plugin`` records of ``specs`` (entry points not included: every process loads them itself)."""
    _load_entry_points()
    out = []
    for spec in specs:
        spec = str(spec).strip()
        if not spec:
            raise PluginError("an empty plug-in name (--import '' or an empty entry in imports:)")
        out.append(_load_file(spec, base_dir) if _is_file_spec(spec) else _load_module(spec))
    return out


def ensure_loaded(plugins: Iterable[Plugin]) -> None:
    """In a sweep worker or Ray task: load the plug-ins the sweep process loaded. A file plug-in is read from its
    path when that file still has the recorded content, else executed from the source text it carries."""
    _load_entry_points()
    for p in plugins:
        if p.kind == "file":
            here = Path(p.path)
            same = here.is_file() and _sha256(here.read_bytes()) == p.sha256
            _load_file(p.path, None, source=None if same else p.source, label=p.spec)
        elif p.kind == "module":
            _load_module(p.spec)


def loaded() -> list:
    """Every plug-in loaded in this process (entry points first)."""
    return list(_LOADED.values())


def records() -> list:
    """What meta.json records: one dict per loaded plug-in (spec, kind, path, sha256)."""
    return [p.record() for p in loaded()]


def resume_warning(old_records: Optional[list]) -> Optional[str]:
    """A warning when a resumed run's plug-ins differ from the ones it started with (by file content), else None."""
    if not old_records:
        return None
    now = {p.path: p.sha256 for p in loaded()}
    changed = [r.get("spec") for r in old_records if isinstance(r, dict) and now.get(r.get("path")) != r.get("sha256")]
    if not changed:
        return None
    return (f"this run started with plug-in(s) {', '.join(map(str, changed))} in another version (or without them "
            f"loaded now); the resumed steps run the code loaded now (meta.json keeps the old record as "
            f"plugins_before_resume)")


# the slots of an ObjectiveConfig whose member a plug-in may provide: (family, dotted field)
_SLOTS = (("surrogate", "ratio.surrogate"), ("ratio level", "ratio.level"), ("aggregation mode", "loss.agg"),
          ("kl estimator", "kl.estimator"), ("advantage estimator", "adv.estimator"),
          ("group-size rule", "groups.rule"))
_CHECKED: dict = {}  # (family, name, repr of its options) -> failures


def _chosen(objective) -> list:
    out = []
    for family, path in _SLOTS:
        value = objective
        for part in path.split("."):
            value = getattr(value, part)
        if family == "kl estimator" and objective.kl.placement == "none":
            continue
        out.append((family, path, value))
    kinds = {s.kind for fields in objective.schedules.values() for s in fields.values()}
    out += [("schedule kind", "schedules.*.kind", k) for k in sorted(kinds)]
    return out


def check_chosen_members(objective) -> None:
    """Run the conformance check (``algos.conformance``) on every plug-in member ``objective`` (an ObjectiveConfig)
    chooses, once per member and settings per process; PluginError naming the member, its plug-in and the reasons."""
    from objbench.algos.conformance import FAMILIES, check_member

    for family, path, name in _chosen(objective):
        origin = FAMILIES[family][0].origin(name)
        if origin is None:
            continue
        key = (family, name, repr(objective.options.get(name)))
        if key not in _CHECKED:
            _CHECKED[key] = check_member(family, name, objective.options)
        if _CHECKED[key]:
            raise PluginError(f"objective.{path}={name!r} (plug-in {origin}) fails the conformance check: "
                              + "; ".join(_CHECKED[key]))


def check_plugin_file(spec: str) -> list:
    """``objbench plugins check FILE``: load it and check every member it registered. Returns one
    (family, name, failures) per member."""
    from objbench.algos.conformance import FAMILIES, check_member

    plugin = load_plugins([spec])[0]
    out = []
    for family, (registry, _) in FAMILIES.items():
        for name in registry.plugin_names():
            if registry.origin(name) == plugin.spec:
                out.append((family, name, check_member(family, name)))
    return out

"""Plugin loading.

Loading order (documented in the README; later plugins cannot override earlier names,
duplicates are errors):

1. built-ins: every module listed in :data:`BUILTIN_MODULES` (the ``variants`` package: components,
   variants and tasks),
   registered through exactly the same hooks as any external plugin;
2. installed distributions with an entry point in the group ``harness``, unless the
   environment variable ``HARNESS_DISABLE_PLUGIN_AUTOLOAD`` is set;
3. modules named with ``-p module.path`` and files named with ``--plugin path/to/file.py``,
   in the order given;
4. ``pm.check_pending()``: a hookimpl whose name matches no hookspec is an error.

A fresh :class:`pluggy.PluginManager` is made per call, so tests and worker processes never
share state.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pluggy

from . import hookspecs
from .errors import PluginError

BUILTIN_MODULES = (
    "variants.norm",
    "variants.layer_norm",
    "variants.projections",
    "variants.positional",
    "variants.embedding",
    "variants.attention",
    "variants.mask",
    "variants.presets",
    "variants.bugs",
    "variants.tasks",
)

ENTRY_POINT_GROUP = "harness"


@dataclass
class PluginSpec:
    """What to load beyond the built-ins: plain data, so it can be sent to worker processes.

    Args:
        modules: importable module paths (``-p``).
        files: paths of Python files (``--plugin``).
        strict: abort on a broken entry-point plugin or a raising hook instead of warning.
    """

    modules: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    strict: bool = False

    def to_dict(self) -> dict:
        return {"modules": list(self.modules), "files": [str(Path(f).resolve()) for f in self.files],
                "strict": self.strict}

    @classmethod
    def from_dict(cls, d: dict | None) -> "PluginSpec":
        d = d or {}
        return cls(list(d.get("modules", [])), list(d.get("files", [])), bool(d.get("strict", False)))


def _same_file(module, target: Path) -> bool:
    f = getattr(module, "__file__", None)
    try:
        return bool(f) and Path(f).resolve() == target
    except OSError:
        return False


def _registered_from(pm: pluggy.PluginManager, path: str | None) -> bool:
    """Whether a plugin loaded from the same file is registered already (an installed entry point
    also named with ``-p``/``--plugin``, as the conformance kit's documented call does): loading it
    twice would offer every name twice."""
    if not path:
        return False
    target = Path(path).resolve()
    return any(_same_file(plugin, target) for plugin in pm.get_plugins())


def _import_file(path: str):
    p = Path(path)
    if not p.is_file():
        raise PluginError(f"plugin file {path!r} does not exist (give a path to a .py file)")
    name = f"harness_plugin_file_{p.stem}"
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin file {path!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - reported with the plugin's name
        raise PluginError(f"plugin file {path!r} failed to import: {type(exc).__name__}: {exc}") from exc
    return module


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise PluginError(f"plugin module {name!r} not found (is it installed or on PYTHONPATH? "
                              f"for a file use --plugin path/to/file.py)") from exc
        raise PluginError(f"plugin module {name!r} failed to import: {exc}") from exc
    except Exception as exc:  # noqa: BLE001
        raise PluginError(f"plugin module {name!r} failed to import: {type(exc).__name__}: {exc}") from exc


def get_plugin_manager(spec: PluginSpec | None = None, warnings: list[str] | None = None) -> pluggy.PluginManager:
    """Return a new plugin manager with built-ins, entry points and ``spec``'s plugins registered.

    Args:
        spec: extra plugins (``-p`` modules, ``--plugin`` files) and strictness.
        warnings: if given, receives one line per broken entry-point plugin that was skipped
            (non-strict mode).

    Raises:
        PluginError: a ``-p``/``--plugin`` plugin that cannot be imported (always), a broken
            entry-point plugin (strict mode), or a hookimpl that matches no hookspec.
    """
    spec = spec or PluginSpec()
    warnings = warnings if warnings is not None else []
    pm = pluggy.PluginManager("harness")
    pm.add_hookspecs(hookspecs)
    for name in BUILTIN_MODULES:
        pm.register(importlib.import_module(name), name=name)
    if not os.environ.get("HARNESS_DISABLE_PLUGIN_AUTOLOAD"):
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            label = f"entry point {ep.name!r} ({ep.value})"
            try:
                obj = ep.load()
            except Exception as exc:  # noqa: BLE001
                msg = f"plugin {label} failed to import: {type(exc).__name__}: {exc}"
                if spec.strict:
                    raise PluginError(msg) from exc
                warnings.append(msg)
                continue
            if pm.is_registered(obj) or pm.get_plugin(ep.name) is not None:
                continue
            pm.register(obj, name=ep.name)
    for name in spec.modules:
        module = _import_module(name)
        if (not pm.is_registered(module) and not _registered_from(pm, getattr(module, "__file__", None))
                and pm.get_plugin(name) is None):
            pm.register(module, name=name)
    for path in spec.files:
        if _registered_from(pm, path) or pm.get_plugin(str(path)) is not None:  # named twice: load it once
            continue
        module = _import_file(path)
        if not pm.is_registered(module):
            pm.register(module, name=str(path))
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {exc.plugin_name!r}: {exc}") from exc
    return pm

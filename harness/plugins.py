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

``-p no:NAME`` (as pytest) blocks the plugin registered under ``NAME`` at any of the steps
above: a built-in module (``-p no:variants.bugs``), an entry point's name, a ``-p`` module or a
``--plugin`` file's path as given. Blocking a plugin that offers a slot's default component
leaves that slot without a default, which is an error unless another plugin declares one.

Hooks are called through ``pm.hook.<name>()``, so pluggy's hook wrappers and tracing work;
``HARNESS_TRACE=1`` in the environment writes pluggy's trace of every hook call to stderr.

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

import harness.hookspecs as hookspecs  # (not "from . import": this module needs the specs, not the package)
from .errors import PluginError

#: ``-p no:NAME`` blocks the plugin registered as NAME.
BLOCK_PREFIX = "no:"
#: Set (non-empty) to write pluggy's trace of every hook call to stderr.
TRACE_ENV = "HARNESS_TRACE"

BUILTIN_MODULES = (
    "variants.norm",
    "variants.layer_norm",
    "variants.projections",
    "variants.positional",
    "variants.embedding",
    "variants.attention",
    "variants.attention_modern",
    "variants.mask",
    "variants.feed_forward",
    "variants.presets",
    "variants.bugs",
    "variants.tasks",
)

ENTRY_POINT_GROUP = "harness"


@dataclass
class PluginSpec:
    """What to load beyond the built-ins: plain data, so it can be sent to worker processes.

    Args:
        modules: importable module paths (``-p``); ``no:NAME`` blocks the plugin NAME instead.
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

    def blocked(self) -> list[str]:
        """Names given as ``-p no:NAME``."""
        return [m[len(BLOCK_PREFIX):] for m in self.modules if m.startswith(BLOCK_PREFIX)]

    def module_names(self) -> list[str]:
        """Module paths to load (``-p`` values other than ``no:NAME``)."""
        return [m for m in self.modules if not m.startswith(BLOCK_PREFIX)]


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
    if os.environ.get(TRACE_ENV):
        pm.trace.root.setwriter(sys.stderr.write)
        pm.enable_tracing()
    for name in spec.blocked():
        pm.set_blocked(name)
    for name in BUILTIN_MODULES:
        if not pm.is_blocked(name):
            pm.register(importlib.import_module(name), name=name)
    _register_entry_points(pm, spec, warnings)
    _register_requested(pm, spec)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {exc.plugin_name!r}: {exc}") from exc
    return pm


def builtin_plugin_manager() -> pluggy.PluginManager:
    """A plugin manager with the built-ins only (step 1 of the loading order), for what the
    built-ins declare whatever else is installed (:func:`harness.registry.default_components`)."""
    pm = pluggy.PluginManager("harness")
    pm.add_hookspecs(hookspecs)
    for name in BUILTIN_MODULES:
        pm.register(importlib.import_module(name), name=name)
    return pm


def _register_entry_points(pm: pluggy.PluginManager, spec: PluginSpec, warnings: list[str]) -> None:
    """Step 2 of the loading order (unless ``HARNESS_DISABLE_PLUGIN_AUTOLOAD``)."""
    if not os.environ.get("HARNESS_DISABLE_PLUGIN_AUTOLOAD"):
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if pm.is_blocked(ep.name):
                continue
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


def _register_requested(pm: pluggy.PluginManager, spec: PluginSpec) -> None:
    """Step 3: ``-p`` modules and ``--plugin`` files, in the order given; blocked names are skipped."""
    for name in spec.module_names():
        if pm.is_blocked(name):
            continue
        module = _import_module(name)
        if (not pm.is_registered(module) and not _registered_from(pm, getattr(module, "__file__", None))
                and pm.get_plugin(name) is None):
            pm.register(module, name=name)
    for path in spec.files:
        if pm.is_blocked(str(path)):
            continue
        if _registered_from(pm, path) or pm.get_plugin(str(path)) is not None:  # named twice: load it once
            continue
        module = _import_file(path)
        if not pm.is_registered(module):
            pm.register(module, name=str(path))

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

Before a plugin is registered its hook implementations are checked (:func:`hook_problems`): a
name that matches no hookspec (with the nearest valid name), arguments the hookspec does not pass,
a wrapper that is not a generator, and a plugin that registers no hook at all (functions named like
hooks without ``@hookimpl``). For a ``-p``/``--plugin`` plugin the first problem is a
:class:`~harness.errors.PluginError` naming the file and the line of the function; an installed
entry-point plugin with a problem is reported by name and skipped (an error with ``--strict-plugins``).

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

import contextlib
import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
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
    "variants.init",
    "variants.architecture",
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

    def requested(self) -> set[str]:
        """The names the plugins named here are registered under (``-p`` module paths, ``--plugin``
        paths as given): their mistakes are errors, not warnings (:mod:`harness.registry`)."""
        return set(self.module_names()) | {str(f) for f in self.files}


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
        raise _validation_error(pm, exc) from exc
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
            problems = hook_problems(pm, obj, f"plugin {label}")
            if problems:
                msg = f"{problems[0]} (plugin {label} skipped)"
                if spec.strict:
                    raise PluginError(problems[0])
                warnings.append(msg)
                continue
            _register(pm, obj, ep.name)


def _register_requested(pm: pluggy.PluginManager, spec: PluginSpec) -> None:
    """Step 3: ``-p`` modules and ``--plugin`` files, in the order given; blocked names are skipped."""
    for name in spec.module_names():
        if pm.is_blocked(name):
            continue
        module = _import_module(name)
        if (not pm.is_registered(module) and not _registered_from(pm, getattr(module, "__file__", None))
                and pm.get_plugin(name) is None):
            _register_checked(pm, module, name, f"plugin module {name!r}")
    for path in spec.files:
        if pm.is_blocked(str(path)):
            continue
        if _registered_from(pm, path) or pm.get_plugin(str(path)) is not None:  # named twice: load it once
            continue
        module = _import_file(path)
        if not pm.is_registered(module):
            _register_checked(pm, module, str(path), f"plugin file {str(path)!r}")


def _register_checked(pm: pluggy.PluginManager, plugin, name: str, label: str) -> None:
    """Register a ``-p``/``--plugin`` plugin; its first hook problem (:func:`hook_problems`) is an error."""
    problems = hook_problems(pm, plugin, label)
    if problems:
        raise PluginError(problems[0])
    _register(pm, plugin, name)


def _register(pm: pluggy.PluginManager, plugin, name: str) -> None:
    """``pm.register``, pluggy's own validation error (whatever its pluggy version) as one line."""
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise _validation_error(pm, exc, name) from exc


def _validation_error(pm: pluggy.PluginManager, exc: Exception, name: str | None = None) -> PluginError:
    """A :class:`pluggy.PluginValidationError` as a one-line :class:`PluginError` naming the plugin.

    Its attributes differ between pluggy versions (``plugin``; older ones also ``plugin_name``), so
    each is read with a fallback."""
    plugin = getattr(exc, "plugin", None)
    if name is None:
        name = getattr(exc, "plugin_name", None)
    if name is None and plugin is not None:
        try:
            name = pm.get_name(plugin)
        except Exception:  # noqa: BLE001 - only the name is lost
            name = None
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    return PluginError(f"plugin {name!r}: {text}" if name else text)


def hook_location(function) -> str:
    """``path:line`` of a hook implementation: its source file (relative to the working directory
    when under it) and the line of its ``def`` (after any decorators); ``repr(function)`` where the
    source cannot be found. Never raises."""
    func = inspect.unwrap(function)
    code = getattr(func, "__code__", None)
    try:
        path = inspect.getsourcefile(func) or (code.co_filename if code else None)
    except TypeError:
        path = code.co_filename if code else None
    if path is None:
        return repr(function)
    with contextlib.suppress(ValueError, OSError):  # under the working directory: relative, as usually given
        rel = os.path.relpath(path)
        path = path if rel.startswith(os.pardir) else rel
    try:
        lines, start = inspect.getsourcelines(func)
        line = start + next(i for i, text in enumerate(lines) if text.lstrip().startswith(("def ", "async def ")))
    except (OSError, TypeError, StopIteration):
        line = code.co_firstlineno if code else 0
    return f"{path}:{line}"


def hook_label(plugin_name: str, function) -> str:
    """A plugin's hook as ``path:line`` (:func:`hook_location`), preceded by the plugin's name where
    the path does not say it (a ``-p`` module, an entry point)."""
    if function is None:
        return repr(plugin_name)
    where = hook_location(function)
    path = where.rpartition(":")[0]
    try:
        same = Path(plugin_name).resolve() == Path(path).resolve()
    except (OSError, ValueError):
        same = False
    return where if same else f"{plugin_name!r} ({where})"


def hook_names(pm: pluggy.PluginManager) -> list[str]:
    """The names of the hookspecs (:mod:`harness.hookspecs`), sorted."""
    return sorted(n for n in dir(hookspecs) if pm.parse_hookspec_opts(hookspecs, n) is not None)


def _required_args(function) -> list[str]:
    """The arguments a call must pass to ``function`` (positional, no default), as pluggy reads them."""
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds and p.default is p.empty]


def _impl_problem(pm: pluggy.PluginManager, plugin, attr: str, opts: dict, specs: list[str]) -> str | None:
    """What is wrong with the hook implementation ``plugin.<attr>`` (marked with options ``opts``), or None."""
    function = getattr(plugin, attr)
    name = opts.get("specname") or attr
    where = f"plugin {hook_location(function)}"
    if name not in specs:
        if opts.get("optionalhook"):
            return None
        close = difflib.get_close_matches(name, specs, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"the hooks are {', '.join(specs)}"
        return f"{where}: unknown hook {name!r}; {hint}"
    takes = _required_args(getattr(hookspecs, name))
    extra = [a for a in _required_args(function) if a not in takes]
    if extra:
        passes = f"passes only {', '.join(takes)}" if takes else "passes none"
        return (f"{where}: {attr}() takes argument(s) {', '.join(extra)} but the hook {name} {passes}; "
                f"define it as def {name}({', '.join(takes)}):")
    if (opts.get("wrapper") or opts.get("hookwrapper")) and not inspect.isgeneratorfunction(function):
        return f"{where}: {attr}() is marked as a hook wrapper but does not yield"
    return None


def hook_problems(pm: pluggy.PluginManager, plugin, label: str) -> list[str]:
    """One line per mistake in ``plugin``'s hook implementations, before it is registered: a name
    that matches no hookspec (with the nearest valid name, :func:`difflib.get_close_matches`),
    arguments its hookspec does not pass, a wrapper that does not yield, and no hook at all
    (functions named like hooks but without ``@hookimpl``). Each line names the file and the line of
    the function (:func:`hook_location`); ``label`` names the plugin where no function does.
    Hooks are found as pluggy finds them (``pm.parse_hookimpl_opts``); raises nothing."""
    specs = hook_names(pm)
    problems: list[str] = []
    found = 0
    for attr in dir(plugin):
        try:
            opts = pm.parse_hookimpl_opts(plugin, attr)
        except Exception:  # noqa: BLE001 - an attribute that raises when read is no hook
            opts = None
        if opts is None:
            continue
        found += 1
        problem = _impl_problem(pm, plugin, attr, dict(opts), specs)
        if problem:
            problems.append(problem)
    if not found:
        problems.append(_no_hooks(plugin, label, specs))
    return problems


def _no_hooks(plugin, label: str, specs: list[str]) -> str:
    """The line for a plugin that registers no hook: the functions named like hooks, where."""
    unmarked = [(a, getattr(plugin, a, None)) for a in dir(plugin) if a.startswith("harness_")]
    unmarked = [(a, f) for a, f in unmarked if inspect.isroutine(f)]
    if unmarked:
        named = ", ".join(f"{a} ({hook_location(f)})" for a, f in unmarked)
        return (f"{label} registered no hooks: {named} lacks @hookimpl; decorate each hook implementation "
                f"with @hookimpl (from harness import hookimpl)")
    return (f"{label} registered no hooks: a hook is a function named as one of {', '.join(specs)} "
            f"and decorated with @hookimpl (from harness import hookimpl)")

"""transformer-harness: interchangeable Transformer implementations, trained and checked side by side.

Public API for plugin authors::

    from harness import hookimpl, BuildContext, Component, Slot, Variant, Task

    @hookimpl
    def harness_add_variants():
        return [Variant("my_variant", {"norm": "pre"}, summary="...", source="...")]

and for users in Python (a notebook, a script), mirroring the command line
(see the README's "Python API")::

    import harness

    run_dir = harness.run(variants=["baseline", "pre_norm"], seeds=2, preset="tiny")
    result = harness.load_run(run_dir)          # .trials, .curves, .summary (pandas)
    model = harness.build_model("baseline")     # the nn.Module only
    trained = harness.load_model(run_dir, "baseline", seed=0)   # a run made with save_models=True

Every name that needs torch or pandas is imported on first use (PEP 562 ``__getattr__``),
so ``import harness`` and ``python -m harness --help`` stay fast.
"""
from __future__ import annotations

import importlib

import pluggy

from .errors import HarnessError

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("harness")

#: public name -> the submodule that defines it, imported on first access.
_LAZY = {
    "Component": "registry", "Variant": "registry", "Slot": "slots", "BuildContext": "model",
    "Task": "tasks.base", "Batch": "tasks.base",
    "ModelConfig": "config", "TrainConfig": "config", "RunConfig": "config",
    "run": "api", "check": "api", "load_run": "api", "build_model": "api", "LoadedRun": "api",
    "RunFailedError": "api", "compare": "api", "verify": "api", "list_variants": "api", "list_tasks": "api", "list_presets": "api",
    "list_settings": "api",
    "load_model": "api", "decode": "api",
    "RunRequest": "request", "CheckRequest": "request",
}

__all__ = ["hookimpl", "Component", "Variant", "Slot", "BuildContext", "Task", "Batch", "ModelConfig", "TrainConfig", "RunConfig",
           "HarnessError", "__version__", "run", "check", "load_run", "build_model", "LoadedRun", "RunFailedError",
           "compare", "verify", "list_variants", "list_tasks", "list_presets", "list_settings", "RunRequest", "CheckRequest",
           "load_model", "decode"]


def __getattr__(name: str):
    """Import the submodule defining ``name`` on first access and cache the attribute here."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

"""transformer-harness: interchangeable Transformer implementations, trained and checked side by side.

Public API for plugin authors::

    from harness import hookimpl, Component, Variant, Task

    @hookimpl
    def harness_add_variants():
        return [Variant("my_variant", {"norm": "pre"}, summary="...", source="...")]
"""
from __future__ import annotations

import pluggy

from .config import ModelConfig, RunConfig, TrainConfig
from .errors import HarnessError
from .registry import Component, Variant
from .tasks.base import Batch, Task

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("harness")

__all__ = ["hookimpl", "Component", "Variant", "Task", "Batch", "ModelConfig", "TrainConfig", "RunConfig",
           "HarnessError", "__version__"]

"""Built-in components and variants of transformer-harness.

Each module is a plugin registered through the same hooks as any external plugin
(``harness_add_components`` / ``harness_add_variants``); see ``harness/plugins.py``.
The implementations are written by hand, each faithful to the source its docstring names.
"""

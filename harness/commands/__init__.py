"""Sub-commands of ``python -m harness``; each module exposes ``register(subparsers, parents)``."""

"""Errors raised to callers of the harness.

Every error a user can cause (bad name, bad config, broken plugin, bad path) is a
:class:`HarnessError`. The CLI prints ``str(error)`` as one line on stderr and exits with
``error.exit_code`` (2 for bad input), never with a traceback.
"""
from __future__ import annotations

import difflib
from typing import Iterable


class HarnessWarning(UserWarning):
    """Something the user should know that does not stop the command (e.g. a corrupt trial
    file moved to quarantine). The CLI prints each as one line: ``harness: warning: ...``."""


class HarnessError(Exception):
    """Base class for errors caused by the caller's input. Exit code 2."""

    exit_code = 2


class ConfigError(HarnessError):
    """A config value has the wrong type or lies outside its allowed range."""


class UnknownNameError(HarnessError):
    """A variant, component, slot, preset or experiment name that is not registered."""

    def __init__(self, kind: str, name: str, known: Iterable[str], hint: str = ""):
        known = sorted(known)
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        msg = f"unknown {kind} {name!r}"
        if close:
            msg += f"; did you mean {', '.join(repr(c) for c in close)}?"
        else:
            shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
            msg += f"; known: {shown}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)
        self.name = name


class PluginError(HarnessError):
    """A plugin failed to import, its hook raised, or it returned the wrong types."""


class DuplicateNameError(PluginError):
    """Two plugins registered a component or variant under the same name."""


class StoreError(HarnessError):
    """A results directory is missing, unreadable, unwritable or belongs to another run."""


class DeviceError(HarnessError):
    """The requested device is not available (e.g. ``--device cuda`` without CUDA)."""


def failure_reason(exc: BaseException, limit: int = 300) -> str:
    """One line naming a failure: ``"<type>: <first non-blank line of the message>"`` (cut to
    ``limit`` characters), or the exception's type name alone when its message is empty or blank.

    Never raises, whatever ``exc``'s ``__str__`` does (a failing trial must never raise).

    Example:
        ``failure_reason(ValueError("bad\\nmore"))`` -> ``"ValueError: bad"``;
        ``failure_reason(KeyError())`` -> ``"KeyError"``.
    """
    name = type(exc).__name__
    try:
        lines = [line for line in str(exc).splitlines() if line.strip()]
    except Exception:  # noqa: BLE001 - a broken __str__ still names the failure
        return name
    return f"{name}: {lines[0][:limit]}" if lines else name

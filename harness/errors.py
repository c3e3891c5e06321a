"""Errors raised to callers of the harness.

Every error a user can cause (bad name, bad config, broken plugin, bad path) is a
:class:`HarnessError`. The CLI prints ``str(error)`` as one line on stderr and exits with
``error.exit_code`` (2 for bad input), never with a traceback.
"""
from __future__ import annotations

import difflib
import errno
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


class ResourceError(HarnessError):
    """A run that had started could not write its files (no space left, permission denied): what
    it stored stays stored. Exit code 1 (the run ran; ``run --resume`` finishes it), where bad
    input gives 2."""

    exit_code = 1


class DeviceError(HarnessError):
    """The requested device is not available (e.g. ``--device cuda`` without CUDA)."""


#: Words for the errors a run's files most often meet (errno -> text); others keep the system's own.
RESOURCE_WORDS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                  errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                  errno.EROFS: "read-only file system", errno.ENOMEM: "out of memory"}


def resource_text(exc: OSError) -> str:
    """``"no space left on device writing PATH"``: what failed and the file it names (if any)."""
    what = RESOURCE_WORDS.get(exc.errno) or exc.strerror or str(exc)
    return f"{what} writing {exc.filename}" if exc.filename else what


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
    if not lines and isinstance(exc, MemoryError):  # raised with no message: say what it means
        return f"{name}: out of memory"
    return f"{name}: {lines[0][:limit]}" if lines else name

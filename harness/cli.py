"""Command-line interface: ``python -m harness <command> ...``.

Each sub-command lives in ``harness/commands/<name>.py`` and exposes
``register(subparsers, parents)``; the parser sets ``func`` to the handler, which returns the
exit code. Only the module of the command being run is imported (the one-line help of the
others comes from :data:`COMMANDS`, as pip's command table does), so ``--help`` imports neither
torch nor pandas. Exit codes: 0 success, 1 a trial failed or a check/compare found a problem,
2 bad input (one line on stderr, no traceback), 130 interrupted, 141 the output's reader stopped early
(``| head``).
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import importlib.util
import os
import sys
import threading
import warnings

from .commands.common import add_plugin_options, check_output
from .errors import RESOURCE_WORDS, HarnessError, HarnessWarning, resource_text

#: command -> its one-line help (the same text its module's ``register`` gives; a test holds
#: them equal), in the order ``--help`` lists them.
COMMANDS = {
    "run": "train variants on a task (default copy) and write a report",
    "list": "show components by slot, variants and tasks with their plugins",
    "check": "equivalence matrix, PyTorch references, mask probes, bugs",
    "bench": "training speed of variants vs torch.nn.Transformer",
    "profile": "the harness's own overhead in a trial (phase clock; optional torch.profiler, op counts)",
    "report": "re-render a run's report from stored data",
    "compare": "compare two runs per variant; exit 1 on a regression",
    "experiments": "list the declarative experiments",
    "verify": "check a stored run's files, checksums and tables",
    "decode": "run a saved model (run --save-models) on new input",
}

EPILOG = """examples:
  python -m harness run --variants all            train every built-in variant (quick preset)
  python -m harness run --variants 'seed_*' --seeds 5
  python -m harness list                          components by slot, variants, plugins
  python -m harness -p my_plugin list             load a plugin module (or --plugin file.py)
  python -m harness verify results/<run-id>       check a stored run's files and checksums

exit codes: 0 ok, 1 a trial failed / a check or comparison found a problem,
            2 bad input, 130 interrupted (the run can be resumed),
            141 stdout's reader stopped early (| head)"""


class HarnessArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``harness: error: <what> (see <prog> --help)``, exit 2."""

    def error(self, message):
        self.exit(2, f"harness: error: {_one_line(_command_hint(message))} (see: {self.prog} --help)\n")


#: What a command that does not exist is usually meant to be (``python -m harness suite`` ...).
COMMAND_HINTS = {"suite": "run --suite NAME", "train": "run", "experiment": "run --experiment NAME",
                 "test": "check (the project's tests: python -m pytest)", "compile": "bench --compile"}


def _command_hint(message: str) -> str:
    """argparse's "invalid choice" for the sub-command, shortened: the unknown name, what it is
    usually meant to be (:data:`COMMAND_HINTS`) or the closest command, and the commands."""
    import difflib
    import re

    m = re.match(r"argument COMMAND: invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if not m:
        return message
    name, commands = m.group(1), [c.strip(" '") for c in m.group(2).split(",")]
    close = difflib.get_close_matches(name, commands, n=1)
    meant = COMMAND_HINTS.get(name) or (close[0] if close else None)
    return (f"unknown command '{name}'" + (f"; did you mean: {meant}?" if meant else "")
            + f" (commands: {', '.join(commands)})")


def plugin_parent(suppress: bool) -> argparse.ArgumentParser:
    """Plugin options (:func:`harness.commands.common.add_plugin_options`), accepted before or after the
    sub-command."""
    p = argparse.ArgumentParser(add_help=False)
    add_plugin_options(p, suppress)
    return p


def _available(name: str) -> bool:
    """Whether ``harness/commands/<name>.py`` exists (found without importing it)."""
    return importlib.util.find_spec(f"harness.commands.{name}") is not None


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The full parser. ``commands``: the sub-commands whose modules are imported and registered
    (default: all); the others get a placeholder with their one-line help that takes any
    arguments when parsed with ``parse_known_args`` (enough for ``--help`` and for choosing the
    command)."""
    parser = HarnessArgumentParser(
        prog="python -m harness", parents=[plugin_parent(False)],
        description="Train, check and compare interchangeable Transformer implementations.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__

    parser.add_argument("--version", action="version", version=f"transformer-harness {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parents = [plugin_parent(True)]
    for name, help_line in COMMANDS.items():
        if not _available(name):
            continue
        if commands is None or name in commands:
            importlib.import_module(f"harness.commands.{name}").register(sub, parents)
        else:
            sub.add_parser(name, help=help_line, add_help=False)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse in two passes: the first, with every command a placeholder, finds the command (and
    answers ``--help``/``--version`` and top-level errors); the second parses with that
    command's module imported. Raises SystemExit as argparse does."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = build_parser(commands=()).parse_known_args(argv)[0].command
    return build_parser(commands=(command,)).parse_args(argv)


def _one_line(text) -> str:
    """``text`` as one printable line: line breaks, other control characters and undecodable
    bytes (lone surrogates from a non-UTF-8 command line) become backslash escapes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in str(text).strip())


#: Exit code when stdout's reader closes the pipe early (``... | head``): 128 + SIGPIPE, as a shell reports it.
BROKEN_PIPE = 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush of a closed pipe raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the sub-command and return its exit code.

    A :class:`HarnessError` becomes one line on stderr and its exit code (2; 1 for a run that
    could not write its files, :class:`harness.errors.ResourceError`); a ``MemoryError`` or an
    ``OSError`` of a full disk or a permission one line and 1; a
    :class:`HarnessWarning` one line ``harness: warning: ...``; a run id (``--run-id``) and an
    empty ``--results-dir`` are checked before anything else runs. Output piped into a reader that
    stops early (``| head``) ends the command quietly with :data:`BROKEN_PIPE`.

    Raises:
        SystemExit: from argparse for ``--help``, ``--version`` and malformed options (exit 2,
            one line).
    """
    args = parse_args(argv)
    if not getattr(args, "func", None):
        build_parser(commands=()).print_help()
        return 2
    show = warnings.showwarning

    def show_warning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, HarnessWarning):
            print(f"harness: warning: {_one_line(message)}", file=sys.stderr, flush=True)
        else:
            show(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always", HarnessWarning)
        warnings.showwarning = show_warning
        try:
            check_output(args)
            return int(args.func(args) or 0)
        except HarnessError as exc:
            print(f"harness: error: {_one_line(exc)}", file=sys.stderr)
            return exc.exit_code
        except KeyboardInterrupt:
            print("harness: interrupted", file=sys.stderr)
            return 130
        except MemoryError:
            print("harness: error: out of memory in the harness's own process (MemoryError); what is stored stays "
                  "stored (a run continues with: python -m harness run --resume RUN_DIR)", file=sys.stderr)
            return 1
        except BrokenPipeError:  # the reader went away (| head): stop printing, quietly
            _silence_stdout()
            return BROKEN_PIPE
        except OSError as exc:  # a full disk or a permission outside a run's own handling (report, compare ...)
            if exc.errno not in RESOURCE_WORDS:
                raise
            print(f"harness: error: {_one_line(resource_text(exc))}", file=sys.stderr)
            return 1


def exit_now(code: int) -> None:
    """End the process with ``code`` without the interpreter's teardown of every loaded module (about
    0.8 s once torch, scipy and matplotlib are loaded, on the 2-core development machine): the steps
    Python's own exit takes first (``atexit`` handlers: multiprocessing's clean-up, Ray's, logging's;
    stdout, stderr and C stdio flushed; a failed flush gives 141 for a closed pipe, else 120, as an
    ordinary exit would), then ``os._exit``. Every file the harness writes is closed before. While a
    thread that is not a daemon still runs (a plugin's), it exits the ordinary way, which waits for it.
    ``python -m harness`` ends here; :func:`main` itself returns (tests and the Python API call it)."""
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # the reader went away: as main() reports it
            code = code or BROKEN_PIPE
        except (OSError, ValueError):  # e.g. a full disk under a redirection: as Python's own exit does
            code = code or 120
    with contextlib.suppress(Exception):  # C stdio buffers (native libraries' printf), which os._exit skips
        import ctypes

        ctypes.CDLL(None).fflush(None)
    os._exit(code)

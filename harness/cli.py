"""Command-line interface: ``python -m harness <command> ...``.

Each sub-command lives in ``harness/commands/<name>.py`` and exposes
``register(subparsers, parents)``; the parser sets ``func`` to the handler, which returns the
exit code. Exit codes: 0 success, 1 a trial failed or a check/compare found a problem,
2 bad input (one line on stderr, no traceback), 130 interrupted.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
import warnings

from .errors import HarnessError, HarnessWarning

COMMANDS = ("run", "list", "check", "bench", "profile", "report", "compare", "experiments", "verify")

EPILOG = """examples:
  python -m harness run --variants all            train every built-in variant (quick preset)
  python -m harness run --variants 'seed_*' --seeds 5
  python -m harness list                          components by slot, variants, plugins
  python -m harness -p my_plugin list             load a plugin module (or --plugin file.py)
  python -m harness verify results/<run-id>       check a stored run's files and checksums

exit codes: 0 ok, 1 a trial failed / a check or comparison found a problem,
            2 bad input, 130 interrupted (the run can be resumed)"""


class HarnessArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``harness: error: <what> (see <prog> --help)``, exit 2."""

    def error(self, message):
        self.exit(2, f"harness: error: {message} (see: {self.prog} --help)\n")


def plugin_parent(suppress: bool) -> argparse.ArgumentParser:
    """Plugin options, accepted before or after the sub-command."""
    p = argparse.ArgumentParser(add_help=False)
    default = argparse.SUPPRESS if suppress else None
    g = p.add_argument_group("plugins")
    g.add_argument("-p", dest="plugin_modules", action="append", metavar="MODULE", default=default,
                   help="load a plugin module by import path (repeatable)")
    g.add_argument("--plugin", dest="plugin_files", action="append", metavar="FILE.py", default=default,
                   help="load a plugin from a Python file (repeatable)")
    g.add_argument("--strict-plugins", action="store_true", default=argparse.SUPPRESS if suppress else False,
                   help="abort when an installed plugin fails to import or a hook raises "
                        "(default: warn and skip it)")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = HarnessArgumentParser(
        prog="python -m harness", parents=[plugin_parent(False)],
        description="Train, check and compare interchangeable Transformer implementations.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__

    parser.add_argument("--version", action="version", version=f"transformer-harness {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parents = [plugin_parent(True)]
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"harness.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"harness.commands.{name}":
                continue
            raise
        module.register(sub, parents)
    return parser


def plugin_spec(args):
    from .plugins import PluginSpec

    return PluginSpec(modules=list(getattr(args, "plugin_modules", None) or []),
                      files=list(getattr(args, "plugin_files", None) or []),
                      strict=bool(getattr(args, "strict_plugins", False)))


def _one_line(text) -> str:
    """``text`` on one line: line breaks (and the spaces around them) become one space."""
    return re.sub(r"\s*[\r\n]+\s*", " ", str(text)).strip()


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the sub-command and return its exit code.

    A :class:`HarnessError` becomes one line on stderr and its exit code (2); a
    :class:`HarnessWarning` one line ``harness: warning: ...``; a run id (``--run-id``) is
    checked before anything else runs.

    Raises:
        SystemExit: from argparse for ``--help``, ``--version`` and malformed options (exit 2,
            one line).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
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
            if getattr(args, "run_id", None) is not None:
                from .store import check_name

                check_name(args.run_id)
            return int(args.func(args) or 0)
        except HarnessError as exc:
            print(f"harness: error: {_one_line(exc)}", file=sys.stderr)
            return exc.exit_code
        except KeyboardInterrupt:
            print("harness: interrupted", file=sys.stderr)
            return 130

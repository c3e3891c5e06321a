"""``python -m harness run --suite [NAME]``: the command-line side of :mod:`harness.suite`.

Each task of the suite runs through the ordinary ``run`` command (same plugins, same checks,
same store), so a suite is resumable task by task and every task keeps its own report.
"""
from __future__ import annotations

import sys

from ..errors import ConfigError
from .common import command_line, load_registry

#: run options that a suite sets itself (from its file); giving them with --suite is an error.
SUITE_OWNED = ("variants", "grid", "seeds", "seed_start", "experiment", "preset", "overrides")


def _plugin_argv(args) -> list[str]:
    """The global plugin options of this command line, for the task runs."""
    out = [a for m in (getattr(args, "plugin_modules", None) or []) for a in ("-p", m)]
    out += [a for f in (getattr(args, "plugin_files", None) or []) for a in ("--plugin", f)]
    return out + (["--strict-plugins"] if getattr(args, "strict_plugins", False) else [])


def check_options(given: set[str]) -> None:
    """Raises ConfigError when an option the suite file owns was given with --suite."""
    clash = sorted(given & set(SUITE_OWNED))
    if clash:
        raise ConfigError(f"--suite takes {', '.join('--' + c.replace('_', '-') for c in clash)} from the suite "
                          "file (experiments/suites/NAME.toml); drop the option or write a suite file")


def main(args, given: set[str]) -> int:
    """Run the suite named by ``args.suite`` (see :mod:`harness.suite`). Returns the exit code."""
    from .. import cli
    from ..suite import load_suite, run_suite, suite_folder

    check_options(given)
    spec = load_suite(args.suite)
    folder = suite_folder(spec, args.results_dir, args.run_id, args.resume)
    reg = load_registry(args)
    variants = reg.select([p for item in spec.variants for p in item.replace(",", " ").split()])
    for task in spec.tasks:
        reg.task(task)
    prefix = _plugin_argv(args)
    extra = [a for opt in ("device", "dtype", "jobs", "executor", "address", "threads")
             if getattr(args, opt, None) is not None for a in (f"--{opt}", str(getattr(args, opt)))]

    def run(argv: list[str]) -> int:
        if argv[1] != "--resume":
            argv = argv + extra
        return cli.main(prefix + argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    return run_suite(spec, folder, reg, variants, run, command=command_line(), quiet=args.quiet, log=log)

"""``python -m harness run --suite [NAME]``: the command-line side of :mod:`harness.suite`.

Each task of the suite is an ordinary run started from a :class:`harness.request.RunRequest`
(same plugins, same checks, same store), so a suite is resumable task by task and every task
keeps its own report.
"""
from __future__ import annotations

import sys

from ..errors import ConfigError
from ..request import RunRequest, split_patterns

#: run options that a suite sets itself (from its file); giving them with --suite is an error.
SUITE_OWNED = ("variants", "grid", "seeds", "seed_start", "experiment", "preset", "overrides")


def check_options(given: set[str]) -> None:
    """Raises ConfigError when an option the suite file owns was given with --suite."""
    clash = sorted(given & set(SUITE_OWNED))
    if clash:
        raise ConfigError(f"--suite takes {', '.join('--' + c.replace('_', '-') for c in clash)} from the suite "
                          "file (experiments/suites/NAME.toml); drop the option or write a suite file")


def main(args, request: RunRequest, on_task) -> int:
    """Run the suite named by ``args.suite`` (see :mod:`harness.suite`) with the options of
    ``request`` that the suite does not own; ``on_task(outcome)`` shows each task's outcome and
    returns its exit code (the command line's ``print_outcome``). Returns the exit code."""
    from ..planning import load_registry
    from ..suite.run import run_suite, suite_folder
    from ..suite.spec import load_suite

    check_options(request.given())
    request.validate()
    spec = load_suite(args.suite)
    folder = suite_folder(spec, request.results_dir, request.run_id, request.resume)
    reg = load_registry(request.plugins)
    variants = reg.select(split_patterns(spec.variants))
    for task in spec.tasks:
        reg.task(task)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    return run_suite(spec, folder, reg, variants, request, on_task=on_task, log=log)

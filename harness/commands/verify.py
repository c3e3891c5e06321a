"""``python -m harness verify RUN``: check that a stored run is complete and intact.

Read-only: nothing is moved or rewritten (``report`` and ``run --resume`` quarantine corrupt
trial files; ``verify`` only names them). One line per problem on stdout, then a summary line.

From Python, harness.verify(RUN) returns the same problems and notes.

Exit codes: 0 no problem; 1 at least one problem; 2 bad input (RUN is not a run folder).
"""
from __future__ import annotations

import argparse

from ..verification import verify_store

DESCRIPTION = """Check a stored run folder (results/<run-id>/) without changing it:

  - config.json is a readable JSON object;
  - every trials/<key>.json is a trial file (JSON object, row with variant/seed/status, curve
    list), its name is its trial key, and its checksum matches its content (files written
    before checksums existed are checked by schema only);
  - trials.csv and curves.csv are exactly what the trial files render to;
  - every trial planned in config.json is stored and none is stored that was not planned --
    unless the run was interrupted (Ctrl-C, SIGTERM, or killed): missing trials of an
    interrupted run are not a problem, verify says how to resume it.

Prints one line per problem ('PATH: what is wrong'), then a summary line."""

EPILOG = """examples:
  python -m harness verify results/20250101-120000
  python -m harness verify quick-run --results-dir results/reference

exit codes: 0 the run is intact, 1 a problem was found, 2 RUN is not a run folder"""


def register(sub, parents):
    p = sub.add_parser("verify", parents=parents, help="check a stored run's files, checksums and tables",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="run folder, run id under --results-dir, or 'latest'")
    p.add_argument("--results-dir", default="results", metavar="DIR", help="where runs are stored (default results)")
    p.add_argument("--quiet", "-q", action="store_true", help="print the problems only, no notes or summary")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..lookup import resolve_run

    outcome = verify_store(resolve_run(args.run, args.results_dir, records=True))  # check/bench records too
    root = str(outcome.store.root)
    for line in outcome.problems:
        print(f"{root}/{line}" if not line.startswith(root) else line)
    if not args.quiet:
        for line in outcome.notes:
            print(f"note: {line}")
        print(outcome.summary())
    return outcome.exit_code

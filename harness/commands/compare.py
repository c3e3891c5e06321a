"""``python -m harness compare RUN_A RUN_B``: two runs side by side, a regression test for CI.

RUN_A is the reference, RUN_B the candidate. For every variant (x sweep point) in both runs:

  - each compared metric (--metrics): A's and B's IQM [95 % bootstrap CI] over their finished
    trials, and the per-seed difference B - A over the seeds that finished in both runs (seed i
    gives both runs the same data order and initial weights, so the seeds are paired): its IQM
    with a 95 % paired percentile-bootstrap CI (scipy.stats.bootstrap with paired=True, seeds
    resampled jointly). The metric regressed when that CI lies entirely on the worse side of
    0, beyond --tolerance; 'too few seeds' below 3 such pairs (no metric verdict, but failures
    below are still judged).
  - failed or diverged trials (always judged): regressed when (1) every trial of B failed,
    whatever A did; or (2) a trial of B failed (raised) at a seed where A's did not fail; or
    (3) B failed or diverged more often than A: Newcombe's 95 % interval of rate(B) - rate(A)
    lies above 0 (with 5 seeds a side and none broken in A: 3/5 or more in B).
  - invalid trials (a failed integrity probe: leaking masks, non-finite gradients; see
    docs/components.md): regressed when any trial of B is invalid. Invalid trials never
    enter the metric rows.

From Python, harness.compare(RUN_A, RUN_B) returns the same comparison.

Exit codes: 1 when anything regressed, 0 otherwise, 2 on bad input (not a run, no trials, a
measurement run, nothing in common, unknown metric).
"""
from __future__ import annotations

import argparse

from ..lookup import resolve_run
from ..report import METRICS
from ..report.terminal import compare_text
from ..report.compare import DEFAULT_METRICS, compare_runs


def register(sub, parents):
    p = sub.add_parser("compare", parents=parents, help="compare two runs per variant; exit 1 on a regression",
                       description=__doc__.split("\n", 1)[1].strip(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_a", metavar="RUN_A", help="reference run (folder, run id or 'latest')")
    p.add_argument("run_b", metavar="RUN_B", help="candidate run (folder, run id or 'latest')")
    p.add_argument("--results-dir", default="results", metavar="DIR", help="where runs are stored (default results)")
    p.add_argument("--metrics", default=None, metavar="NAMES",
                   help=f"comma-separated metrics to compare (default: those the runs' task shows in compare: "
                        f"{','.join(DEFAULT_METRICS)}, plus wer,per for g2p; built-in: {', '.join(METRICS)}; a "
                        f"plugin task's own too); failed and diverged trials are always judged (see above)")
    p.add_argument("--tolerance", type=float, default=0.0, metavar="X",
                   help="a difference must exceed X (absolute, in the metric's unit) beyond its CI to count "
                        "as a regression (default 0)")
    p.set_defaults(func=main)


def main(args) -> int:
    metrics = None if args.metrics is None else [m.strip() for m in args.metrics.split(",") if m.strip()]
    outcome = compare_runs(resolve_run(args.run_a, args.results_dir), resolve_run(args.run_b, args.results_dir),
                           metrics, args.tolerance)
    print(f"A: {outcome.run_a.root}\nB: {outcome.run_b.root}\n")
    if outcome.config_differences:
        print("config differences (A -> B): " + "; ".join(outcome.config_differences) + "\n")
    print(compare_text(outcome.table))
    print()
    print(outcome.verdict())
    return outcome.exit_code

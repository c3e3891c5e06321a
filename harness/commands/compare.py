"""``python -m harness compare RUN_A RUN_B``: two runs side by side, a regression gate for CI.

RUN_A is the reference, RUN_B the candidate. For every variant (x sweep point) in both runs:

* each gated metric (``--metrics``): A's and B's IQM [95 % bootstrap CI] over their finished
  trials, and the per-seed difference B - A over the seeds that finished in both runs (seed i
  gives both runs the same data order and initial weights, so the seeds are paired): its IQM
  with a 95 % paired percentile-bootstrap CI (``scipy.stats.bootstrap(paired=True)``, seeds
  resampled jointly). The metric **regressed** when that CI lies entirely on the worse side of
  0, beyond ``--tolerance``; ``too few seeds`` below 3 such pairs (no metric gate, but failures
  below are still gated).
* failed or diverged trials (always gated): **regressed** when (1) every trial of B failed,
  whatever A did; or (2) a trial of B failed (raised) at a seed where A's did not fail; or
  (3) B failed or diverged more often than A: Newcombe's 95 % interval of rate(B) - rate(A)
  lies above 0 (with 5 seeds a side and none broken in A: 3/5 or more in B).
* invalid trials (a failed integrity probe: leaking masks, non-finite gradients; see
  docs/components.md): **regressed** when any trial of B is invalid. Invalid trials never
  enter the metric rows.

Exit codes: 1 when anything regressed, 0 otherwise, 2 on bad input (not a run, no trials, a
measurement run, nothing in common, unknown metric).
"""

import argparse

from ..errors import HarnessError
from ..lookup import resolve_run
from ..report import METRICS, to_markdown, trials_frame
from ..report.compare import DEFAULT_METRICS, compare_frames, config_differences


def register(sub, parents):
    p = sub.add_parser("compare", parents=parents, help="compare two runs per variant; exit 1 on a regression",
                       description=__doc__.split("\n", 1)[1].strip(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_a", metavar="RUN_A", help="reference run (folder, run id or 'latest')")
    p.add_argument("run_b", metavar="RUN_B", help="candidate run (folder, run id or 'latest')")
    p.add_argument("--results-dir", default="results", metavar="DIR", help="where runs are stored (default results)")
    p.add_argument("--metrics", default=None, metavar="NAMES",
                   help=f"comma-separated metrics to gate (default {','.join(DEFAULT_METRICS)}, plus wer,per when "
                        f"both runs have them (g2p); "
                        f"known: {', '.join(METRICS)}); failed and diverged trials are always gated (see above)")
    p.add_argument("--tolerance", type=float, default=0.0, metavar="X",
                   help="a difference must exceed X (absolute, in the metric's unit) beyond its CI to count "
                        "as a regression (default 0)")
    p.set_defaults(func=main)


def main(args) -> int:
    sa, sb = resolve_run(args.run_a, args.results_dir), resolve_run(args.run_b, args.results_dir)
    da, db = trials_frame(sa), trials_frame(sb)
    for store, df in ((sa, da), (sb, db)):
        if df.empty or "status" not in df:
            raise HarnessError(f"run {str(store.root)!r} has no stored trials to compare")
        kind = store.meta().kind
        if kind != "train":
            raise HarnessError(f"run {str(store.root)!r} is a measurement ({kind}), not a training "
                               f"run; compare works on training runs")
    if args.metrics is None:  # the defaults, and the error rates of a task that reports them (g2p)
        metrics = list(DEFAULT_METRICS) + [m for m in ("wer", "per") if m in da and m in db]
    else:
        metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    table = compare_frames(da, db, metrics, args.tolerance)
    common = table[~table["status"].isin(["only in A", "only in B"])]
    if common.empty:
        raise HarnessError(f"runs {sa.root.name!r} and {sb.root.name!r} have no variant (x sweep point) in common")
    if not (table["point"] != "").any():
        table = table.drop(columns=["point"])
    print(f"A: {sa.root}\nB: {sb.root}\n")
    diffs = config_differences(sa.meta(), sb.meta())
    if diffs:
        print("config differences (A -> B): " + "; ".join(diffs) + "\n")
    print(to_markdown(table))
    bad = table[table["status"] == "regressed"]
    print()
    if len(bad):
        print(f"REGRESSION: {len(bad)} row(s) regressed (see the status and note columns): "
              + "; ".join(f"{r.variant}{' @ ' + r.point if getattr(r, 'point', '') else ''} {r.metric}"
                          for r in bad.itertuples()))
        return 1
    print("no regression: no metric worse beyond its 95% CI, no new failed or diverged trials beyond the rule")
    return 0

"""``python -m harness report RUN``: re-render a run's report from its stored trials."""
from __future__ import annotations

from ..lookup import resolve_run

DESCRIPTION = """Re-render results/<run-id>/report.md (tables, plots, experiment sections) from the
trials the run stored. RUN is a run folder, a run id under --results-dir, or 'latest': the run
that finished last (status complete in its config.json; check records, benches, profiles and
running, interrupted or killed runs are passed over)."""


def register(sub, parents):
    p = sub.add_parser("report", parents=parents, help="re-render a run's report from stored data",
                       description=DESCRIPTION)
    p.add_argument("run", metavar="RUN", help="run folder, run id under --results-dir, or 'latest'")
    p.add_argument("--results-dir", default="results", metavar="DIR", help="where runs are stored (default results)")
    p.add_argument("--baseline", default=None, metavar="VARIANT",
                   help="variant the others are compared with (default: the experiment's, else 'baseline')")
    p.add_argument("--metric", default=None, metavar="NAME",
                   help="comparison metric of P(variant > baseline): one the run's task declares (default: the "
                        "experiment's, else the task's primary metric: heldout_ce, wer for g2p)")
    p.add_argument("--peers", default=None, metavar="FOLDER",
                   help="a g2p run: copy FOLDER/peers.csv (written by tools/g2p_peers.py on the run's split) into the "
                        "run, so that its reports show the peers beside the variants")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the report path")
    p.add_argument("--tensorboard", action="store_true",
                   help="also export the stored trials (curves, final metrics, hparams) as TensorBoard events, "
                        "under RUN/tensorboard/ (or --logdir DIR/<run-id>/; needs: pip install tensorboard)")
    p.add_argument("--logdir", default=None, metavar="DIR",
                   help="with --tensorboard: write the events under DIR/<run-id>/ instead")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..errors import ConfigError
    from ..experiments import spec_from_meta, write_run_report
    from ..report import (partial_banner, resolve_baseline, run_metrics, summary_table, terminal_table, trials_frame,
                          verdict_metric)

    store = resolve_run(args.run, args.results_dir)
    if args.tensorboard or args.logdir:
        from ..tboard import check_available

        check_available()  # before anything is written
    if args.metric:
        verdict_metric(args.metric, run_metrics(store.meta()))
    df = trials_frame(store)
    if args.baseline and (df.empty or args.baseline not in set(df["variant"])):
        known = sorted(set(df["variant"])) if len(df) else []
        raise ConfigError(f"--baseline {args.baseline!r} is not a variant of this run (variants: {', '.join(known) or 'none'})")
    if args.peers:
        from ..report.peers import attach_peers

        attach_peers(store, args.peers)  # refused in one line (exit 2) when it cannot be compared
    path = write_run_report(store, baseline=args.baseline, metric=args.metric)
    if not args.quiet:
        meta = store.meta()
        if df.empty:
            print(f"harness: run {store.root} has no stored trials yet")
        elif meta.is_training and "heldout_ce" in df:
            spec = spec_from_meta(meta)
            metric = args.metric or (spec.metric if spec else None)
            baseline = args.baseline or (spec.baseline if spec else None)
            for line in partial_banner(store, meta, markdown=False):
                print(line)
            print(terminal_table(summary_table(df, resolve_baseline(df, meta, baseline), metric, meta)))
    print(f"report: {path}")
    if args.tensorboard or args.logdir:
        from ..tboard import export_run

        folder, n, live = export_run(store, args.logdir)
        kept = f", {live} kept as the run wrote them live" if live else ""
        print(f"tensorboard: {n} trial(s) in {folder}{kept}  (tensorboard --logdir {folder})")
    return 0

"""``python -m harness run --suite [NAME]``: every variant of a suite on every task, one report.

A suite file (``experiments/suites/NAME.toml``; the default is ``default``) names a preset, a
list of tasks, the variants, the number of paired seeds and the reference variant::

    description = "..."
    preset = "suite"
    tasks = ["copy", "reverse", "sort", "copy_length"]
    variants = ["all"]
    seeds = 8
    reference = "baseline"
    metric = "heldout_ce"        # the verdict metric: heldout_ce (lower is better) or exact_match
    set = ["train.steps=200"]    # optional --set overrides
    lr_grid = [3e-4, 1e-3, 3e-3] # optional: every task sweeps train.lr (as run --lr-grid, needs a schedule
                                 # other than noam); each variant's is chosen on dev, verdicts are the tuned ones

Each task is an ordinary run stored in ``results/<suite-id>/<task>/`` (its own report.md, trials
and checksums; ``run --suite NAME --resume results/<suite-id>`` runs only what is missing). Before
training, ``check`` (CPU, fp32, seconds) groups the variants into equivalence classes: variants in
one class compute the same function from the same weights, so any training difference between
them is floating-point rounding, not the implementation choice. The report shows such a variant
as "same function" (``=``), never with a verdict; it is the suite's negative control: the report
counts how often the sign test alone would have given a verdict to one of them (a false positive).

The suite report (``suite.md``, ``suite.csv``, ``suite_verdicts.png``) has per task and variant
the held-out metric's IQM with its 95 % bootstrap CI, the paired comparison with the reference
(P(A > B) with its Wilson interval, the sign test and the verdict of :func:`harness.stats.verdict`),
and findings: which slots changed where a verdict was reached, and where none was.

Modules: :mod:`.spec` (the suite file: :class:`~harness.suite.spec.SuiteSpec`, ``load_suite``),
:mod:`.run` (one run per task, the verdicts collected: ``run_suite``, ``collect``), :mod:`.report`
(``suite.md``, ``suite.csv``, the heat map, negative control and findings).
"""

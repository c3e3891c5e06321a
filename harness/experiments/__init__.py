"""Declarative experiments: ``experiments/<name>.toml`` -> a :class:`harness.runner.Plan`.

An experiment file fixes everything a run needs -- task, config, variants, seeds, sweeps -- and
what to conclude from it (baseline, comparison metric, failure definition, the published
claims it checks). ``python -m harness run --experiment NAME`` runs it, ``python -m harness
experiments`` lists them, and the run's report gains the experiment's sections. Format
(documented with examples in ``docs/statistics.md``)::

    description = "one line"                 # required
    variants = ["baseline", "pre_norm"]      # required: names/globs as for --variants
    seeds = 10                               # required: n (seeds 0..n-1) or a list of seeds
    kind = "train"                           # or "grad_norm_at_init" (a measurement, no training)
    preset = "quick"                         # base config (default quick)
    task = "copy"                            # shorthand for config.train.task
    baseline = "baseline"                    # compared against; default "baseline" if selected
    metric = "heldout_ce"                    # metric of P(variant > baseline); default: the task's primary
    source = "Xiong et al. 2020 §3.4"        # what the experiment reproduces
    notes = "caveats known before running"

    [config]                                 # overrides on the preset (dotted or nested)
    model.d_model = 32
    train.steps = 300

    [sweep]                                  # full factorial; short names (noam_factor, N) or dotted keys
    noam_factor = [0.5, 1.0]

    [analysis]                               # optional failure definition
    fail_if_below = { exact_match = 0.5 }    # failed to converge: diverged, or exact_match < 0.5
    fail_if_above = { heldout_ce = 2.3 }

    [measure]                                # kind = "grad_norm_at_init" only
    batches = 16
    parameter = "feed_forward.w_2.weight"
    theory_slope = { baseline = 0.0 }        # variant -> predicted log-log slope on N (optional)

    [[claim]]                                # checked automatically in the report
    text = "..."; source = "..."; check = "verdict"; variant = "shared_embeddings"; expected = "equivalent"

Claim checks: ``verdict`` (variant, expected), ``params_difference`` (a, b, expected: an
expression in the model config's symbols such as ``"2*vocab*d_model"``),
``failure_rate_greater`` (a, b), ``slope`` (variant, within = [lo, hi], stack), and
``ratio_greater`` (a, b, N, min_fraction). Each reports ``reproduced``, ``not reproduced`` or
``inconclusive`` with its evidence.

Command-line options on top of a file: ``--set KEY=VALUE`` overrides its config (and
``--set seeds=N`` its seeds); ``--seeds N`` (with ``--seed-start S``) also overrides the seeds.
``--variants``, ``--grid`` and ``--preset`` are refused (the file decides).

Errors: a malformed file raises :class:`ExperimentError` (exit 2) with one line naming the
file, the key, what was expected and what was found.

Modules: :mod:`.spec` (the parsed form), :mod:`.parse` (files, lookup), :mod:`.plan` (a run's
plan), :mod:`.claims` (claim checks, failure analysis), :mod:`.render` (report sections),
:mod:`.grad_norm` (the measurement kind), :mod:`.figures` (plots), :mod:`.reporting`
(:func:`write_run_report`: a run's report with its experiment's sections).
"""
from __future__ import annotations

from .claims import CLAIM_CHECKS, departures, evaluate_claim, failed_mask, failure_definition, failure_frame
from .figures import plot_failures, plot_grad_norm_depth, plot_grad_norm_layers
from .grad_norm import (check_parameter, measure_grad_norms, slope_table, write_measurement_report,
                        write_measurement_run_report)
from .parse import experiment_dirs, experiment_files, find_experiment, load_experiment, parse_experiment, spec_from_meta
from .plan import n_trials, plan_from_experiment
from .render import claim_sections, departure_sections, intro_sections, report_sections, result_sections
from .reporting import run_table, write_run_report
from .spec import CHECKS, KINDS, MODEL_FIELDS, REPO_ROOT, TOP_KEYS, TRAIN_FIELDS, Experiment, ExperimentError

__all__ = [
    "CHECKS", "CLAIM_CHECKS", "KINDS", "MODEL_FIELDS", "REPO_ROOT", "TOP_KEYS", "TRAIN_FIELDS", "Experiment",
    "ExperimentError", "check_parameter", "claim_sections", "departure_sections", "departures", "evaluate_claim", "experiment_dirs",
    "experiment_files", "failed_mask", "failure_definition", "failure_frame", "find_experiment",
    "intro_sections", "load_experiment", "measure_grad_norms", "n_trials", "parse_experiment",
    "plan_from_experiment", "plot_failures", "plot_grad_norm_depth", "plot_grad_norm_layers",
    "report_sections", "result_sections", "slope_table", "spec_from_meta", "write_measurement_report",
    "run_table", "write_measurement_run_report", "write_run_report",
]

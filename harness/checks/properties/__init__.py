"""Every model-level property a variant is held to, declared once, with where it runs:
:data:`harness.checks.properties.catalogue.PROPERTIES`.

* :mod:`~harness.checks.properties.catalogue` -- the whole table and its markdown (docs/checks.md);
* :mod:`~harness.checks.properties.table` -- :class:`~harness.checks.properties.table.Property`, the ``probe``
  rows and their runner;
* :mod:`~harness.checks.properties.measure` -- the result record and what the probes measure with;
* :mod:`~harness.checks.properties.causal`, :mod:`~harness.checks.properties.padding`,
  :mod:`~harness.checks.properties.outputs` -- the probes (one function per property);
* :mod:`~harness.checks.properties.rows` -- the inputs besides the check's batch (task rows, the gate's batch);
* :mod:`~harness.checks.properties.trial_rows` -- the run gate's rows (its probes at initialisation and
  after training, the ``variant``/``trial`` rows); :class:`harness.trialgate.TrialGate` runs them.

Import each name from the module that defines it.
"""

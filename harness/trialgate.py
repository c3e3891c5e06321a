"""The run gate of one trial, :class:`TrialGate`: every row of
:data:`harness.checks.properties.catalogue.PROPERTIES` that runs in a trial, in one object that the single-trial
loop (:func:`harness.train.train`) and the trial groups (:mod:`harness.group`) both call: ``built(model)`` as the
model is built, ``before(model)`` before the first step, ``after(model, loop)`` after the last,
``verdict(metrics, model)`` on the metrics row.

It lives outside ``harness/checks/`` on purpose: a component that answers honestly only while a check is on the
call stack (``tests/plugins/evade_check_stack.py``) must not be able to tell the final future-leak check, which
this object starts, from an evaluation.
"""
from __future__ import annotations

from torch import nn

from .checks.properties.table import AFTER, BUILD, INIT, TRIAL, VARIANT, GateInputs
from .checks.properties.rows import task_rows
from .checks.properties.trial_rows import VARIANT_ROWS, integrity_reasons
from .config import ModelConfig

#: A trial's status when it fails a row (the same string as :data:`harness.train.INVALID`; a test holds them equal).
INVALID = "invalid"


class TrialGate:
    """The run gate of one trial (see the module docstring). ``registry`` and ``variant`` None: the ``variant``
    rows are left out (:func:`harness.train.train` called on a model alone). The caller times each call in its
    own phase (:class:`harness.train.PhaseClock`).

    ``broken``: the ``variant`` rows' lines; ``invalid``: the ``probe`` rows' lines (at initialisation, after
    training)."""

    def __init__(self, model_cfg: ModelConfig, task, seq_len: int, seed: int, device, dtype: str = "fp32",
                 registry=None, variant=None):
        self.model_cfg, self.task, self.seq_len, self.seed = model_cfg, task, seq_len, seed
        self.device, self.dtype, self.registry, self.variant = device, dtype, registry, variant
        self.broken: list[str] = []
        self.invalid: list[str] = []

    def _variant_rows(self, where: str, inputs: GateInputs) -> list[str]:
        """The lines of the ``variant`` rows that run at ``where`` and apply, in table order; a row whose
        ``requires`` failed is skipped (its fault is named by the one that failed)."""
        if self.registry is None or self.variant is None:
            return []
        failed, out = set(), []
        for row in VARIANT_ROWS:
            if row.kind != VARIANT or where not in row.where or not row.when(inputs):
                continue
            if any(r in failed for r in row.requires):
                failed.add(row.name)
                continue
            lines = row.measure(inputs)
            if lines:
                failed.add(row.name)
            out += lines
        return out

    def _inputs(self, model, forward=None, loop=None) -> GateInputs:
        return GateInputs(self.registry, self.variant, self.model_cfg, self.seed, self.device, self.dtype, model,
                          forward, loop)

    def built(self, model: nn.Module) -> None:
        """The ``build`` rows (a second build, training = evaluation, bf16, GPU, slot contracts) on ``model``."""
        self.broken += self._variant_rows(BUILD, self._inputs(model))

    def before(self, model: nn.Module) -> None:
        """The ``init`` probe rows on ``model`` before its first step (seed: the trial's)."""
        self.invalid += integrity_reasons(model, self.model_cfg, self.device, seed=self.seed,
                                          when="at initialisation", where=INIT,
                                          task=task_rows(self.task, self.seq_len, self.model_cfg, self.seed))

    def after(self, model: nn.Module, loop) -> list[str]:
        """After the last step, unless ``loop`` (:class:`harness.train.TrainingLoop`) stopped on a divergence: the
        future-leak row on dev rows, then the ``after`` probe rows (seed: the trial's + 1, so other rows than at
        initialisation). Returns every ``probe`` and ``trial`` line so far, for ``loop.metrics``."""
        if loop.status == "ok":
            if any(row.kind == TRIAL and AFTER in row.where for row in VARIANT_ROWS):
                loop.check_future(loop.step, final=True)  # the future-leak row; its line joins ``loop.leaks``
            seed = self.seed + 1
            self.invalid += integrity_reasons(model, self.model_cfg, self.device, seed=seed, when="after training",
                                              where=AFTER, task=task_rows(self.task, self.seq_len, self.model_cfg, seed))
        return self.invalid + loop.leaks

    def verdict(self, metrics: dict, model: nn.Module, forward=None) -> dict:
        """``metrics`` (a trial's row, from ``loop.metrics``) with the ``after`` ``variant`` rows run (a fresh build
        holding the trained parameters; ``forward`` as :class:`GateInputs`') and every ``variant`` line applied:
        status ``invalid`` with the lines before the reason, unless the trial diverged. Changed in place; returned."""
        if metrics["status"] == "diverged":
            return metrics
        broken = self.broken + self._variant_rows(AFTER, self._inputs(model, forward=forward))
        if broken:
            metrics["reason"] = "; ".join(broken + ([metrics["reason"]] if metrics["reason"] else []))
            metrics["status"] = INVALID
        return metrics

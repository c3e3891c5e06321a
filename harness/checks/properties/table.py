"""Every model-level property, declared once: :data:`PROPERTIES`, one :class:`Property` row each, saying what
it measures, on which inputs, where it runs (``check``, the run gate as a trial's model is built, before its first
step, at every evaluation, after its last step), when it applies and the fault it names.

Three kinds of row:

* ``probe`` -- a function of the model alone on a batch (:class:`ProbeInputs` -> :class:`ProbeResult`); the rows
  run in table order by :func:`run_properties` (``check`` with the variant's own threshold, the run gate with
  :mod:`harness.checks.policy`'s ``GATE_ATOL``/``GATE_RTOL``);
* ``variant`` -- needs the registry and the variant (a second build, the slot contracts, a fresh build after
  training): :class:`GateInputs` -> reason lines, run by :class:`harness.trialgate.TrialGate`;
* ``trial`` -- needs the training loop (the future-leak check on dev rows at every evaluation).

The ``probe`` rows are :data:`PROBE_ROWS` here; the ``variant`` and ``trial`` rows are
:data:`harness.checks.properties.trial_rows.VARIANT_ROWS`, beside the gate that runs them; the whole table is
:data:`harness.checks.properties.catalogue.PROPERTIES`. A new property is one function and one row (docs/checks.md,
"Add a property"); ``tests/test_properties.py`` holds every row to a plugin in ``tests/plugins/`` that it catches
and to its line in docs/checks.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from ...config import ModelConfig
from ...model import ENCODER_DECODER
from .causal import probe_causal
from .measure import ProbeResult
from .outputs import probe_finite, probe_prefix
from .padding import probe_extra_padding, probe_masked_keys
from .source import probe_source_blind

#: Where a property runs: ``check``; the run gate as the trial's model is built (``build``), before its first step
#: (``init``), at every periodic evaluation (``evaluation``) and after its last step (``after``).
CHECK, BUILD, INIT, EVALUATION, AFTER = "check", "build", "init", "evaluation", "after"
WHERE = (CHECK, BUILD, INIT, EVALUATION, AFTER)
PROBE, VARIANT, TRIAL = "probe", "variant", "trial"


@dataclass
class ProbeInputs:
    """What a ``probe`` row runs on: ``batch`` ``(src (B, S), tgt (B, T), labels (B, T))`` with every target row
    starting with a real token; ``threshold`` the largest allowed change of a logit; ``long`` rows as long as
    ``max_len`` and ``task`` rows the trial's task drew (:mod:`harness.checks.properties.rows`; None: the rows that
    need them do not apply); ``where`` one of :data:`WHERE`; ``results`` the results so far, by row name."""

    model: Any
    batch: Any
    cfg: ModelConfig
    threshold: float
    device: Any = "cpu"
    dtype: str = "fp32"
    seed: int = 0
    name: str = ""
    cuts: str = "all"
    long: Any = None
    task: Any = None
    where: str = CHECK
    results: dict[str, ProbeResult] = field(default_factory=dict)

    @property
    def kw(self) -> dict[str, Any]:
        return {"device": self.device, "dtype": self.dtype, "name": self.name}

    def passed(self, row: str) -> bool:
        r = self.results.get(row)
        return r is not None and r.passed


@dataclass
class GateInputs:
    """What a ``variant`` or ``trial`` row runs on: the trial's registry, variant, model config, seed, device,
    dtype, its ``model``; ``forward`` ``(src, tgt) -> logits (B, T, V)`` of the module that actually trained where
    that is not ``model`` (a trial group's functional base module); ``loop`` the training loop
    (:class:`harness.train.TrainingLoop`) after its last step."""

    registry: Any
    variant: Any
    model_cfg: ModelConfig
    seed: int
    device: Any
    dtype: str = "fp32"
    model: Any = None
    forward: Callable | None = None
    loop: Any = None


def _always(_inputs) -> bool:
    return True


@dataclass(frozen=True)
class Property:
    """One row of :data:`PROPERTIES`. ``measure``: a ``probe`` row's ``ProbeInputs -> ProbeResult``, a ``variant``
    or ``trial`` row's ``GateInputs -> list[str]`` (one reason line per failure, empty when it holds);
    ``where``: the places of :data:`WHERE` it runs; ``applies``: when it runs there (prose) and ``when`` the same as
    a predicate of the inputs; ``requires``: rows that must have passed first (a failure there names the fault
    better); ``fault``: what a failure names; ``names``: words the failure line holds (the meta-test checks them
    on ``catches``, the stem of a plugin in ``tests/plugins/`` that has the fault)."""

    name: str
    kind: str
    measure: Callable[[Any], Any]
    inputs: str
    where: tuple[str, ...]
    applies: str
    fault: str
    catches: str
    names: str
    when: Callable[[Any], bool] = _always
    requires: tuple[str, ...] = ()


def _causal(mode: str, rows: str = "batch"):
    def run(p: ProbeInputs) -> ProbeResult:
        if rows == "batch":
            return probe_causal(p.model, p.batch, p.cfg, p.threshold, mode, seed=p.seed, cuts=p.cuts,
                                eval_passed=mode == "train" and p.passed("causal leak, eval mode"), **p.kw)
        r = probe_causal(p.model, p.long if rows == "long" else p.task, p.cfg, p.threshold, "eval", seed=p.seed,
                         cuts="long", **p.kw)
        return _renamed(r, rows)
    return run


def _keys(mode: str, rows: str = "batch"):
    def run(p: ProbeInputs) -> ProbeResult:
        if rows == "batch":
            return probe_masked_keys(p.model, p.batch, p.cfg, p.threshold, mode, seed=p.seed,
                                     eval_passed=mode == "train" and p.passed("masked source keys, eval mode"), **p.kw)
        return _renamed(probe_masked_keys(p.model, p.task, p.cfg, p.threshold, "eval", seed=p.seed, **p.kw), rows)
    return run


def _renamed(r: ProbeResult, rows: str) -> ProbeResult:
    """``r`` under its row's probe name: "causal leak (long rows)", "... (task rows)" (the detail says where)."""
    if rows == "long":
        return dataclasses.replace(r, probe=LONG_ROWS_PROBE)
    return dataclasses.replace(r, probe=f"{r.probe} (task rows)", detail=f"on rows the task drew: {r.detail}"
                               if r.detail else "")


def _encoder_decoder(p: ProbeInputs) -> bool:
    """The model has a source padding mask: an encoder-decoder (a decoder-only or prefix-LM model packs source
    and target into one sequence whose padding comes after every real token, :mod:`harness.decoder_only`)."""
    return getattr(p.model, "architecture", ENCODER_DECODER) == ENCODER_DECODER


_SOURCE_MASK = ("encoder-decoder models (decoder-only and prefix-LM models pack the padding after every real token, "
                "where no query reaches it: the extra-padding row holds them)")


#: The probe name of the causal probe on the long rows.
LONG_ROWS_PROBE = "causal leak (long rows)"

_EVERYWHERE = (CHECK, INIT, AFTER)
_PADDED = "the padded batch (rows of every length, target rows starting with the start symbol)"


#: The model-level properties of the probes, in the order they run (a row may read the results before it).
PROBE_ROWS: tuple[Property, ...] = (
    Property("finite", PROBE, lambda p: probe_finite(p.model, p.batch, p.cfg, **p.kw), _PADDED + ", training mode",
             _EVERYWHERE, "always",
             "a non-finite output (logits at real target positions NaN or inf in training mode, with the first module "
             "whose output is non-finite) or a non-finite gradient (a NaN at a padded row reaches the gradients)",
             "adv_nan_in_training", "non-finite output in training mode"),
    Property("source sees target", PROBE, lambda p: probe_source_blind(p.model, p.batch, p.cfg, p.threshold,
                                                                       seed=p.seed, **p.kw),
             _PADDED + "; every target token after the start symbol redrawn, the stack's source states compared",
             _EVERYWHERE, "decoder-only and prefix-LM models (one stack over source + target)",
             "a source position's state depends on the target (a prefix-LM mask that lets the source attend to target "
             "keys: every target position then reads later target tokens through the source)",
             "adv_prefix_sees_target", "a source position sees the target", when=lambda p: not _encoder_decoder(p)),
    Property("causal leak, eval mode", PROBE, _causal("eval"), _PADDED + "; the target after each cut redrawn, "
             "shortened and extended; the changed batches stacked into one forward", _EVERYWHERE, "always",
             "an output at a real target position depends on a later target token (it sees the future), on the "
             "target's length through its padding, or on the batch it is in (the unchanged batch stacked the same "
             "way moves too)", "adv_causal_shift", "it sees the future"),
    Property("masked source keys, eval mode", PROBE, _keys("eval"), _PADDED + "; the tokens behind the source padding "
             "replaced, the masks kept", _EVERYWHERE, _SOURCE_MASK,
             "the source padding mask is not applied (encoder self-attention or cross-attention)",
             "adv_src_pad_ignored", "source padding mask not applied", when=_encoder_decoder),
    Property("causal leak, train mode", PROBE, _causal("train"), _PADDED + "; autograd on, dropout as configured, the "
             "RNG re-seeded before each forward", _EVERYWHERE, "always (the run gate: the cuts 0 and T // 2 - 1)",
             "the future is seen in training only (a mask skipped in training; BatchNorm statistics over the "
             "batch, named)", "adv_eval_only_mask", "(train mode): it sees the future"),
    Property("masked source keys, train mode", PROBE, _keys("train"), _PADDED + "; autograd on, dropout as "
             "configured", _EVERYWHERE, _SOURCE_MASK, "the source padding reaches real positions in training only",
             "adv_batchnorm_per_position", "(train mode)", when=_encoder_decoder),
    Property("extra source padding", PROBE, lambda p: probe_extra_padding(p.model, p.batch, p.cfg, p.threshold, **p.kw),
             _PADDED + " with 3 pad tokens appended to every source row", _EVERYWHERE, "always",
             "padded source keys are attended to (source padding ignored)", "adv_src_pad_ignored",
             "pad tokens were appended to the source"),
    Property("prefix = whole target", PROBE,
             lambda p: probe_prefix(p.model, p.batch, p.cfg, p.threshold, causal_passed=p.passed(
                 "causal leak, eval mode"), **p.kw), _PADDED + "; one forward per target width", (CHECK,),
             "check only: every evaluation of a trial compares prefix-only and whole-target logits on dev rows "
             "(the future-leak row)",
             "an output depends on the decoder input's width (a branch on a single query, a scale by the length): "
             "trained as one function, scored as another", "adv_single_query_scale", "decoder input's width"),
    Property("causal leak (long rows)", PROBE, _causal("eval", "long"), "rows as long as max_len (up to "
             "policy.LONGEST_ROW), every 4th cut", _EVERYWHERE, "where long rows are given (check; the run gate)",
             "a leak that opens only from some position on (a mask or layer that mixes positions past 16)",
             "adv_causal_leak_after_16", "decoder position 16 changed", when=lambda p: p.long is not None),
    Property("causal leak (task rows)", PROBE, _causal("eval", "task"), "8 rows the trial's task drew (check: the "
             "preset's task), every 4th cut", _EVERYWHERE, "where the task can draw rows the model takes",
             "a leak that shows only on what real data looks like (which ids a row holds)",
             "adv_causal_without_specials", "on rows the task drew", when=lambda p: p.task is not None),
    Property("masked source keys (task rows)", PROBE, _keys("eval", "task"), "8 rows the trial's task drew",
             _EVERYWHERE, "where the task can draw rows the model takes, in " + _SOURCE_MASK,
             "source padding attended only on what real data looks like", "adv_source_without_specials",
             "on rows the task drew", when=lambda p: p.task is not None and _encoder_decoder(p)),
)


def run_properties(inputs: ProbeInputs) -> list[ProbeResult]:
    """Every ``probe`` row that runs at ``inputs.where`` and applies to ``inputs``, in table order; their results."""
    out = []
    for row in PROBE_ROWS:
        if inputs.where in row.where and row.when(inputs):
            inputs.results[row.name] = r = row.measure(inputs)
            out.append(r)
    return out

"""The run gate's rows: :func:`integrity_reasons` (the ``probe`` rows at initialisation and after training) and
:data:`VARIANT_ROWS` (the rows that need the variant or the training loop). :class:`harness.trialgate.TrialGate`
runs them for every trial; it lives outside ``harness/checks/`` on purpose: a component that answers honestly only
while a check is on the call stack (``tests/plugins/evade_check_stack.py``) cannot tell the final future-leak check
from an evaluation.

A trial that fails a row is trained all the same and stored with status ``invalid`` with the reasons, so that no
report ranks it: a ``probe`` or ``trial`` row's failure always (even when the trial diverged), a ``variant`` row's
unless it diverged.
"""
from __future__ import annotations

import torch
from torch import nn

from ...config import ModelConfig
from ...tasks.base import future_leak
from .. import gate as g
from ..inputs import describe_exception, long_rows_of
from ..policy import GATE_ATOL, GATE_RTOL
from .rows import gate_batch
from .table import (AFTER, BUILD, CHECK, EVALUATION, INIT, TRIAL, VARIANT, GateInputs, ProbeInputs, Property,
                    run_properties)


def integrity_reasons(model: nn.Module, cfg: ModelConfig, device, *, seed: int = 0, when: str = "",
                      task=None, where: str = INIT) -> list[str]:
    """The run gate's probes: every ``probe`` row of :data:`~harness.checks.properties.table.PROPERTIES` that runs
    at ``where`` (:data:`~harness.checks.properties.table.INIT` or ``AFTER``) on :func:`gate_batch`, in float32 (the
    ``prefix = whole target`` row is check-only: a trial compares prefix-only and whole-target logits on dev rows at
    every evaluation, :func:`harness.tasks.base.future_leak`); with ``task`` (:func:`task_rows`) the task-row rows
    too.
    Returns one line per failed probe (empty: the model passes). Threshold: ``GATE_ATOL + GATE_RTOL * max |logit|``
    (:mod:`harness.checks.policy`).
    The model's training mode is restored, its gradients cleared, its weights, its buffers (a BatchNorm's
    running statistics, which the train-mode probes' forwards would update) and the global RNG state
    left unchanged."""
    device = torch.device(device)
    batch = gate_batch(cfg, seed=seed)
    was_training = model.training
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            model.eval()
            scale = float(torch.nan_to_num(model(batch[0].to(device), batch[1].to(device)).abs().max(), nan=0.0))
        thr = GATE_ATOL + GATE_RTOL * scale
        with torch.random.fork_rng(devices=devices):  # the trial's own RNG stream is left as it was
            results = run_properties(ProbeInputs(model, gate_batch(cfg, seed=seed, long_rows=0), cfg, thr,
                                                 device=device, seed=seed, cuts="few", long=long_rows_of(batch, 6),
                                                 task=task, where=where))
    except Exception as exc:  # noqa: BLE001 - the trial itself will fail with its own message
        return [f"probes crash{' ' + when if when else ''}: {describe_exception(exc)}"]
    finally:
        model.train(was_training)
        with torch.no_grad():
            for b, before in buffers:
                b.copy_(before)
    prefix = f"{when}: " if when else ""
    seen, out = set(), []
    for r in results:
        if not r.passed and r.probe not in seen:
            seen.add(r.probe)
            out.append(prefix + r.detail)
    return out


def _twin(i: GateInputs) -> list[str]:
    return g.twin_reasons(i.registry, i.variant, i.model_cfg, i.seed, i.model, i.device, i.dtype)


def _modes(i: GateInputs) -> list[str]:
    return g.cached_reasons("modes", i.registry, i.variant, i.model_cfg, i.device, i.dtype,
                            lambda: g.modes_reasons(i.registry, i.variant, i.model_cfg, i.seed, i.device))


def _precision(i: GateInputs) -> list[str]:
    return g.cached_reasons("precision", i.registry, i.variant, i.model_cfg, i.device, i.dtype,
                            lambda: g.precision_reasons(i.registry, i.variant, i.model_cfg, i.seed, i.device))


def _device(i: GateInputs) -> list[str]:
    return g.cached_reasons("device", i.registry, i.variant, i.model_cfg, i.device, i.dtype,
                            lambda: g.device_reasons(i.registry, i.variant, i.model_cfg, i.seed, i.device))


def _contracts(i: GateInputs) -> list[str]:
    return g.contract_reasons(i.registry, i.variant, i.model_cfg)


def _drift(i: GateInputs) -> list[str]:
    return g.drift_reasons(i.registry, i.variant, i.model_cfg, i.seed, i.model, i.device, forward=i.forward)


_BUILT = "the variant built again from the trial's seed, dropout 0, on the run gate's padded batch"

#: The rows that need the variant (``variant``) or the training loop (``trial``: measured by
#: :func:`harness.tasks.base.future_leak`, run by the loop's ``check_future`` at every evaluation and by
#: :meth:`harness.trialgate.TrialGate.after` after the last step), in the order they run.
VARIANT_ROWS: tuple[Property, ...] = (
    Property("same build twice", VARIANT, _twin, "a second build from the trial's seed; the gate's batch, eval mode",
             (BUILD,), "every trial", "a component factory that hands the checks one object and the trial another "
             "(module tree, weights or outputs differ)", "evade_two_faces", "two builds of the variant"),
    Property("training = evaluation", VARIANT, _modes, _BUILT + "; training- and evaluation-mode logits and "
             "gradients", (CHECK, BUILD), "unless a component declares a training difference (BatchNorm)",
             "a function that is the paper's in evaluation mode only (every reference comparison runs there)",
             "adv_scale_in_training", "training", requires=("same build twice",)),
    Property("bf16 autocast = float32", VARIANT, _precision, _BUILT + "; float32 vs bf16 autocast vs bf16-rounded "
             "weights", (CHECK, BUILD), "check: every variant; the gate: bf16 trials",
             "a function that changes under bf16 autocast, or parameters that get no gradient there",
             "adv_scale_in_bf16", "under bf16 autocast", when=lambda i: i.dtype == "bf16",
             requires=("training = evaluation",)),
    Property("GPU = CPU", VARIANT, _device, _BUILT + "; the same weights on the trial's device and on the CPU",
             (CHECK, BUILD), "check: on a machine with CUDA; the gate: trials on a GPU",
             "a component that takes another code path on a GPU than the CPU checks saw", "evade_scale_on_gpu",
             "differ from the CPU's", when=lambda i: torch.device(i.device).type != "cpu",
             requires=("bf16 autocast = float32",)),
    Property("slot contracts", VARIANT, _contracts, "each component of the variant against its slot's reference at "
             "the trial's model config", (CHECK, BUILD), "every component (declared differences pass)",
             "an undeclared difference from the slot's reference, named by the slot's formulas", "adv_scale_d_model",
             "contract: "),
    Property("future leak (dev rows)", TRIAL, future_leak, "dev rows of the trial's own task: prefix-only vs "
             "whole-target logits, and the prefix-only logits again after the whole targets were shown",
             (EVALUATION, AFTER), "every periodic evaluation and after training (not after a divergence)",
             "an output that depends on a later target token on real data (a check-gaming mask), or a model that "
             "keeps state between forwards (it can memorise held-out answers)", "evade_check_stack",
             "an output depends on a later target token"),
    Property("fresh build = trained model", VARIANT, _drift, _BUILT + " holding the trained parameters", (AFTER,),
             "after training, unless the trial diverged or a component declares a training difference",
             "a component that changes with use (a call counter, a cache kept between batches, a buffer updated in "
             "its forward)", "evade_scale_after_calls", "drift: "),
)


"""One training loop for every variant, and the trial function every executor calls.

A *trial* is one variant x one seed x one config on one device. :func:`run_trial` takes a
:class:`harness.trial.TrialSpec` and returns a :class:`harness.trial.TrialResult`: the trial's
metrics row and its loss curve (the same function serves in-process, process-pool and Ray
execution; a worker rebuilds the spec from its dict: :mod:`harness.executors`).

Training (identical for every variant): the config's recipe (:mod:`harness.recipe`): Adam(beta =
(0.9, 0.98), eps = 1e-9) (Vaswani et al. 2017 §5.3) or AdamW, PyTorch's fused implementation where
the device supports it, with the config's schedule through ``LambdaLR`` (:mod:`harness.schedule`;
by default the Annotated Transformer's ``rate``: noam_factor * d_model^-0.5 * min(step^-0.5, step *
warmup^-1.5), step counted from 1);
``F.cross_entropy(..., ignore_index=pad, label_smoothing=eps)`` in float32 (note: PyTorch
spreads eps over all V classes, the Annotated ``LabelSmoothing`` over V - 2); held-out
scores from prefix-only forwards (exact match: the event that greedy decoding gets every label
right). ``dtype="bf16"`` runs the forward pass under
``torch.autocast(device, torch.bfloat16)``: matmuls in bfloat16, parameters, optimizer state,
the residual stream of every built-in variant and the loss in float32. The loss and the
held-out scoring belong to the task (:mod:`harness.tasks.base`); the process set-up (devices,
threads, the process-wide settings every trial applies, peak memory, the environment block) to
:mod:`harness.env`. Both are re-exported here for callers of earlier versions.
"""
from __future__ import annotations

import collections
import contextlib
import math
import time
import traceback
from typing import Any, Callable

import torch
from torch.autograd.profiler import record_function

from . import stats
from .checkpoint import Checkpointer
from .trialgate import TrialGate
from .config import RunConfig
from .env import autocast, deterministic_cuda, peak_mem_mb, pin_threads, reset_peak_mem, trial_device, trial_settings
from .errors import failure_reason
from .measure import measure
from .metrics import DEV_SPLIT, EVAL_SPLITS, dev_values, row_values
from .model import build_model, unique_parameter_count
from .recipe import make_optimizer
from .registry import Variant
from .saved import keep_weights
from .tasks.base import Batch, Task, future_leak, loss_fn
from .tasks.splits import dev_set, leak_set, test_set
from .track import TrialTracking, trial_tracking
from .trial import FAILED, TrialResult, TrialSpec, registry_for

#: Names of the ``torch.profiler.record_function`` ranges that mark a trial's phases (about
#: 10 us each when no profiler runs). ``step`` is the model's own work; every other phase is the
#: harness's overhead (what each covers: :data:`harness.perf.overhead.PHASE_NOTES`).
PHASES = {k: f"harness.{k}" for k in ("build", "data", "step", "log", "evaluate", "final_eval", "store")}


class PhaseClock:
    """Wall time and count per phase of a trial (:data:`PHASES`), summed with
    ``time.perf_counter`` around the same blocks that carry the ``record_function`` ranges.

    ``with clock("data"): ...`` times the block (seconds) and marks it for ``torch.profiler``;
    it costs a few microseconds per block. The phase sums need no profiler, so every trial
    records them (the ``overhead_share`` column) and ``harness profile`` can read them for a
    trial of any length; ``harness profile --torch-profiler`` cross-checks them against the
    profiler's own ranges.

    A block inside a block of the same phase (a trial group's evaluation around each seed's
    bookkeeping) is neither timed nor counted again: ``calls`` counts the outermost blocks.
    ``current`` is the innermost phase open now (None outside every block).
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {k: 0.0 for k in PHASES}
        self.calls: dict[str, int] = {k: 0 for k in PHASES}
        self._open: list[str] = []

    @property
    def current(self) -> str | None:
        return self._open[-1] if self._open else None

    @contextlib.contextmanager
    def __call__(self, name: str):
        if name in self._open:  # nested in its own phase: already timed by the outer block
            yield
            return
        with record_function(PHASES[name]):
            self._open.append(name)
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1
                self._open.pop()

    def to_dict(self) -> dict[str, dict[str, float]]:
        """``{phase: {"s": seconds, "calls": n}}``."""
        return {k: {"s": self.seconds[k], "calls": self.calls[k]} for k in PHASES}

SOLVED = 0.99  #: dev exact-match threshold for "solved" (time/steps to solve)
LEAK_ROWS = 64  #: fresh dev sequences of each evaluation's future-leak check (:func:`future_leak`)
#: Training steps left out of ``step_ms`` and ``tokens_per_s`` (warm-up: the first steps of a
#: process run slower -- allocator, lazily built kernels, cold caches); all steps count when a
#: trial runs no more than this many.
WARMUP_STEPS = 10

def train_step(model, batch: Batch, opt, sched, cfg: RunConfig, device: torch.device, dtype: str = "fp32",
               clock: Callable[[str], None] | None = None) -> tuple[float, float]:
    """One optimizer step on ``batch`` (already on ``device``); the step the loop and the bench share.

    Gradients cleared (set to None); forward (under autocast for ``bf16``) and float32 loss; backward; global gradient norm
    (clipped to ``train.grad_clip`` when > 0); Adam and scheduler step, skipped when the
    loss or the gradient norm is not finite.

    Args:
        clock: optional ``clock(phase)`` called after ``"forward"`` (loss included),
            ``"backward"`` and ``"optimizer"`` (gradient norm, Adam, scheduler); the bench
            uses it to time the phases.

    Returns:
        ``(loss, grad_norm)`` as Python floats (loss in nats/token).
    """
    tc, pad = cfg.train, cfg.model.pad
    opt.zero_grad(set_to_none=True)  # before the forward: the old gradients never coexist with activations
    with autocast(device, dtype):
        logits = model(batch.src, batch.tgt)
    loss = loss_fn(logits, batch.tgt_y, pad, tc.label_smoothing)
    if clock:
        clock("forward")
    loss.backward()
    if clock:
        clock("backward")
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if tc.grad_clip > 0:
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
    else:  # the norm only (divergence check), without clip_grad_norm_'s multiply by 1.0
        gnorm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
    loss_v, gnorm_v = float(loss.detach()), float(gnorm)
    if math.isfinite(loss_v) and math.isfinite(gnorm_v):
        opt.step()
        sched.step()
    if clock:
        clock("optimizer")
    return loss_v, gnorm_v


#: How exact-match accuracy was computed (the ``exact_match_method`` column): every evaluation,
#: periodic and final, scores prefix-only forwards (:func:`harness.tasks.base.prefix_logits`), whose
#: exact match is the event that greedy decoding gets every label right, leak or no leak.
EM_PREFIX = "prefix-only forwards (= greedy decoding)"

#: ``exact_match_method`` of a task that scores free-running decoding (``g2p``: exact match = 1 - WER).
DECODING_METHOD = "free-running decoding (fed only its own predictions)"


def decoding_name(beam: int) -> str:
    """``"greedy"`` (``train.beam`` = 1) or ``"beam K"``: the ``decoding`` column of a task with WER/PER."""
    return "greedy" if beam == 1 else f"beam {beam}"


#: Trial status of a variant that fails an integrity probe (:func:`harness.checks.properties.trial_rows.integrity_reasons`)
#: at initialisation or after training: it still trains, its numbers are stored, and no report ranks it.
INVALID = "invalid"


def train(model, cfg: RunConfig, seed: int, device: torch.device, dtype: str = "fp32",
          progress: Callable[[int, float], None] | None = None,
          clock: PhaseClock | None = None, task: Task | None = None,
          tracking: TrialTracking | None = None, saver: Checkpointer | None = None,
          gate: TrialGate | None = None) -> tuple[dict[str, Any], list[dict]]:
    """Train ``model`` on ``task`` (default: the registered task named ``cfg.train.task``) and
    score it on the task's dev and test sets (:meth:`harness.tasks.base.Task.evaluate`,
    :mod:`harness.tasks.splits`); returns (metrics, curve).

    The curve holds one ``{"step", "split": "train", "loss", "grad_norm"}`` row per ``train.log_every``
    steps and before each evaluation (the means of the steps since the previous row, the gradient
    norm before clipping; the last step always closes one) and one
    ``{"step", "split": "dev", "loss", "exact_match", "wall_s"}`` row per evaluation, each on the
    :data:`~harness.tasks.splits.DEV_SEQUENCES` dev sequences, the last one after training. The test set is scored once,
    after training: the row's ``heldout_ce``, ``exact_match``, ... (the dev numbers beside them as
    ``dev_ce``, ``dev_exact_match``, ...); nothing before that reads it, so no selection can.
    Stops early with status ``diverged`` when the loss or the gradient norm is not finite.

    Timing: ``train_s`` (and a curve row's ``wall_s``) is the wall time of the training steps
    -- batch generation, forward, backward, optimizer, the ``progress`` callback -- with every
    evaluation excluded. ``time_to_solve_s`` is ``train_s`` at the first dev evaluation
    with exact-match >= :data:`SOLVED` (periodic or after training). ``step_ms`` (ms per step) and ``tokens_per_s``
    (label tokens per second) leave out the first :data:`WARMUP_STEPS` steps: they time steps
    ``WARMUP_STEPS + 1`` to the last (all steps when the trial ran no more than that).

    Integrity gate (``gate``, a :class:`harness.trialgate.TrialGate`; default: one without the
    variant's rows, for a model alone): before the first step and after the last, the model must pass the
    ``probe`` rows of :data:`harness.checks.properties.catalogue.PROPERTIES` (causal with the target redrawn,
    shortened and extended; source padding; finite gradients), and at every evaluation its logits with the whole
    target in the input must equal its prefix-only logits on :data:`LEAK_ROWS` fresh dev
    sequences (:func:`harness.tasks.base.future_leak`, real data at the task's lengths). A model
    that fails is trained all the same (its numbers are visible) but gets status :data:`INVALID`
    with the reasons, so that no report ranks it.

    Scores: every held-out number (CE, token accuracy, exact match; periodic and final) comes from
    prefix-only forwards (:func:`harness.tasks.base.evaluate`), so a leak the gate missed still
    cannot improve them. Training losses (``early_loss``, ``final_train_loss``) are teacher-forced.
    ``tracking`` (:mod:`harness.track`) gets each curve row as it is made.

    Checkpoints: ``saver`` (a :class:`harness.checkpoint.Checkpointer`) continues the loop from the
    trial's checkpoint where there is one and writes one every ``train.checkpoint_every``.
    """
    tc, mc = cfg.train, cfg.model
    if task is None:
        task = registry_for(None).task(tc.task)
    task = task.for_config(cfg)
    task.validate(cfg)
    clock = clock or PhaseClock()
    torch.manual_seed(seed)
    gate = gate or TrialGate(mc, task, tc.seq_len, seed, device, dtype)
    with clock("evaluate"):
        gate.before(model)
    loop = TrainingLoop(model, cfg, task, device, dtype, clock, tracking)
    loop.run(torch.Generator().manual_seed(seed), progress, saver)
    with clock("final_eval"):
        dev = task.evaluate(model, loop.dev, cfg, device, dtype)
        final = task.evaluate(model, loop.test, cfg, device, dtype)
        invalid = gate.after(model, loop)
    return loop.metrics(final, invalid, dev), loop.curve


class TrainingLoop:
    """The state of one :func:`train` call: the step loop with its periodic dev evaluations
    (:meth:`run`), then the metrics row (:meth:`metrics`). ``splits``: the (test, dev) sets when the
    caller drew them (a trial group shares one pair; default :func:`harness.tasks.splits.test_set`
    and :func:`~harness.tasks.splits.dev_set`); the test set is only read by the final evaluation."""

    def __init__(self, model, cfg: RunConfig, task: Task, device: torch.device, dtype: str, clock: PhaseClock,
                 tracking: TrialTracking | None = None, splits: tuple[Batch, Batch] | None = None):
        self.model, self.cfg, self.task, self.device, self.dtype, self.clock = model, cfg, task, device, dtype, clock
        self.tracking = tracking or TrialTracking()  # live TensorBoard / MLflow: each curve row as it is made
        self.leaks: list[str] = []  # the first failed future-leak check (:meth:`check_future`)
        self.test, self.dev = splits or draw_splits(task, cfg)
        self.opt, self.sched = make_optimizer(model, cfg)
        self.curve: list[dict] = []
        self.status, self.reason = "ok", ""
        self.tokens, self.step, self.train_s = 0, 0, 0.0
        self.solved_step: int | None = None
        self.solved_s: float | None = None
        # the losses of steps 1-10 (early_loss), the last 10 (final_train_loss), those since the last curve row
        self.first_losses, self.last_losses, self.pending = [], collections.deque(maxlen=10), []
        self.warm_s, self.warm_tokens = 0.0, 0  # train_s and tokens after the warm-up steps

    def run(self, gen: torch.Generator, progress: Callable[[int, float], None] | None,
            saver: Checkpointer | None = None) -> None:
        """Train ``train.steps`` steps on batches from ``gen``; stop early on a non-finite loss or
        gradient norm (status ``diverged``) or, with ``train.stop_at_solved``, once solved. With
        ``saver``: from the trial's checkpoint, if any, writing one when due (:mod:`harness.checkpoint`)."""
        self.model.train()
        stream, start = saver.resume(self, gen) if saver else (self.task.batches(self.cfg, gen), 0)
        for row in self.curve if start else ():  # continued from a checkpoint: the live record gets the rows before it
            self.tracking.point(row)
        with saver.interrupts() if saver else contextlib.nullcontext():
            self._steps(gen, stream, start, progress, saver)

    def _steps(self, gen: torch.Generator, stream, start: int, progress: Callable[[int, float], None] | None,
               saver: Checkpointer | None) -> None:
        """The step loop of :meth:`run`: steps ``start + 1`` to ``train.steps``."""
        tc, clock = self.cfg.train, self.clock
        t0 = time.perf_counter()
        for self.step in range(start + 1, tc.steps + 1):
            step = self.step
            with clock("data"):
                batch = next(stream).to(self.device)
            with clock("step"):
                loss_v, gnorm_v = train_step(self.model, batch, self.opt, self.sched, self.cfg, self.device, self.dtype)
            with clock("log"):
                finite = self.log_step(step, loss_v, gnorm_v, batch.ntokens, progress)
            if step == WARMUP_STEPS:
                self.warm_s, self.warm_tokens = self.train_s + time.perf_counter() - t0, self.tokens
            if not finite:
                self.status = "diverged"
                self.reason = f"non-finite {'loss' if not math.isfinite(loss_v) else 'gradient norm'} at step {step}"
                break
            if tc.eval_every and step % tc.eval_every == 0 and step < tc.steps:
                self.train_s += time.perf_counter() - t0
                solved = self.evaluate(step)
                t0 = time.perf_counter()
                if solved and tc.stop_at_solved:
                    break
            if saver:
                t0 += saver.after_step(step, self.train_s + time.perf_counter() - t0, self, gen)
        self.train_s += time.perf_counter() - t0

    def log_step(self, step: int, loss_v: float, gnorm_v: float, ntokens: int,
                 progress: Callable[[int, float], None] | None) -> bool:
        """The step's loss (a curve row, the mean since the last one, every ``train.log_every`` steps,
        before every evaluation, on the last step and on a non-finite one), token count, early losses
        and progress call; False when the loss or the gradient norm is not finite."""
        tc = self.cfg.train
        self.pending.append((loss_v, gnorm_v))  # the curve row's loss and gradient norm (before clipping)
        self.last_losses.append(loss_v)
        finite = math.isfinite(loss_v) and math.isfinite(gnorm_v)
        evaluates = tc.eval_every and step % tc.eval_every == 0
        if step % tc.log_every == 0 or evaluates or step == tc.steps or not finite:
            n, (losses, norms) = len(self.pending), zip(*self.pending)
            self.curve.append({"step": step, "split": "train", "loss": sum(losses) / n, "grad_norm": sum(norms) / n})
            self.tracking.point(self.curve[-1])
            self.pending = []
        if finite:
            self.tokens += ntokens
            if step <= 10:
                self.first_losses.append(loss_v)
            if progress:
                progress(step, loss_v)
        return finite

    def evaluate(self, step: int, m: dict[str, float] | None = None, gaps: tuple | None = None) -> bool:
        """A periodic evaluation on the dev set (``m``, ``gaps``: its metrics and future-leak gaps
        when a trial group computed them); True when it is the first with exact match >= :data:`SOLVED`."""
        with self.clock("evaluate"):
            m = m or self.task.evaluate(self.model, self.dev, self.cfg, self.device, self.dtype)
            self.check_future(step, gaps=gaps)
        self.curve.append({"step": step, "split": DEV_SPLIT, "loss": m["heldout_ce"],
                           "exact_match": m["exact_match"], **row_values(self.task.metrics, m),
                           "wall_s": self.train_s})
        self.tracking.point(self.curve[-1])
        if self.solved_step is None and m["exact_match"] >= SOLVED:
            self.solved_step, self.solved_s = step, self.train_s
            return True
        return False

    def leak_set(self, step: int, final: bool = False) -> Batch:
        """The :data:`LEAK_ROWS` dev sequences of the future-leak check at ``step``, drawn afresh
        (never scored): the same for every seed at that step (:func:`harness.tasks.splits.leak_set`)."""
        return leak_set(self.task, self.cfg, self.test.src, self.dev, LEAK_ROWS, step, final)

    def check_future(self, step: int, final: bool = False, gaps: tuple | None = None) -> None:
        """:func:`future_leak` (future and state) on :meth:`leak_set`, or its ``gaps`` ``(future,
        state, threshold)`` as a trial group measured them on the same rows
        (:func:`harness.tasks.seeds.future_leak_seeds`); the first failure is kept in ``self.leaks``."""
        if self.leaks:
            return
        future, state, thr = gaps or future_leak(self.model, self.leak_set(step, final), self.cfg.model.pad,
                                                 self.device)
        when = "after training" if final else f"at step {step}"
        if state > thr:  # checked first: a stateful model can fail the future check through its memory
            self.leaks.append(f"{when}: the prefix-only logits of {LEAK_ROWS} dev sequences moved by {state:.3g} "
                              f"(threshold {thr:.2g}) when repeated after the whole targets were shown: the model keeps "
                              "state between forwards (it can memorise the held-out answers)")
        elif future > thr:
            self.leaks.append(f"{when}: on {LEAK_ROWS} dev sequences the logits with the whole target in the "
                              f"decoder input differ from the prefix-only logits by {future:.3g} (threshold {thr:.2g}): "
                              "an output depends on a later target token (it sees the future)")

    def metrics(self, final: dict[str, float], invalid: list[str], dev: dict[str, float]) -> dict[str, Any]:
        """The metrics of the trial after the final test evaluation ``final`` (the row's metric columns)
        and dev evaluation ``dev`` (the curve's last row, "solved" after training, the ``dev_`` columns);
        status ``diverged`` for non-finite dev or test metrics, :data:`INVALID` with the probes'
        ``invalid`` reasons (the divergence's reason appended)."""
        status, reason, step, train_s = self.status, self.reason, self.step, self.train_s
        if status == "ok" and not all(math.isfinite(v) for v in [*final.values(), *dev.values()]):
            status, reason = "diverged", "non-finite held-out metrics"
        if invalid:
            status, reason = INVALID, "; ".join(list(dict.fromkeys(invalid)) + ([reason] if reason else []))
        self.curve.append({"step": step, "split": DEV_SPLIT, "loss": dev["heldout_ce"],
                           "exact_match": dev["exact_match"], **row_values(self.task.metrics, dev), "wall_s": train_s})
        self.tracking.point(self.curve[-1])
        if self.solved_step is None and dev["exact_match"] >= SOLVED:
            self.solved_step, self.solved_s = step, train_s
        timed_steps, timed_s, timed_tokens = step, train_s, self.tokens
        if step > WARMUP_STEPS and train_s > self.warm_s:
            timed_steps, timed_s, timed_tokens = step - WARMUP_STEPS, train_s - self.warm_s, self.tokens - self.warm_tokens
        held = [(r["step"], r["loss"]) for r in self.curve if r["split"] in EVAL_SPLITS]
        nan = float("nan")
        return {
            "steps": step,
            "early_loss": sum(self.first_losses) / len(self.first_losses) if self.first_losses else nan,
            "final_train_loss": sum(self.last_losses) / max(1, len(self.last_losses)),
            **final,
            **dev_values(self.task.metrics, dev),
            "steps_to_solve": self.solved_step if self.solved_step is not None else nan,
            "time_to_solve_s": self.solved_s if self.solved_s is not None else nan,
            "heldout_auc": stats.curve_mean([h[0] for h in held], [h[1] for h in held]),
            "train_s": train_s,
            "step_ms": 1000 * timed_s / timed_steps if timed_steps else nan,
            "tokens_per_s": timed_tokens / timed_s if timed_s > 0 else nan,
            "exact_match_method": DECODING_METHOD if self.task.free_decoding else EM_PREFIX,
            **({"decoding": decoding_name(self.cfg.train.beam)} if self.task.free_decoding else {}),
            "status": status,
            "reason": reason,
        }


def draw_splits(task: Task, cfg: RunConfig) -> tuple[Batch, Batch]:
    """``(test set, dev set)`` of a trial (:mod:`harness.tasks.splits`): the dev set avoids the test
    set's sources, and only the final evaluation scores the test set."""
    test = test_set(task, cfg)
    return test, dev_set(task, cfg, test.src)


def run_trial(spec: TrialSpec, progress: Callable[[int, float], None] | None = None,
              clock: PhaseClock | None = None) -> TrialResult:
    """Run one trial; never raises for a failing trial.

    Args:
        spec: the :class:`harness.trial.TrialSpec` (a process pool or Ray worker rebuilds it from
            its dict: :mod:`harness.executors`), so the same function serves in-process,
            process-pool and Ray execution. ``threads`` pins
            ``torch.set_num_threads`` (results are bitwise reproducible for the same seed,
            config, device and threads); it is recorded in the row.
        progress: optional ``progress(step, loss)`` callback.
        clock: the :class:`PhaseClock` to time the phases with (default: a new one).

    Returns:
        :class:`harness.trial.TrialResult`: ``row`` (metrics), ``curve``, ``phases``
        (``PhaseClock.to_dict()``); a trial that raises gets status ``failed`` and the
        exception as its reason (:func:`harness.errors.failure_reason`; an out-of-memory error
        included). ``row["overhead_share"]`` = 1 - step seconds / ``wall_s``: the share of the
        trial's wall time spent outside the model's own steps (issue 6 target <= 5%).
    """
    trial_settings()  # process-wide, once: the first call imports torch._inductor (~1.3 s), not the trial's time
    clock = clock or PhaseClock()
    t_start = time.perf_counter()
    threads = pin_threads(spec.threads)
    deterministic_cuda()
    result = TrialResult(row=spec.identity_row("", threads))
    tracking = trial_tracking(spec) if spec.measure is None else TrialTracking()  # run --tensorboard / --mlflow
    try:
        _run(spec, result, progress, clock, tracking)
    except Exception as exc:  # noqa: BLE001 - a failing trial must not take the run down
        result.row.update({"status": FAILED, "reason": failure_reason(exc)})
        result.row["traceback"] = traceback.format_exc(limit=5)
    row = result.row
    row["wall_s"] = time.perf_counter() - t_start
    if row.get("status") != FAILED and row["wall_s"] > 0 and spec.measure is None:
        row["overhead_share"] = 1.0 - clock.seconds["step"] / row["wall_s"]
    result.phases = clock.to_dict()
    tracking.finish(result)
    return result


def _run(spec: TrialSpec, result: TrialResult, progress, clock: PhaseClock, tracking: TrialTracking) -> None:
    """The body of :func:`run_trial`: build (the gate's ``build`` rows: a second build, the contracts), train
    through the gate, fill ``result``."""
    cfg = RunConfig.from_dict(spec.config)
    row = result.row
    device = trial_device(spec.device)
    row["device"] = device.type
    registry = registry_for(spec.plugins)
    task = registry.task(cfg.train.task).for_config(cfg)
    variant = Variant(spec.variant, dict(spec.slots))
    row.update({f"slot_{k}": v for k, v in variant.resolved().items()})
    if spec.measure is not None:  # a measurement at initialisation instead of training
        model = build_model(registry, variant, cfg.model, seed=spec.seed).to(device)
        row["params"] = unique_parameter_count(model)
        values, result.curve = measure(model, cfg, spec.seed, spec.measure, device, task)
        row.update({**values, "status": "ok", "reason": ""})
        return
    gate = TrialGate(cfg.model, task, cfg.train.seq_len, spec.seed, device, spec.dtype, registry, variant)
    with clock("build"):  # the model, and the gate's build rows (a second build, its slots' contracts, ...)
        model = build_model(registry, variant, cfg.model, seed=spec.seed).to(device)
        gate.built(model)
    row["params"] = unique_parameter_count(model)
    reset_peak_mem(device)
    saver = Checkpointer(spec, cfg, device)
    metrics, result.curve = train(model, cfg, spec.seed, device, spec.dtype, progress, clock, task, tracking, saver,
                                  gate)
    row.update(saver.notes)
    row.update(gate.verdict(metrics, model))
    row["peak_mem_mb"] = peak_mem_mb(device)
    keep_weights(spec, result, model)  # run --save-models: the state_dict travels back with the result

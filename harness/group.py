"""Trial groups: the K seeds of one variant x config trained as one vectorised program.

:func:`run_group` takes the specs of K trials that differ only in their seed
(:func:`group_specs` finds them in a plan) and returns K results, each the
:class:`harness.trial.TrialResult` of its own trial, with the same columns as
:func:`harness.train.run_trial`'s plus ``vectorised`` (the group size K) and ``group_wall_s``.
The training step is :class:`harness.vstep.GroupStep` (stacked parameters, per-seed Adam or AdamW
with the sequential trial's recipe, :func:`harness.recipe.group_step`, gradient norm, clipping and masked
non-finite skip). The periodic and final evaluations and the
periodic future-leak checks run every seed still training in one batched pass over the stacked
parameters (:mod:`harness.tasks.seeds`; seed by seed, logged once, for a task with its own
``evaluate`` or a model whose eval-mode forward does not run under vmap). The rest is the
sequential trial's own code, per seed on its unstacked model: the build, twin and contract checks
(:mod:`harness.checks.gate`), the run gate at initialisation and after training
(:func:`harness.checks.properties.trial_rows.integrity_reasons`), the final future-leak check, the curve rows and
the metrics row (:class:`harness.train.TrainingLoop`).

Per seed, as in its sequential trial: batches from its own generator (``Generator().manual_seed
(seed)``, the same stream), stacked to (K, B, ...) and padded to a common width; a seed whose loss
or gradient norm goes non-finite is frozen (parameters and moments unchanged; the others go on)
and ends ``diverged`` with the sequential reason text; with ``train.stop_at_solved`` a solved seed
stops updating and logging. Where ``model.dropout`` > 0 the seeds' dropout masks come from one RNG
stream (``vmap(randomness="different")``, seeded with the group's first seed): such a seed is a
trial of the same distribution, not its sequential trial (the row's ``vectorised_note`` says so).

Timing (honest, per seed): ``train_s``, ``step_ms``, ``tokens_per_s`` and ``time_to_solve_s`` are
the group's clock (K seeds stepped together: ``step_ms`` is the time of one group step, for all K
seeds); ``wall_s`` is the seed's share of the group's wall time (``group_wall_s`` / K), so that
summing ``wall_s`` over a run still gives its trial time; ``group_wall_s`` is the whole group's.

Fallback: before training, :func:`harness.vectorisable.vectorise_problem` tries one vmapped forward and backward on the
first stacked batch and compares its per-seed losses with each seed's own forward. A module that
does not vectorise (``.item()`` or a data-dependent Python branch in its forward, an op or
``autograd.Function`` without a batching rule, a buffer updated in place, a forward whose losses
disagree with the per-seed ones) makes the group run its trials one after another
(:func:`harness.train.run_trial`), with one log line saying why; the rows then carry
``vectorised`` = 0 and the reason in ``vectorised_note``. A group that raises while training falls
back the same way, so vectorisation never fails a run nor changes a verdict.

Checkpoints: a group checkpoints as one unit every ``train.checkpoint_every`` and at the step boundary
after a Ctrl-C, and continues from its checkpoint on ``--resume`` (:mod:`harness.vcheckpoint`).
"""
from __future__ import annotations

import json
import math
import time
import traceback
from typing import Callable

import torch

from .trialgate import TrialGate
from .config import RunConfig
from .env import deterministic_cuda, peak_mem_mb, pin_threads, reset_peak_mem, trial_device, trial_settings
from .errors import failure_reason
from .model import build_model, unique_parameter_count
from .progress import progress_bar
from .recipe import group_step
from .registry import Variant
from .saved import keep_weights
from .schedule import lr_at
from .tasks.seeds import NotBatched, SeedStack, evaluate_seeds, future_leak_seeds
from .train import WARMUP_STEPS, PhaseClock, TrainingLoop, draw_splits, run_trial
from .track import trial_tracking
from .trial import TrialResult, TrialSpec, lr_point, registry_for
from .vcheckpoint import GroupCheckpointer
from .vectorisable import capture_wanted, first_sentence, vectorise_problem
from .vstep import CapturedStep, bucket_widths, stack_batches

#: ``vectorised_note`` of a vectorised seed trained with dropout > 0.
DROPOUT_NOTE = ("dropout masks drawn per seed from the group's one RNG stream (vmap randomness='different'), "
                "not the sequential trial's stream")
#: ``_Group.eval_why`` of a group of one seed: evaluated and gated on its own model, as its sequential trial.
SOLO = "one seed"
#: Steps whose losses and gradient norms stay on the device before they are read back (one sync):
#: a seed that goes non-finite is frozen by the step's mask at once and marked ``diverged`` at the
#: read, with the step it happened at. Reading every step costs a sync a step (on CUDA the
#: captured step is then bound by the host).
FLUSH_STEPS = 50

Progress = Callable[[int, float], None]

def group_key(spec: TrialSpec) -> str:
    """What a trial shares with the other members of its group: its spec without the seed (and, at a
    learning-rate point, :func:`lr_point`, without the point and ``train.lr``)."""
    d = {k: v for k, v in spec.to_dict().items() if k != "seed"}
    if lr_point(spec):
        d["point"], d["config"] = "lr=*", {**d["config"], "train": {**d["config"]["train"], "lr": None}}
    return json.dumps(d, sort_keys=True, default=str)


def group_specs(planned: list[TrialSpec], max_size: int = 64) -> list[list[TrialSpec]]:
    """``planned`` as groups of trials that differ only in their seed, at most ``max_size`` each, in
    order of first appearance (a measurement is never grouped)."""
    groups: dict[str, list[list]] = {}
    for ts in planned:
        key = group_key(ts) if ts.measure is None else f"measure:{ts.key}"
        chunks = groups.setdefault(key, [[]])
        if len(chunks[-1]) >= max_size:
            chunks.append([])
        chunks[-1].append(ts)
    return [chunk for chunks in groups.values() for chunk in chunks]


def run_groups(planned: list[TrialSpec], on_done: Callable[[TrialSpec, TrialResult], None], bars=None,
               log: Callable[[str], None] | None = None, max_size: int = 64, capture: str = "auto") -> None:
    """The executor of ``--vectorise-seeds on``: ``planned`` as trial groups of up to ``max_size``
    seeds (:func:`group_specs`), one group after another in this process; ``on_done(spec, result)``
    (a :class:`harness.trial.TrialResult`) for each trial as its group ends (the caller stores it).
    ``bars``: a :class:`harness.progress.TrialBars` (per-seed bars); ``capture``: ``run --capture``
    (:func:`harness.vectorisable.capture_wanted`)."""
    for chunk in group_specs(list(planned), max_size):
        enabled = bars is not None and bars.enabled
        progress = [(lambda step, loss, ts=ts: bars.update(ts, step, loss)) if enabled else None for ts in chunk]
        try:
            results = run_group(chunk, progress, log, show_progress=enabled, capture=capture)
        finally:
            for ts in chunk:
                if bars is not None:
                    bars.close(ts.key)
        for ts, result in zip(chunk, results):
            on_done(ts, result)


def pool_group(specs: list[dict], progress: list[Progress | None], capture: str = "auto") -> dict:
    """The process-pool boundary of a trial group (``run --vectorise-seeds on --jobs N``, one group per
    worker at a time): :func:`run_group` on ``TrialSpec.from_dict`` of each spec. Returns
    ``{"results": [TrialResult.to_dict(), ...], "log": [line, ...], "started": time.time() at the call}``
    (its fallback line, if any; when the worker began it, for the run's log)."""
    started, lines = time.time(), []
    results = run_group([TrialSpec.from_dict(d) for d in specs], progress, lines.append, capture=capture)
    return {"results": [r.to_dict() for r in results], "log": lines, "started": started}


def run_group(specs: list[TrialSpec], progress: list[Progress | None] | None = None,
              log: Callable[[str], None] | None = None, show_progress: bool = False,
              capture: str = "auto") -> list[TrialResult]:
    """Run K trials that differ only in their seed as one vectorised group; never raises for a
    failing trial (see the module docstring).

    Args:
        specs: K :class:`harness.trial.TrialSpec` s, equal but for ``seed``.
        progress: per seed an optional ``progress(step, loss)`` callback.
        log: receives one line when the group falls back to sequential trials (or its evaluation to
            one seed after another).
        show_progress: a progress bar over the final evaluation's rows (stderr, only on a terminal).
        capture: ``run --capture``: ``auto``, ``on``, ``off`` (:func:`harness.vectorisable.capture_wanted`).

    Returns:
        K :class:`harness.trial.TrialResult` s, in the order of ``specs``.

    Raises:
        ValueError: the specs differ in more than their seed.
    """
    progress = list(progress or [None] * len(specs))
    if len({group_key(s) for s in specs}) != 1:
        raise ValueError("run_group: the specs of a group must differ only in their seed")
    # one trial gains only by capture
    alone = len(specs) == 1 and not capture_wanted(trial_device(specs[0].device), capture)
    if alone or specs[0].measure is not None:
        return [run_trial(s, progress=p) for s, p in zip(specs, progress)]
    trial_settings()
    pin_threads(specs[0].threads)
    deterministic_cuda()
    t_start = time.perf_counter()
    try:
        group = _Group(specs, progress, log, show_progress, capture)
        why = group.prepare()
        if why is None:
            return group.train_all(t_start)
    except Exception as exc:  # noqa: BLE001 - fall back to the sequential trials, which report their own failure
        why = f"the vectorised group raised {first_sentence(failure_reason(exc), 300)}"
    return sequential_fallback(specs, progress, why, log)


def sequential_fallback(specs: list[TrialSpec], progress: list[Progress | None], why: str,
                        log: Callable[[str], None] | None) -> list[TrialResult]:
    """The group's trials one after another (:func:`harness.train.run_trial`), each row marked
    ``vectorised`` = 0 with ``why`` in ``vectorised_note``; one log line."""
    s = specs[0]
    if log:
        log(f"{s.variant}{' [' + s.point + ']' if s.point else ''}: {len(specs)} seeds run one after another, "
            f"not vectorised: {why}")
    out = []
    for spec, p in zip(specs, progress):
        result = run_trial(spec, progress=p)
        result.row.update({"vectorised": 0, "vectorised_note": why})
        out.append(result)
    return out


class _Group:
    """The state of one :func:`run_group` call: the K models and their per-seed loops."""

    def __init__(self, specs: list[TrialSpec], progress: list[Progress | None], log: Callable[[str], None] | None,
                 show_progress: bool = False, capture: str = "auto"):
        self.specs, self.progress, self.log, self.show_progress = specs, progress, log, show_progress
        self.capture_mode = capture
        self.cfg = RunConfig.from_dict(specs[0].config)
        self.device = trial_device(specs[0].device)
        self.registry = registry_for(specs[0].plugins)
        self.task = self.registry.task(self.cfg.train.task).for_config(self.cfg)
        self.clock = PhaseClock()
        self.results = [TrialResult(row=s.identity_row(self.device.type, torch.get_num_threads())) for s in specs]
        # why the seeds are evaluated one after another (None: batched); a group of one has nothing to batch, and
        # its own model's pass is the cheaper one (bench --eval: batched K=1 at 0.75x on the CPU, docs/benchmarks.md)
        self.eval_why: str | None = SOLO if len(specs) == 1 else None
        self.gate_why: str | None = None  # why the future-leak checks run seed by seed (None: batched)
        # the step loop's state, which a group checkpoint carries (harness.vcheckpoint): the stopped seeds, the
        # steps whose losses are not read back yet, the group's train time (s)
        self.done, self.pending, self.train_s = [False] * len(specs), [], 0.0
        self.saver = GroupCheckpointer(specs, self.cfg, self.device, log)

    def prepare(self) -> str | None:
        """Build every seed's model (with the twin and contract checks), apply the run gate at
        initialisation, draw each seed's first batch and try the group on it
        (:func:`harness.vectorisable.vectorise_problem`). Returns why the group cannot be vectorised, or None."""
        cfg, mc, device, dtype = self.cfg, self.cfg.model, self.device, self.specs[0].dtype
        variant = Variant(self.specs[0].variant, dict(self.specs[0].slots))
        self.task.validate(cfg)
        self.splits = draw_splits(self.task, cfg)  # (test, dev): one pair for the group's seeds
        self.models, self.loops = [], []
        self.gates = [TrialGate(mc, self.task, cfg.train.seq_len, spec.seed, device, dtype, self.registry, variant)
                      for spec in self.specs]
        with self.clock("build"):
            for spec, result, gate in zip(self.specs, self.results, self.gates):
                model = build_model(self.registry, variant, mc, seed=spec.seed).to(device)
                gate.built(model)
                result.row.update({f"slot_{k}": v for k, v in variant.resolved().items()})
                result.row["params"] = unique_parameter_count(model)
                self.models.append(model)
        reset_peak_mem(device)
        for gate, model in zip(self.gates, self.models):
            with self.clock("evaluate"):
                gate.before(model)
            self.loops.append(TrainingLoop(model, cfg, self.task, device, dtype, self.clock, splits=self.splits))
        self.open_streams()
        self.step = group_step(self.models, cfg, device, dtype)
        self.stack = SeedStack(self.models[0], {**self.step.params, **self.step.buffers}, mc.pad)  # live tensors
        torch.manual_seed(self.specs[0].seed)  # the group's one RNG stream (dropout)
        self.captured = None
        why = vectorise_problem(self.step, self.models, self._stacked(self.last)[0], cfg, device, dtype)
        for loop, spec in zip(self.loops, self.specs) if why is None else ():  # live tracking, one record per seed
            loop.tracking = trial_tracking(spec)
        if why is None and capture_wanted(device, self.capture_mode):
            self.captured = CapturedStep(self.step)
        return why

    def open_streams(self) -> None:
        """Each seed's data generator (``Generator().manual_seed(seed)``), its batch stream from the start (the
        task's index fast path where it has one) and its first draw (``last``; ``drawn``: draws per seed)."""
        self.gens = [torch.Generator().manual_seed(spec.seed) for spec in self.specs]
        indexed = [self.task.index_stream(self.cfg, gen) for gen in self.gens]  # the index fast path, or Nones
        self.indexed = indexed[0] is not None
        self.streams = [ix if ix is not None else self.task.batches(self.cfg, gen)
                        for ix, gen in zip(indexed, self.gens)]
        self.last = [next(s) for s in self.streams]
        self.drawn = [1] * len(self.specs)

    def draw(self, i: int):
        """Seed ``i``'s next batch (or index draw)."""
        self.drawn[i] += 1
        return next(self.streams[i])

    def _stacked(self, batches: list) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], list[int]]:
        """The seeds' batches stacked on the device, and each seed's label tokens: padded to the
        widest, or with a captured step to the smallest of a few static shapes
        (:func:`harness.vstep.bucket_widths`); pinned and copied without blocking the host on CUDA.
        ``batches`` are :class:`Batch` es, or index draws where the task has the fast path
        (:meth:`harness.tasks.base.Task.index_stream`: one gather for all seeds, the same tensors)."""
        full = self.task.widths(self.cfg.train.seq_len)

        def fit(s: int, t: int) -> tuple[int, int] | None:
            if getattr(self, "captured", None) is None or s > full[0] or t > full[1]:
                return None
            return bucket_widths(s, t, full)
        if self.indexed:
            stacked, ntokens = self.task.stack_indices(self.cfg, batches, fit)
        else:
            s, t = max(b.src.size(1) for b in batches), max(b.tgt.size(1) for b in batches)
            stacked, ntokens = stack_batches(batches, fit(s, t), pad=self.cfg.model.pad), [b.ntokens for b in batches]
        if self.device.type == "cuda":
            return tuple(x.pin_memory().to(self.device, non_blocking=True) for x in stacked), ntokens
        return tuple(x.to(self.device) for x in stacked), ntokens

    def _step(self, stacked: tuple, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One group step, through the captured graphs where there are any; a capture that fails is
        given up with one log line (the step then runs uncaptured)."""
        if self.captured is not None:
            try:
                return self.captured(*stacked)
            except Exception as exc:  # noqa: BLE001 - capture is an optimisation, never a failure
                if self.log:
                    self.log(f"{self.specs[0].variant}: captured step given up at step {step}, the group steps "
                             f"uncaptured: {first_sentence(failure_reason(exc))}")
                self.captured = None
        return self.step.step(*stacked)

    def train_all(self, t_start: float) -> list[TrialResult]:
        """Train the group, score every seed, return the K results."""
        self._run()
        finals = self._final_evaluations()
        out = []
        for i, (spec, result) in enumerate(zip(self.specs, self.results)):
            self._finish(i, spec, result, *finals[i])
        wall = time.perf_counter() - t_start
        for result in self.results:
            row = result.row
            row.update({k: v for k, v in self.saver.notes.items() if k == "resumed_from_step"})
            row.update({"wall_s": wall / len(self.specs), "group_wall_s": wall, "vectorised": len(self.specs),
                        "captured": len(self.captured.graphs) if self.captured is not None else 0})
            if self.cfg.model.dropout > 0:
                row["vectorised_note"] = DROPOUT_NOTE
            row["overhead_share"] = 1.0 - self.clock.seconds["step"] / wall if wall > 0 else math.nan
            result.phases = self.clock.to_dict()
        for loop, result in zip(self.loops, self.results):  # each seed's own live record ends
            loop.tracking.finish(result)
            out.append(result)
        return out

    def _final_evaluations(self) -> list[tuple[dict[str, float] | None, dict[str, float] | None]]:
        """Every seed's final (test, dev) evaluations, each in one batched pass (:meth:`_evaluate_seeds`),
        the test one with a progress bar over the rows; Nones where a seed is evaluated by :meth:`_finish`."""
        seeds = list(range(len(self.specs)))
        with self.clock("final_eval"):
            dev = self._evaluate_seeds(seeds, self.splits[1])
            return list(zip(self._evaluate_seeds(seeds, self.splits[0], bar=self.show_progress), dev))

    def _leak_gaps(self, seeds: list[int], step: int) -> list[tuple | None]:
        """The seeds' future-leak gaps at ``step`` in one pass (:func:`harness.tasks.seeds.future_leak_seeds`);
        Nones (each seed checks its own model) where scores are not batched or it raised (logged once)."""
        if self.eval_why is not None or self.gate_why is not None:
            return [None] * len(seeds)
        stack = self.stack if len(seeds) == len(self.specs) else self.stack.select(seeds)
        try:
            return future_leak_seeds(stack, self.loops[seeds[0]].leak_set(step), self.device)
        except Exception as exc:  # noqa: BLE001 - batching is an optimisation: check seed by seed
            self.gate_why = f"the batched future-leak check raised {first_sentence(failure_reason(exc))}"
            if self.log:
                self.log(f"{self.specs[0].variant}: the group's future-leak checks run seed by seed: {self.gate_why}")
            return [None] * len(seeds)

    def _evaluate_seeds(self, seeds: list[int], data, bar: bool = False) -> list[dict[str, float] | None]:
        """The held-out metrics of the seeds ``seeds`` on ``data`` in one pass over their stacked
        parameters (:func:`harness.tasks.seeds.evaluate_seeds`), in their order; Nones where the
        group evaluates its seeds one after another: the task has its own scoring or the batched
        pass raised (the first time gives it up for the group, with one log line)."""
        if self.eval_why is None:
            stack = self.stack if len(seeds) == len(self.specs) else self.stack.select(seeds)
            rows = data.src.size(0)
            try:
                with progress_bar(rows, f"evaluate {len(seeds)} seeds", quiet=not bar, leave=False,
                                  position=len(self.specs) + 1) as pbar:
                    return evaluate_seeds(self.task, stack, data, self.cfg, self.device, self.specs[0].dtype,
                                          progress=pbar.update)
            except NotBatched as exc:
                self.eval_why = str(exc)
            except Exception as exc:  # noqa: BLE001 - batching is an optimisation: evaluate seed by seed
                self.eval_why = f"the batched evaluation raised {first_sentence(failure_reason(exc))}"
            if self.log:
                self.log(f"{self.specs[0].variant}: the group's seeds are evaluated one after another, "
                         f"not batched: {self.eval_why}")
        return [None] * len(seeds)

    def _finish(self, i: int, spec: TrialSpec, result: TrialResult, final: dict[str, float] | None = None,
                dev: dict[str, float] | None = None) -> None:
        """Seed ``i``'s final test and dev evaluations (``final``, ``dev``: its metrics from the group's batched
        passes, else evaluated here on its own model), run gate after training and metrics row (as
        :func:`harness.train.train` and ``_run`` do them)."""
        cfg, loop, gate = self.cfg, self.loops[i], self.gates[i]
        model = self.step.load(i, self.models[i])
        try:
            with self.clock("final_eval"):
                dev = dev or self.task.evaluate(model, self.splits[1], cfg, self.device, spec.dtype)
                final = final or self.task.evaluate(model, self.splits[0], cfg, self.device, spec.dtype)
                invalid = gate.after(model, loop)
            metrics = loop.metrics(final, invalid, dev)
        except Exception as exc:  # noqa: BLE001 - as run_trial: a failing trial, not a failing run
            result.row.update({"status": "failed", "reason": failure_reason(exc),
                               "traceback": traceback.format_exc(limit=5)})
            return
        result.row.update(gate.verdict(metrics, model, forward=self.step.seed_forward(i)))
        result.row["peak_mem_mb"] = peak_mem_mb(self.device)
        result.curve = loop.curve
        keep_weights(spec, result, model)  # run --save-models: this seed's own (unstacked) weights

    def _run(self) -> None:
        """The step loop (from the group's checkpoint where there is one: :mod:`harness.vcheckpoint`): every
        seed's batch, one group step, the per-seed logs of the pending steps read back every
        :data:`FLUSH_STEPS` steps, at each evaluation and at the end (one sync each; the curve's rows are the
        same as with a read every step), the periodic evaluations, a checkpoint when due; stops when every
        seed has stopped."""
        tc, clock, k = self.cfg.train, self.clock, len(self.specs)
        rates = [lr_at(RunConfig.from_dict(s.config).train, self.cfg.model.d_model) for s in self.specs]
        same = len({json.dumps(s.config["train"].get("lr")) for s in self.specs}) == 1  # one rate for every member
        start, done = self.saver.resume(self), self.done
        t0 = time.perf_counter()
        with self.saver.interrupts():
            for step in range(start + 1, tc.steps + 1):
                with clock("data"):
                    batches = self.last if step == 1 else [self.last[i] if done[i] else self.draw(i) for i in range(k)]
                    self.last = batches
                    stacked, ntokens = self._stacked(batches)
                with clock("step"):
                    self.step.set_lr(rates[0](step) if same else [lr(step) for lr in rates])  # as LambdaLR
                    loss, gnorm = self._step(stacked, step)
                self.pending.append((step, loss, gnorm, ntokens))
                evaluates = bool(tc.eval_every and step % tc.eval_every == 0 and step < tc.steps)
                if len(self.pending) >= FLUSH_STEPS or evaluates or step == tc.steps or step == WARMUP_STEPS:
                    with clock("log"):
                        self._flush(self.pending, done, self.train_s + time.perf_counter() - t0)
                    self.pending = []
                if evaluates and not all(done):
                    self.train_s += time.perf_counter() - t0
                    self._evaluate(step, done, self.train_s)
                    t0 = time.perf_counter()
                if all(done):
                    break
                t0 += self.saver.after_step(step, self.train_s + time.perf_counter() - t0, self)
        self.train_s += time.perf_counter() - t0
        for i, loop in enumerate(self.loops):
            if not done[i]:
                loop.train_s = self.train_s

    def _flush(self, pending: list, done: list[bool], train_s: float) -> None:
        """Read the pending steps' losses and gradient norms (one sync) and log them per seed as the
        sequential loop does (:meth:`harness.train.TrainingLoop.log_step`); a non-finite step makes its seed
        ``diverged`` with the sequential reason and stops it."""
        values = torch.stack([torch.stack([loss, gnorm]) for _, loss, gnorm, _ in pending]).tolist()  # (n, 2, K)
        for (step, _, _, ntokens), (losses, gnorms) in zip(pending, values):
            for i, loop in enumerate(self.loops):
                if done[i]:
                    continue
                loop.step = step
                finite = loop.log_step(step, losses[i], gnorms[i], ntokens[i], self.progress[i])
                if step == WARMUP_STEPS:
                    loop.warm_s, loop.warm_tokens = train_s, loop.tokens
                if not finite:
                    loop.status = "diverged"
                    what = "loss" if not math.isfinite(losses[i]) else "gradient norm"
                    loop.reason = f"non-finite {what} at step {step}"
                    loop.train_s, done[i] = train_s, True

    def _evaluate(self, step: int, done: list[bool], train_s: float) -> None:
        """The periodic evaluation of every seed still training: the scores in one batched pass
        (:meth:`_evaluate_seeds`), the future-leak check on each seed's unstacked model; with
        ``train.stop_at_solved`` a solved seed stops."""
        live = [i for i in range(len(self.specs)) if not done[i]]
        with self.clock("evaluate"):  # one block: each seed's own (nested) block is not counted again
            scores = self._evaluate_seeds(live, self.loops[0].dev)  # the dev set is the same for every seed
            gaps = self._leak_gaps(live, step)
            for i, m, g in zip(live, scores, gaps):
                loop = self.loops[i]
                self.step.load(i, self.models[i])
                loop.train_s = train_s
                if loop.evaluate(step, m, g) and self.cfg.train.stop_at_solved:
                    done[i] = True
                    self.step.stop(i)

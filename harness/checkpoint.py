"""Mid-trial checkpoints: a running trial's whole state, written now and then, so that a trial
interrupted (Ctrl-C, SIGTERM, a killed worker) continues where it was on ``--resume``.

Where: ``<run>/checkpoints/<trial key>.pt`` (:func:`checkpoint_path`; the run sets
``TrialSpec.checkpoint_dir`` when it executes its trials, in this process or in its worker
processes). When: every ``train.checkpoint_every`` (:func:`interval`:
seconds of wall time, ``"60s"`` by default, or a number of steps), at the end of a step (after its
logging and its periodic evaluation, if any); and, where the trial runs in the run's own process,
at the step boundary after a Ctrl-C (:meth:`Checkpointer.interrupts`). How: ``torch.save`` to a
temporary file in the same folder, then ``os.replace``, so a checkpoint is whole or absent.

What one holds (:meth:`Checkpointer.state`, written by :meth:`Checkpointer.write`): the model's
``state_dict``, Adam's and the schedule's, the torch CPU RNG state (dropout; CUDA's too on a GPU),
the data generator's state and the number of batches drawn (the data position), the loop's curve
rows and counters (:class:`harness.train.TrainingLoop`: losses since the last curve row, tokens, the
solved step, the phase clock, train time), and the trial's identity (:func:`identity`: its spec
without the checkpoint folder and ``save_model``, and the torch version). A checkpoint whose
identity differs from the trial's, or that cannot be read, is not used: the trial starts from step 0
and its row says why (``checkpoint_note``).

Resuming (:meth:`Checkpointer.resume`) rebuilds the trial as it began (the model from its seed,
the pre-training checks), draws the checkpoint's number of batches from a fresh generator of the
trial's seed and checks that the generator then holds the saved state (else the task's stream is
not reproducible and the trial starts from step 0), then loads the states above. On the CPU the
finished trial equals the uninterrupted one bit for bit, times aside (``tests/test_checkpoints.py``).
The row of a resumed trial says ``resumed_from_step``. The run removes a trial's checkpoint once
the trial is stored (``run --keep-checkpoints`` keeps it: :func:`remove_checkpoint`).

A vectorised trial group (``--vectorise-seeds on``) checkpoints as one unit, through the same file
handling, under ``<run>/checkpoints/<group_stem>.pt`` (:mod:`harness.vcheckpoint`); a trial trained
on its own does not continue from its group's checkpoint (its row's ``checkpoint_note`` says so).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch

from .config import CHECKPOINT_EVERY, RunConfig
from .trial import TrialSpec, lr_point

#: The folder of a run that holds its trials' checkpoints.
CHECKPOINTS = "checkpoints"
#: The layout of a checkpoint file; another value is not read.
FORMAT = 1
#: The scalar and list attributes of :class:`harness.train.TrainingLoop` a checkpoint carries.
LOOP_FIELDS = ("curve", "status", "reason", "tokens", "train_s", "solved_step", "solved_s", "first_losses",
               "pending", "warm_s", "warm_tokens", "leaks")


def checkpoint_path(folder: str | os.PathLike, key: str) -> Path:
    """``<folder>/<key>.pt``: the checkpoint of trial ``key`` (``folder``: ``<run>/checkpoints``)."""
    return Path(folder) / f"{key}.pt"


def group_stem(spec: TrialSpec) -> str:
    """``<variant>[__<sweep point>]__group``: the key of the checkpoint of a vectorised group of ``spec``'s
    seeds (its file: ``checkpoint_path(folder, group_stem(spec))``); never a trial's key (those end ``__s<seed>``)."""
    point = "lr-grid" if lr_point(spec) else spec.point  # a learning-rate sweep's points share one group
    raw = f"{spec.variant}__{point}__group" if point else f"{spec.variant}__group"
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", raw)


def with_checkpoints(specs: list[TrialSpec], root: str | os.PathLike, executor: str) -> list[TrialSpec]:
    """Copies of ``specs`` that checkpoint under ``<root>/checkpoints`` (absolute, so worker processes
    write there too); on Ray (``executor`` ``"ray"``, whose nodes may not see the run folder) unchanged."""
    if executor == "ray":
        return list(specs)
    folder = str((Path(root) / CHECKPOINTS).resolve())
    return [dataclasses.replace(ts, checkpoint_dir=folder) for ts in specs]


def remove_checkpoint(root: str | os.PathLike, key: str, keep: bool = False) -> None:
    """Remove trial ``key``'s checkpoint from the run folder ``root`` (and the ``checkpoints``
    folder once it is empty), with any temporary file a killed writer left; nothing when there is none
    or ``keep`` (``--keep-checkpoints``)."""
    if keep:
        return
    folder = Path(root) / CHECKPOINTS
    for path in [checkpoint_path(folder, key), *folder.glob(f"{key}.pt.*.tmp")]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    with contextlib.suppress(OSError):  # not empty (another trial's checkpoint, a temporary file), or gone
        folder.rmdir()


def identity(spec: TrialSpec) -> dict[str, Any]:
    """What a checkpoint must have been written for to be used: the spec's dict without
    ``checkpoint_dir`` and ``save_model`` (neither changes the training), and the torch version."""
    d = {k: v for k, v in spec.to_dict().items() if k not in ("checkpoint_dir", "save_model")}
    return {"spec": d, "torch_version": str(torch.__version__)}


def _difference(saved: dict, wanted: dict, what: str = "trial") -> str:
    """The first key whose value differs between two identities, as ``key: checkpoint X, this <what> Y``."""
    flat = lambda d, pre="": {k2: v2 for k, v in d.items()  # noqa: E731
                              for k2, v2 in (flat(v, f"{pre}{k}.").items() if isinstance(v, dict)
                                             else [(f"{pre}{k}", v)])}
    a, b = flat(saved), flat(wanted)
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            return f"{k}: checkpoint {a.get(k)!r}, this {what} {b.get(k)!r}"
    return "identity differs"


def interval(value: Any) -> tuple[int, float]:
    """``train.checkpoint_every`` (validated by :class:`harness.config.TrainConfig`) as ``(steps,
    seconds)``, 0 where unused: ``"60s"`` -> (0, 60.0), ``500`` or ``"500"`` -> (500, 0.0), ``0`` or
    ``"off"`` -> (0, 0.0) (no checkpoints)."""
    match = CHECKPOINT_EVERY.fullmatch(str(value).strip().lower())
    return (int(match[1]), 0.0) if match[1] else (0, float(match[2] or 0.0))


class Checkpointer:
    """The checkpoints of one sequential trial (:func:`harness.train.train` drives it); the file
    handling (when one is due, the atomic write, the Ctrl-C held to the step boundary, reading and
    the identity check) that a trial group's :class:`harness.vcheckpoint.GroupCheckpointer` shares.

    Args:
        spec: the trial; its ``checkpoint_dir`` says where (``""``: the trial never checkpoints).
        cfg: its config (``train.checkpoint_every``).
        device: where it trains (a CUDA trial's checkpoint carries the CUDA RNG state too).
        path: the checkpoint file (default: ``checkpoint_path(spec.checkpoint_dir, spec.key)``).
    """

    #: What a checkpoint belongs to, in the notes (``written for another trial``).
    what = "trial"

    def __init__(self, spec: TrialSpec, cfg: RunConfig, device: torch.device, path: Path | None = None):
        self.spec, self.device = spec, device
        self.every_steps, self.every_s = interval(cfg.train.checkpoint_every)
        if path is None and spec.checkpoint_dir:
            path = checkpoint_path(spec.checkpoint_dir, spec.key)
        self.path = path
        self.enabled = self.path is not None and (self.every_steps > 0 or self.every_s > 0)
        self.last_write = time.monotonic()
        self.interrupted = False  # a Ctrl-C waiting for the step boundary (:meth:`interrupts`)
        self.notes: dict[str, Any] = {}  # columns for the trial's row: resumed_from_step, checkpoint_note

    def identity(self) -> dict[str, Any]:
        """What the checkpoint must have been written for (:func:`identity`)."""
        return identity(self.spec)

    def note(self, text: str, fresh: bool = True) -> None:
        """Record why a checkpoint is not used (``fresh``: the trial starts from step 0) or not written."""
        self.notes["checkpoint_note"] = text

    # ------------------------------------------------------------------------------ writing

    def due(self, step: int) -> bool:
        """Whether the loop should write a checkpoint after ``step``."""
        if not self.enabled:
            return False
        if self.interrupted:
            return True
        if self.every_steps:
            return step % self.every_steps == 0
        return time.monotonic() - self.last_write >= self.every_s

    def after_step(self, step: int, train_s: float, *parts) -> float:
        """At the end of ``step``: write a checkpoint of ``parts`` (a trial: its loop and data
        generator; :meth:`state`) when one is due (``train_s``: the train time so far, seconds);
        then, after a deferred Ctrl-C, raise ``KeyboardInterrupt``. Returns the seconds spent
        writing (left out of the train time)."""
        t0 = time.perf_counter()
        if self.due(step):
            with parts[0].clock("store"):
                self.write(self.state(step, train_s, *parts), step)
        if self.interrupted:
            raise KeyboardInterrupt
        return time.perf_counter() - t0

    def state(self, step: int, train_s: float, loop, gen: torch.Generator) -> dict[str, Any]:
        """A sequential trial's state after ``step``: model, Adam, schedule, RNGs, data position, loop."""
        state = {"data_rng": gen.get_state(), "torch_rng": torch.get_rng_state(), "model": loop.model.state_dict(),
                 "optimizer": loop.opt.state_dict(), "scheduler": loop.sched.state_dict(),
                 "loop": {k: getattr(loop, k) for k in LOOP_FIELDS} | {
                     "train_s": train_s, "last_losses": list(loop.last_losses),
                     "clock": {"seconds": dict(loop.clock.seconds), "calls": dict(loop.clock.calls)}}}
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def write(self, state: dict[str, Any], step: int) -> None:
        """Write ``state`` (with the format, the identity and ``step``) atomically; a write that fails (a full
        disk, no permission) turns the checkpoints off and leaves a ``checkpoint_note``, training goes on."""
        state = {"format": FORMAT, "identity": self.identity(), "step": step, **state}
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                torch.save(state, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self.enabled = False
            self.note(f"checkpoints off after step {step}: cannot write {self.path}: {exc}", fresh=False)
        self.last_write = time.monotonic()

    @contextlib.contextmanager
    def interrupts(self):
        """While the step loop runs in the main thread of a process whose Ctrl-C raises
        ``KeyboardInterrupt`` (the run's own process; pool workers ignore it), the first Ctrl-C is
        held until the step ends: a checkpoint of that step is written, then ``KeyboardInterrupt``
        is raised. A second Ctrl-C raises at once (the last checkpoint written is then the one used)."""
        held = (self.enabled and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        if not held:
            yield
            return

        def hold(signum, frame):
            self.interrupted = True
            signal.signal(signal.SIGINT, signal.default_int_handler)

        signal.signal(signal.SIGINT, hold)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.interrupted:  # the loop ended before the next step boundary: stop before the final evaluation
            raise KeyboardInterrupt

    # ------------------------------------------------------------------------------ reading

    def absent(self) -> None:
        """No checkpoint of this trial: note a checkpoint of its vectorised group, which it does not use."""
        group = checkpoint_path(self.path.parent, group_stem(self.spec))
        if group.is_file():
            self.note(f"the group checkpoint {group.name} is not used: a trial trained on its own continues only "
                      f"from its own checkpoint (--vectorise-seeds on continues the group)")

    def load(self) -> dict[str, Any] | None:
        """The checkpoint, or None: none there, unreadable, or written for another trial
        (then ``checkpoint_note`` says why and the trial starts from step 0)."""
        if self.path is None:
            return None
        if not self.path.is_file():
            self.absent()
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: start afresh, say why
            self.note(f"checkpoint {self.path.name} not used: unreadable ({exc})"[:300])
            return None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            self.note(f"checkpoint {self.path.name} not used: not a format-{FORMAT} checkpoint")
            return None
        if state.get("identity") != self.identity():
            why = _difference(state.get("identity") or {}, self.identity(), self.what)
            self.note(f"checkpoint {self.path.name} not used: written for another {self.what} ({why})")
            return None
        return state

    def resume(self, loop, gen: torch.Generator):
        """``(stream, step)``: the trial's batch stream from ``gen`` and the step it continues after,
        with ``loop`` (model, optimiser, schedule, counters) and the RNGs restored from the
        checkpoint; ``(fresh stream, 0)`` when there is none to use."""
        state = self.load()
        start_data, start_rng = gen.get_state(), torch.get_rng_state()
        stream = loop.task.batches(loop.cfg, gen)
        if state is None:
            return stream, 0
        step = int(state["step"])
        for _ in range(step):  # the data position: the same draws from the same generator
            next(stream)
        if not torch.equal(gen.get_state(), state["data_rng"]):
            gen.set_state(start_data)
            torch.set_rng_state(start_rng)
            self.note(f"checkpoint {self.path.name} not used: the task's batches after step {step} differ from the "
                      f"checkpoint's (the stream is not reproducible)")
            return loop.task.batches(loop.cfg, gen), 0
        loop.model.load_state_dict(state["model"])
        loop.opt.load_state_dict(state["optimizer"])
        loop.sched.load_state_dict(state["scheduler"])
        self.restore_rng(state)
        restore_loop(loop, state["loop"], state["loop"]["clock"])
        loop.step = step
        self.notes["resumed_from_step"] = step
        return stream, step

    def restore_rng(self, state: dict[str, Any]) -> None:
        """The torch CPU RNG state of ``state`` (dropout), and its CUDA one on a CUDA device."""
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)


def restore_loop(loop, saved: dict[str, Any], clock: dict[str, dict] | None = None) -> None:
    """Set a :class:`harness.train.TrainingLoop`'s :data:`LOOP_FIELDS` and last losses from ``saved``
    (what a checkpoint holds of it), and its phase clock's sums from ``clock`` when given."""
    for k in LOOP_FIELDS:
        setattr(loop, k, saved[k])
    loop.last_losses = collections.deque(saved["last_losses"], maxlen=loop.last_losses.maxlen)
    if clock is not None:
        loop.clock.seconds.update(clock["seconds"])
        loop.clock.calls.update(clock["calls"])

"""Checkpoints of a vectorised trial group (``--vectorise-seeds on``, :mod:`harness.group`): the K seeds
of one variant x config written and continued as one unit, through :class:`harness.checkpoint.Checkpointer`'s
file handling (when one is due, ``train.checkpoint_every``; the atomic write; the Ctrl-C held to the step
boundary; reading and the identity check; removal once stored, :func:`harness.checkpoint.remove_checkpoint`).

Where: ``<run>/checkpoints/<variant>[__<point>]__group.pt`` (:func:`harness.checkpoint.group_stem`), one per
variant and sweep point (a group of more than ``MAX_GROUP`` seeds is run as several groups, one after another
in one process: the later one's checkpoint replaces the earlier's). The run removes it once every seed of
the variant and point that the run executes is stored (:func:`harness.runner.execute`).

What one holds (:meth:`GroupCheckpointer.state`): the group step's stacked state (the flat parameter
buffers of :class:`harness.vstep.FlatRows`, the stacked buffers, :class:`harness.vstep.StackedAdam`'s m, v
and t, the ``active`` mask, the learning rate: :meth:`harness.vstep.GroupStep.state`), each seed's data
position (its generator's state and the number of batches drawn; the pre-drawn batch of a stopped seed is
the last one it drew), the torch CPU RNG state (the group's one dropout stream; CUDA's too on a GPU), the
``done`` flags, the losses of the steps not yet read back (``pending``), the group's train time, phase clock
and evaluation mode, every seed's loop (:data:`harness.checkpoint.LOOP_FIELDS`, its step and last losses),
and the group's identity (:func:`group_identity`: the shared spec, the seeds, the torch version).

Resuming (:meth:`GroupCheckpointer.resume`, after :meth:`harness.group._Group.prepare` built the group as
it began): a checkpoint that cannot be read, was written for another group (other seeds, another config,
another torch), holds tensors of other shapes (other model code) or whose data position the seeds'
generators do not reproduce is not used: the group trains from step 0 and the run's log says why in one
line. Otherwise every tensor is copied into the group's existing tensors in place (a captured CUDA graph
replays on the same memory), the seeds' streams are advanced to their positions and the loops and RNGs
restored; on the CPU the group then ends bitwise equal to an uninterrupted one, times aside
(``tests/test_group_checkpoints.py``). Each seed's row says ``resumed_from_step``.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .checkpoint import LOOP_FIELDS, Checkpointer, checkpoint_path, group_stem, restore_loop
from .config import RunConfig
from .trial import TrialSpec


def group_identity(specs: list[TrialSpec]) -> dict[str, Any]:
    """What a group checkpoint must have been written for: the seeds' shared spec (:func:`harness.checkpoint.identity`
    without the seed), the seeds in order, and the torch version."""
    shared = {k: v for k, v in specs[0].to_dict().items() if k not in ("seed", "checkpoint_dir", "save_model")}
    points = {"points": [s.point for s in specs]} if any(s.point for s in specs) else {}  # a sweep's group
    return {"spec": shared, "seeds": [s.seed for s in specs], **points, "torch_version": str(torch.__version__)}


class GroupCheckpointer(Checkpointer):
    """The checkpoints of one vectorised trial group (:class:`harness.group._Group` drives it: :meth:`resume`
    before its step loop, :meth:`after_step` after each step, :meth:`interrupts` around the loop).

    Args:
        specs: the group's K trials (their ``checkpoint_dir``: where; ``""``: the group never checkpoints).
        cfg, device: their config (``train.checkpoint_every``) and device.
        log: gets one line when a checkpoint is not used or cannot be written (None: not said).
    """

    what = "group"

    def __init__(self, specs: list[TrialSpec], cfg: RunConfig, device: torch.device,
                 log: Callable[[str], None] | None = None):
        first = specs[0]
        path = checkpoint_path(first.checkpoint_dir, group_stem(first)) if first.checkpoint_dir else None
        super().__init__(first, cfg, device, path)
        self.specs, self.log = specs, log
        self.label = f"{first.variant}{' [' + first.point + ']' if first.point else ''}"

    def identity(self) -> dict[str, Any]:
        return group_identity(self.specs)

    def note(self, text: str, fresh: bool = True) -> None:
        """One line in the run's log (the group's seeds' rows do not repeat it)."""
        self.notes["checkpoint_note"] = text
        if self.log:
            self.log(f"{self.label}: {text}{'; the group trains its seeds from step 0' if fresh else ''}")

    def absent(self) -> None:
        """No group checkpoint: note the seeds' own (sequential) checkpoints, which the group does not use."""
        have = [s.seed for s in self.specs if checkpoint_path(self.path.parent, s.key).is_file()]
        if have:
            self.note(f"the checkpoints of seed(s) {', '.join(map(str, have))} are not used: a vectorised group "
                      f"continues only from its group checkpoint (--vectorise-seeds off continues them)")

    def state(self, step: int, train_s: float, group) -> dict[str, Any]:
        """The group's state after ``step`` (``train_s``: the group's train time so far, seconds)."""
        state = {"stacked": group.step.state(), "drawn": list(group.drawn),
                 "data_rng": [g.get_state() for g in group.gens], "torch_rng": torch.get_rng_state(),
                 "group": {"done": list(group.done), "train_s": train_s, "eval_why": group.eval_why,
                           "gate_why": group.gate_why,
                           "pending": [(s, loss.cpu(), gnorm.cpu(), list(n)) for s, loss, gnorm, n in group.pending],
                           "clock": {"seconds": dict(group.clock.seconds), "calls": dict(group.clock.calls)}},
                 "loops": [{k: getattr(loop, k) for k in LOOP_FIELDS}
                           | {"step": loop.step, "last_losses": list(loop.last_losses)} for loop in group.loops]}
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def resume(self, group) -> int:
        """The step ``group`` continues after: 0 when there is no checkpoint to use (see the module
        docstring), else the checkpoint's, with the group's tensors, data streams, loops and RNGs restored."""
        state = self.load()
        if state is None:
            return 0
        step, k = int(state["step"]), len(self.specs)
        why = group.step.layout_problem(state.get("stacked") or {})
        if why is None and not (len(state.get("drawn", ())) == len(state.get("loops", ())) == k):
            why = "it holds another number of seeds"
        if why is not None:
            self.note(f"checkpoint {self.path.name} not used: {why}")
            return 0
        for i in range(k):  # the data position: each seed's draws from its own generator
            for _ in range(int(state["drawn"][i]) - 1):
                group.last[i] = group.draw(i)
        if not all(torch.equal(g.get_state(), s) for g, s in zip(group.gens, state["data_rng"])):
            group.open_streams()
            self.note(f"checkpoint {self.path.name} not used: the task's batches after step {step} differ from "
                      f"the checkpoint's (the stream is not reproducible)")
            return 0
        group.step.load_state_(state["stacked"])
        self.restore_rng(state)
        saved = state["group"]
        group.done, group.train_s = list(saved["done"]), float(saved["train_s"])
        group.eval_why, group.gate_why = saved["eval_why"], saved["gate_why"]
        group.pending = [(s, loss.to(self.device), gnorm.to(self.device), n) for s, loss, gnorm, n in saved["pending"]]
        group.clock.seconds.update(saved["clock"]["seconds"])
        group.clock.calls.update(saved["clock"]["calls"])
        for loop, kept in zip(group.loops, state["loops"]):
            restore_loop(loop, kept)
            loop.step = int(kept["step"])
            for row in loop.curve:  # the live record gets the rows before the checkpoint
                loop.tracking.point(row)
        self.notes["resumed_from_step"] = step
        return step

"""How much of a trial's wall time is the harness's own work.

A trial runs exactly as ``harness run`` runs it (:func:`harness.train.run_trial`, then its JSON is
written by :class:`harness.store.RunStore`). The training loop times its phases with a
:class:`harness.train.PhaseClock` (``time.perf_counter`` around each block, which also carries a
``torch.profiler`` ``record_function`` range named in :data:`harness.train.PHASES`). ``step``
(forward, loss, backward, gradient norm, Adam, schedule) is the model's work; every other phase --
model assembly, batch generation, curve rows and progress callback, the causality test and the
periodic and final held-out evaluations, storing -- and whatever no phase covers (seeding,
settings, peak-memory reads) is the harness's overhead. Issue 6 asks for overhead <= 5% of a
trial's wall time (:data:`OVERHEAD_TARGET`).

With ``count_ops=True`` every aten op the trial dispatches is counted per phase (:class:`OpCounter`):
the ops that do work (no views, allocations or composites' own entries), about one kernel launch
each on a GPU. A device-independent proxy of
what an uncaptured trial launches, measurable on a CPU (the counter slows the trial, so its
seconds read higher).

With ``torch_profiler=True`` the trial also runs inside ``torch.profiler.profile`` and the
profiler's own range totals are reported next to the clock's, as an independent measurement.
The profiler records every op too (about a microsecond or two each, mostly inside ``step``, and
a few GB of events for a 400-step ``paper`` trial), so use it on short trials; the clock alone
costs a few microseconds per phase block.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

from ..trial import TrialResult, TrialSpec

OVERHEAD_TARGET = 0.05  #: issue 6: the harness's own share of a trial's wall time, at most

#: Phases in report order, with what each covers.
PHASE_NOTES = {
    "build": "assemble the variant, canonical init, move to device",
    "data": "generate the training batch, move to device",
    "step": "forward + float32 loss, backward, grad norm, Adam, schedule (the model's work)",
    "log": "curve row, finiteness check, progress callback",
    "evaluate": "decoder causality test, periodic held-out probes",
    "final_eval": "final held-out evaluation",
    "store": "write the trial's JSON (atomic rename)",
}


#: aten ops that launch no kernel on a GPU (metadata, allocation, profiler marks), left out of the count.
NO_KERNEL = frozenset({"_unsafe_view", "_reshape_alias", "empty", "empty_strided", "empty_like", "new_empty",
                       "new_empty_strided", "resize_", "set_", "lift_fresh", "_record_function_enter_new",
                       "_record_function_exit"})


@functools.lru_cache(maxsize=None)
def is_composite(func) -> bool:
    """Whether the aten op ``func`` (an ``OpOverload``) is a composite (``CompositeImplicitAutograd``:
    ``linear``, ``dropout``, ``layer_norm``, ``item``...). With gradients on, these decompose before
    a dispatch mode sees them; under ``torch.inference_mode`` the mode sees the composite itself, and
    :class:`OpCounter` runs its decomposition under the mode so that its parts are what is counted."""
    import torch

    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


def launches_work(func) -> bool:
    """Whether the aten op ``func`` counts as work: not a view, not in :data:`NO_KERNEL`, not a
    composite (:func:`is_composite`: its parts count)."""
    return not (func.is_view or func.overloadpacket.__name__ in NO_KERNEL or is_composite(func))


class OpCounter:
    """Counts the aten ops dispatched while it is active, per phase of ``clock`` (a
    :class:`harness.train.PhaseClock`; ``(no phase)`` outside its blocks or without a clock). ``ops``
    counts the ops that do work (:func:`launches_work`): on a GPU each launches about one kernel
    (a fused or foreach op one or a few), where a view, an allocation or a composite's own entry
    launches none. Used as ``with OpCounter(clock) as counter: ...``; the counts are in
    ``counter.ops`` ({phase: int}).

    Built on ``torch.utils._python_dispatch.TorchDispatchMode`` (a Python call per op: a trial
    runs a few times slower under it). Ops inside a captured CUDA graph's replay are not seen.
    """

    def __init__(self, clock=None) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if is_composite(func):  # count its parts: run its decomposition with this mode on
                    with self:
                        return func.decompose(*args, **kwargs)
                if launches_work(func):  # (not a composite here: is_composite is cached)
                    phase = (clock.current if clock is not None else None) or NO_PHASE
                    counter.ops[phase] = counter.ops.get(phase, 0) + 1
                return func(*args, **kwargs)

        self.ops: dict[str, int] = {}
        self._mode = _Mode()

    def __enter__(self) -> "OpCounter":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)


NO_PHASE = "(no phase)"  #: OpCounter's key for ops dispatched outside every phase block


def count_ops(fn: Callable[[], Any]) -> int:
    """The aten ops ``fn()`` dispatches that do work (:class:`OpCounter`): about the kernels it
    launches on a GPU, counted on any device."""
    with OpCounter() as counter:
        fn()
    return sum(counter.ops.values())


def profile_trial(spec: TrialSpec, write: Callable[[TrialResult], Any],
                  torch_profiler: bool = False, count_ops: bool = False) -> tuple[TrialResult, dict[str, Any]]:
    """Run one trial (:func:`harness.train.run_trial` on ``spec``) and ``write(result)``;
    return ``(result, profile)`` (``result``: the :class:`harness.trial.TrialResult`).

    ``profile`` holds ``wall_s`` (seconds, run_trial + write), ``phases`` ({phase: {"s": seconds,
    "calls": int}} from the phase clock), ``unattributed_s``, ``overhead_s`` / ``overhead_share``
    (everything but ``step``) and, with ``torch_profiler``, ``profiler_phases`` (the same phases
    as the profiler's ``record_function`` range totals, CPU wall time) and ``profiler_s`` (its
    start-up and post-processing, not counted in ``wall_s``), and with ``count_ops`` ``ops``
    ({phase: ops that do work}, :class:`OpCounter`).

    Raises:
        nothing for a failing trial (run_trial records it as ``failed``); profiler errors propagate.
    """
    import contextlib

    from ..env import trial_settings
    from ..train import PHASES, PhaseClock, run_trial

    trial_settings()  # once per process (torch's deterministic mode imports torch._inductor: ~1.3 s), not per trial
    clock = PhaseClock()
    prof_cm = contextlib.nullcontext()
    if torch_profiler:
        import torch
        from torch.profiler import ProfilerActivity, profile

        from .kernels import quiet_profiler

        quiet_profiler()
        acts = [ProfilerActivity.CPU]
        if spec.device.startswith("cuda") and torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        prof_cm = profile(activities=acts, record_shapes=False, with_stack=False)
    counter = OpCounter(clock) if count_ops else contextlib.nullcontext()
    t_outer = time.perf_counter()
    with prof_cm as prof, counter:
        t0 = time.perf_counter()
        result = run_trial(spec, clock=clock)
        with clock("store"):
            write(result)
        wall = time.perf_counter() - t0
    out: dict[str, Any] = {"wall_s": wall, "phases": clock.to_dict()}
    if count_ops:
        out["ops"] = {k: counter.ops.get(k, 0) for k in [*PHASES, NO_PHASE]}
    if torch_profiler:
        names = {v: k for k, v in PHASES.items()}
        got = {k: {"s": 0.0, "calls": 0} for k in PHASES}
        for evt in prof.key_averages():
            if evt.key in names:
                got[names[evt.key]] = {"s": evt.cpu_time_total / 1e6, "calls": int(evt.count)}
        out["profiler_phases"] = got
        out["profiler_s"] = time.perf_counter() - t_outer - wall
    covered = sum(p["s"] for p in out["phases"].values())
    out["unattributed_s"] = max(0.0, wall - covered)
    out["overhead_s"] = wall - out["phases"]["step"]["s"]
    out["overhead_share"] = out["overhead_s"] / wall if wall > 0 else float("nan")
    return result, out


def profile_rows(variant: str, prof: dict[str, Any]) -> list[dict[str, Any]]:
    """One table row per phase (plus ``(unattributed)`` and ``overhead``) for ``variant``."""
    wall = prof["wall_s"]
    pp, ops = prof.get("profiler_phases"), prof.get("ops")
    rows = [{"variant": variant, "phase": k, "seconds": v["s"], "share": v["s"] / wall, "calls": v["calls"],
             **({"torch.profiler s": pp[k]["s"]} if pp else {}),
             **({"ops": ops[k], "ops/call": round(ops[k] / v["calls"]) if v["calls"] else ""} if ops else {}),
             "what": PHASE_NOTES.get(k, "")}
            for k, v in prof["phases"].items()]
    rows.append({"variant": variant, "phase": "(unattributed)", "seconds": prof["unattributed_s"],
                 "share": prof["unattributed_s"] / wall, "calls": 0,
                 **({"ops": ops[NO_PHASE], "ops/call": ""} if ops else {}),
                 "what": "seeding, settings, registry, peak-memory reads: covered by no range"})
    rows.append({"variant": variant, "phase": "overhead (all but step)", "seconds": prof["overhead_s"],
                 "share": prof["overhead_share"], "calls": 0,
                 **({"ops": sum(ops.values()) - ops["step"], "ops/call": ""} if ops else {}),
                 "what": "the harness's own share of the trial"})
    rows.append({"variant": variant, "phase": "wall", "seconds": wall, "share": 1.0, "calls": 1,
                 **({"ops": sum(ops.values()), "ops/call": ""} if ops else {}),
                 "what": "the trial: run_trial + store"})
    return rows


def verdict(variant: str, prof: dict[str, Any], target: float = OVERHEAD_TARGET) -> str:
    """One line: the overhead share against ``target``."""
    share = prof["overhead_share"]
    parts = {k: v["s"] for k, v in prof["phases"].items() if k != "step"}
    parts["(unattributed)"] = prof["unattributed_s"]
    top = max(parts, key=parts.get)
    return (f"{variant}: harness overhead {share:.1%} of {prof['wall_s']:.1f} s trial wall "
            f"({'meets' if share <= target else 'misses'} the target <= {target:.0%}; largest part: {top} "
            f"{parts[top]:.2f} s)")

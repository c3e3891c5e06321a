"""Ops that do work (no views, allocations or composites' own entries: about one GPU kernel each) of
one trial-group training step (harness.vstep.GroupStep.step), by part.

Usage, from a checkout of any commit since GroupStep exists (its API is unchanged since):
    python results/reference/group-step-ops/count_group_step_ops.py [preset] [K]
Counts with its own TorchDispatchMode (so it also runs on commits before harness.perf.overhead.count_ops):
the step's forward and backward (vmap), then everything after them (norm, clipping, Adam).
"""
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.config import get_preset
from harness.model import build_model
from harness.registry import Registry
from harness.vstep import GroupStep, stack_batches


# the rule of harness.perf.overhead.launches_work and OpCounter, copied so that the script runs on older commits too
NO_KERNEL = {"_unsafe_view", "_reshape_alias", "empty", "empty_strided", "empty_like", "new_empty",
             "new_empty_strided", "resize_", "set_", "lift_fresh", "_record_function_enter_new", "_record_function_exit"}


def launches_work(func):
    return not (func.is_view or func.overloadpacket.__name__ in NO_KERNEL
                or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"))


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            with self:  # count its parts (seen here only under inference mode)
                return func.decompose(*args, **kwargs)
        self.n += launches_work(func)
        return func(*args, **kwargs)


preset, k = (sys.argv[1] if len(sys.argv) > 1 else "quick"), int(sys.argv[2]) if len(sys.argv) > 2 else 1
reg, cfg = Registry.from_plugins(), get_preset(preset)
variant = reg.select(["baseline"])[0]
models = [build_model(reg, variant, cfg.model, seed=s) for s in range(k)]
task = reg.task(cfg.train.task)
batches = [next(task.batches(cfg, torch.Generator().manual_seed(s))) for s in range(k)]
step = GroupStep(models, cfg.model.pad, cfg.train.label_smoothing, cfg.train.grad_clip, torch.device("cpu"))
step.set_lr(1e-3)
src, tgt, tgt_y = stack_batches(batches)
step.step(src, tgt, tgt_y)  # one step first: lazily built state is not counted
with Count() as whole:
    step.step(src, tgt, tgt_y)
with Count() as fwd_bwd:
    step.grad_fn(step.params, step.buffers, src, tgt, tgt_y)
tensors = sum(1 for _ in models[0].parameters())
print(f"{preset} K={k}: {tensors} parameter tensors; one GroupStep.step: {whole.n} ops "
      f"(forward+backward {fwd_bwd.n}, the rest {whole.n - fwd_bwd.n})")

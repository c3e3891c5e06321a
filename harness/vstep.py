"""The training step of a trial group: K seeds of one variant stepped as one program.

The K models' parameters and buffers are stacked along a new leading dimension
(``torch.func.stack_module_state``: every tensor gets shape (K, ...), row k = seed k), and one
``torch.func.vmap`` over ``torch.func.grad_and_value`` of ``functional_call`` computes every
seed's loss and gradients in one call (the "model ensembling" recipe of the PyTorch tutorials);
a group of one calls ``grad_and_value`` on its row without ``vmap`` (:func:`_one_seed`).
Everything after the backward is written on the stacked tensors so that each seed stays its own
trial:

- gradient norm per seed (the 2-norm of the seed's gradients, as ``clip_grad_norm_`` computes it,
  up to float rounding: one reduction over the seed's row instead of a norm of per-tensor norms)
  and clipping to ``train.grad_clip`` per seed (``max_norm / (norm + 1e-6)``, clamped to 1);
- Adam or AdamW per seed (:class:`StackedAdam`: its moments and step count are rows of stacked
  tensors; AdamW's decoupled weight decay on the columns of the decayed parameters), with the
  learning rate a tensor (the schedule's value, :func:`harness.schedule.lr_at`), so the step holds no
  Python number that changes between steps and can be captured as a CUDA graph;
- all of it on flat storage (:class:`FlatRows`): the parameters are views into one (K, N) buffer
  per dtype, and the gradients are gathered into one, so the norm, the clipping and Adam are a
  fixed handful of elementwise ops whatever the number of parameter tensors. Per tensor they were
  about 16 ops each, 759 of the 1,059 ops of a ``quick`` baseline step at K = 4 (35 of 337
  now: ``results/reference/group-step-ops``), and in a captured step every op is a kernel the GPU
  runs one after another;
- a non-finite loss or gradient norm skipped by a mask, not a Python branch: that seed's
  parameters, moments and step count stay as they were, the other seeds step on, and the seed is
  frozen from then on (:attr:`GroupStep.active`); early stopping clears its row of the same mask.

Nothing here synchronises with the device: the step returns the per-seed losses and gradient
norms as (K,) tensors and the caller reads them once per logging interval.

Batches: each seed's batch comes from its own generator; :func:`stack_batches` pads them to a
common width (pad id 0: masked keys, ignored labels) and stacks them to (K, B, S) / (K, B, T).
With ``widths`` fixed (the task's :meth:`~harness.tasks.base.Task.widths`) every step has the
same shapes, which a captured step needs.

Dropout: ``vmap(randomness="different")`` gives every seed its own masks, drawn from the one
global RNG stream of the process, so a vectorised seed with dropout > 0 is not the same trial as
its sequential run (it is a trial of the same distribution).
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch
from torch.func import functional_call, grad_and_value, stack_module_state, vmap
from torch.nn import functional as F

from .tasks.base import Batch, loss_fn

#: Adam's hyper-parameters of every trial (Vaswani et al. 2017 §5.3; :func:`harness.recipe.make_optimizer`).
BETAS, EPS = (0.9, 0.98), 1e-9
#: What ``torch.nn.utils.clip_grad_norm_`` adds to the norm before dividing.
CLIP_EPS = 1e-6


class FlatRows:
    """Stacked tensors (name -> (K, ...)) stored as column blocks of one (K, N) buffer per dtype.

    ``views[name]`` is a (K, ...) view into its buffer (row k = seed k, as the input), so writing a
    buffer in place updates every view and the views' storage never moves (a captured graph
    replays on the same memory). :meth:`gather` lays out other tensors of the same names and
    shapes (the gradients) the same way, in one ``torch.cat`` per buffer.

    Args:
        tensors: name -> (K, ...) tensors, all with the same K and device (copied).
    """

    def __init__(self, tensors: dict[str, torch.Tensor]):
        by_dtype: dict[torch.dtype, list[str]] = {}
        for name, t in tensors.items():
            by_dtype.setdefault(t.dtype, []).append(name)
        self.groups = list(by_dtype.values())  # the names in each buffer, in column order
        self.shapes = {n: tuple(t.shape) for n, t in tensors.items()}
        self.buffers = [b.clone() for b in self.gather(tensors)]  # (K, N_d) each
        self.views = self._views()

    def _views(self) -> dict[str, torch.Tensor]:
        views = {}
        for names, buf in zip(self.groups, self.buffers):
            start = 0
            for n in names:
                size = math.prod(self.shapes[n][1:])
                views[n] = buf[:, start:start + size].view(self.shapes[n])
                start += size
        return views

    def zeros_like(self) -> "FlatRows":
        """The same layout, all zeros (Adam's moments)."""
        return FlatRows({n: torch.zeros_like(v) for n, v in self.views.items()})

    def gather(self, tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """``tensors`` (the names and shapes of :attr:`views`) as new (K, N_d) buffers in this layout."""
        return [torch.cat([tensors[n].reshape(self.shapes[n][0], -1) for n in names], dim=1) for names in self.groups]


class StackedAdam:
    """Adam (bias-corrected, ``betas`` = (0.9, 0.98), ``eps`` = 1e-9) on stacked parameters, or AdamW
    with ``weight_decay`` > 0: row k of every tensor is seed k's, with its own first and second moments
    and its own step count.

    The update is PyTorch's (``torch.optim.Adam``'s single-tensor rule): m <- lerp(m, g, 1 - b1),
    v <- b2 v + (1 - b2) g^2, p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps); with
    ``weight_decay`` lambda > 0 (``torch.optim.AdamW``) p is first multiplied by 1 - lr * lambda in the
    columns of the decayed parameters (a 0/1 column mask per buffer; 1 - lr * lambda * 0 = 1 elsewhere).
    ``lr`` is a 0-dim tensor and ``mask`` a (K,) bool: a seed whose row is False keeps its parameters,
    moments and step count (``torch.where``; no Python branch, no sync). It runs on the flat buffers
    of a :class:`FlatRows` (about 15 ops per dtype, whatever the number of tensors; 3 more with weight
    decay) and updates them in place, so the tensors' storage never changes (a captured graph replays
    on the same memory).

    Args:
        params: the stacked parameters (updated in place by :meth:`step`).
        weight_decay: AdamW's lambda (0: Adam).
        decayed: the names (of ``params.views``) that weight decay applies to.

    Attributes:
        m, v: name -> (K, ...) views of the moments; t: (K,) float32 steps taken; moments: the
        :class:`FlatRows` of m and v; decay: per buffer a (1, N_d) 0/1 mask of the decayed columns (None
        without weight decay).
    """

    def __init__(self, params: FlatRows, weight_decay: float = 0.0, decayed: set[str] | frozenset = frozenset()):
        self.params = params
        self._m, self._v = params.zeros_like(), params.zeros_like()
        self.m, self.v = self._m.views, self._v.views
        self.moments = (self._m, self._v)  # the flat storage of m and v (a checkpoint copies into it)
        first = params.buffers[0]
        self.t = torch.zeros(first.size(0), dtype=torch.float32, device=first.device)  # (K,) steps taken
        self.weight_decay = float(weight_decay)
        self.decay: list[torch.Tensor] | None = None
        if self.weight_decay and set(decayed) & set(params.views):
            self.decay = [torch.cat([torch.full((1, math.prod(params.shapes[n][1:])), float(n in decayed),
                                                dtype=buf.dtype, device=buf.device) for n in names], dim=1)
                          for names, buf in zip(params.groups, params.buffers)]  # (1, N_d) each

    def step(self, grads: list[torch.Tensor], lr: torch.Tensor, mask: torch.Tensor) -> None:
        """One masked Adam (AdamW) step. Shape: grads: per buffer of :attr:`params` (K, N_d) (its
        :meth:`FlatRows.gather`); lr (K,) (or (), one for all); mask (K,) bool."""
        b1, b2 = BETAS
        t = self.t + mask.to(self.t.dtype)  # (K,)
        tc = t.clamp(min=1.0)  # a seed that never stepped: no division by 0 (its row is masked)
        step_size = (lr / (1.0 - torch.pow(b1, tc)))[:, None]  # (K, 1)
        bc2_sqrt = (1.0 - torch.pow(b2, tc)).sqrt()[:, None]  # (K, 1)
        keep = mask[:, None]  # (K, 1)
        decay = self.decay or [None] * len(grads)
        for p, g, m_old, v_old, d in zip(self.params.buffers, grads, self._m.buffers, self._v.buffers, decay):
            g = g.to(p.dtype)
            m = m_old.lerp(g, 1.0 - b1)  # (K, N) each; the in-place steps below reuse these temporaries
            v = v_old.mul(b2).addcmul_(g, g, value=1.0 - b2)
            step = m.div(v.sqrt().div_(bc2_sqrt).add_(EPS)).mul_(step_size)
            torch.where(keep, m, m_old, out=m_old)  # a masked row keeps its state (bitwise)
            torch.where(keep, v, v_old, out=v_old)
            moved = p - step if d is None else p.mul(1.0 - (lr.reshape(-1, 1) * self.weight_decay) * d).sub_(step)
            torch.where(keep, moved, p, out=p)
        self.t.copy_(t)


def grad_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """Per-seed global gradient 2-norm over the seeds' rows (every buffer of a
    :meth:`FlatRows.gather`): ``clip_grad_norm_``'s value up to float rounding (it takes the norm
    of per-tensor norms). Shape: buffers (K, N_d) -> (K,)."""
    norms = [torch.linalg.vector_norm(g.float(), dim=1) for g in grads]  # per buffer (K,)
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms), dim=0)


def stack_batches(batches: list[Batch], widths: tuple[int, int] | None = None,
                  pad: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K seeds' batches as stacked tensors, each padded on the right with ``pad`` to the widest
    (or to ``widths`` = (S, T) when given: fixed shapes for a captured step).

    Shape:
        batches: K x (src (B, S_k), tgt (B, T_k), tgt_y (B, T_k)) ->
        src (K, B, S), tgt (K, B, T), tgt_y (K, B, T).

    Raises:
        ValueError: the batches have different numbers of rows, or one is wider than ``widths``.
    """
    if len({b.src.size(0) for b in batches}) != 1:
        raise ValueError(f"stack_batches: the seeds' batches have different row counts "
                         f"{sorted({b.src.size(0) for b in batches})}")
    s = max(b.src.size(1) for b in batches)
    t = max(b.tgt.size(1) for b in batches)
    if widths is not None:
        if s > widths[0] or t > widths[1]:
            raise ValueError(f"stack_batches: a batch of widths ({s}, {t}) is wider than the fixed ({widths[0]}, "
                             f"{widths[1]})")
        s, t = widths

    def padded(x, n):
        return F.pad(x, (0, n - x.size(1)), value=pad) if x.size(1) < n else x

    return (torch.stack([padded(b.src, s) for b in batches]), torch.stack([padded(b.tgt, t) for b in batches]),
            torch.stack([padded(b.tgt_y, t) for b in batches]))


def _one_seed(fn: Callable, grads: bool = False) -> Callable:
    """``fn`` (a per-seed ``(params, buffers, src, tgt, tgt_y)`` function) called on row 0 of stacked
    inputs with a leading dimension of 1 added back to its outputs: what ``vmap(fn)`` gives for K = 1,
    without vmap's batching rules. Under vmap a linear layer is a batched matmul plus a separate bias
    add and the loss a gather/scatter decomposition: the forward and backward of a ``quick`` baseline
    step do 300 ops of work under vmap and 197 without (``results/reference/group-step-ops``)."""
    def call(p, b, src, tgt, tgt_y):
        out = fn({n: t[0] for n, t in p.items()}, {n: t[0] for n, t in b.items()}, src[0], tgt[0], tgt_y[0])
        if grads:
            g, loss = out
            return {n: x.unsqueeze(0) for n, x in g.items()}, loss.unsqueeze(0)
        return out.unsqueeze(0)
    return call


class GroupStep:
    """The stacked state of K models and their training step (see the module docstring).

    Args:
        models: K models of one variant (same module tree), on ``device``; their tensors are
            copied (the models themselves are not trained: :meth:`load` writes a seed's row back).
        pad, smoothing, grad_clip: the loss's pad id and label smoothing; ``train.grad_clip``.
        device, dtype: where it runs; ``"fp32"`` or ``"bf16"`` (autocast around the forward).
        weight_decay, decayed: AdamW's lambda and the parameter names it applies to (:class:`StackedAdam`;
            :func:`harness.recipe.group_step` gives the config's).

    Attributes:
        params, buffers: name -> (K, ...) stacked tensors.
        active: (K,) bool: the seeds that still step (cleared by a non-finite step or :meth:`stop`).
        lr: (K,) float32 tensor: each seed's learning rate of the next step (set with :meth:`set_lr`; the
            members of a learning-rate sweep's group each have their own).
    """

    def __init__(self, models: list[torch.nn.Module], pad: int, smoothing: float, grad_clip: float,
                 device: torch.device, dtype: str = "fp32", weight_decay: float = 0.0,
                 decayed: set[str] | frozenset = frozenset()):
        self.k, self.grad_clip, self.device = len(models), float(grad_clip), device
        params, buffers = stack_module_state(models)
        frozen = {n for n, p in models[0].named_parameters() if not p.requires_grad}  # Adam never sees them
        self.flat = FlatRows({n: p.detach() for n, p in params.items() if n not in frozen})
        self.params = self.flat.views
        self.buffers = {n: b.detach().clone() for n, b in buffers.items()}
        self.buffers.update({n: params[n].detach().clone() for n in frozen})
        self.base = copy.deepcopy(models[0]).to("meta")
        self.base.train()
        self.adam = StackedAdam(self.flat, weight_decay, decayed)
        self.active = torch.ones(self.k, dtype=torch.bool, device=device)
        self.lr = torch.zeros(self.k, dtype=torch.float32, device=device)

        def loss_of(p, b, src, tgt, tgt_y):
            # autocast's weight-cast cache off: a captured graph must not keep casts from its capture
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16", cache_enabled=False):
                logits = functional_call(self.base, (p, b), (src, tgt))  # (B, T, V)
            return loss_fn(logits, tgt_y, pad, smoothing)

        if self.k == 1:  # a group of one (the main job's): the seed's own functional step, no vmap
            self.grad_fn: Callable = _one_seed(grad_and_value(loss_of), grads=True)
            self.loss_fn: Callable = _one_seed(loss_of)
        else:
            self.grad_fn = vmap(grad_and_value(loss_of), randomness="different")
            self.loss_fn = vmap(loss_of, randomness="different")

    def set_lr(self, lr) -> None:
        """The next step's learning rate, one for every seed (a float) or one per seed (K floats), written
        into :attr:`lr` in place, outside any captured graph."""
        if isinstance(lr, (int, float)):
            self.lr.fill_(lr)
        else:
            self.lr.copy_(torch.tensor(lr, dtype=torch.float32))

    def step(self, src: torch.Tensor, tgt: torch.Tensor, tgt_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of every active seed; no sync. Shape: src (K, B, S), tgt/tgt_y (K, B, T) ->
        ``(loss (K,), grad_norm (K,))``, float32, before clipping (the seeds' values, also for
        frozen seeds, whose update is masked)."""
        grads, loss = self.grad_fn(self.params, self.buffers, src, tgt, tgt_y)
        flat = self.flat.gather(grads)  # per dtype (K, N_d)
        gnorm = grad_norms(flat)  # (K,)
        if self.grad_clip > 0:
            coef = (self.grad_clip / (gnorm + CLIP_EPS)).clamp(max=1.0)[:, None]  # (K, 1)
            flat = [g * coef.to(g.dtype) for g in flat]
        finite = torch.isfinite(loss) & torch.isfinite(gnorm)
        self.adam.step(flat, self.lr, self.active & finite)
        self.active.logical_and_(finite)
        return loss.detach().float(), gnorm

    def stop(self, i: int) -> None:
        """Freeze seed ``i`` (early stopping): its row no longer updates."""
        self.active[i] = False

    def seed_forward(self, i: int) -> Callable:
        """``(src (B, S), tgt (B, T)) -> logits (B, T, V)`` of seed ``i`` through the group's own base module (the
        one that trained, with whatever state it keeps), in evaluation mode and without autograd; the base's
        training mode is restored after each call."""
        def forward(src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
            tensors = {n: t[i] for n, t in self.params.items()} | {n: t[i] for n, t in self.buffers.items()}
            self.base.eval()
            try:
                with torch.no_grad():
                    return functional_call(self.base, tensors, (src, tgt))
            finally:
                self.base.train()
        return forward

    def state(self) -> dict[str, Any]:
        """The group's training state, for a checkpoint (:mod:`harness.vcheckpoint`): the flat parameter
        buffers (:class:`FlatRows`, (K, N_d) each) with their names, the other stacked tensors (buffers and
        frozen parameters, (K, ...)), Adam's moments (the same layout) and step counts (K,), the
        ``active`` mask (K,) and the learning rate ()."""
        return {"names": [list(names) for names in self.flat.groups], "params": list(self.flat.buffers),
                "buffers": dict(self.buffers), "m": list(self.adam.moments[0].buffers),
                "v": list(self.adam.moments[1].buffers), "t": self.adam.t, "active": self.active, "lr": self.lr}

    def layout_problem(self, state: dict[str, Any]) -> str | None:
        """Why ``state`` (a :meth:`state`, read back) does not fit this step's tensors (other names,
        shapes or dtypes: another model), or None; nothing is changed."""
        mine = self.state()
        if state.get("names") != mine["names"]:
            return "its stacked parameters have other names (another model)"
        if not isinstance(state.get("buffers"), dict) or state["buffers"].keys() != mine["buffers"].keys():
            return "its stacked buffers have other names (another model)"
        for key in ("params", "m", "v", "t", "active", "lr", "buffers"):
            a, b = mine[key], state.get(key)
            if isinstance(a, dict):
                a, b = list(a.values()), [b[n] for n in a]
            a, b = (a, b) if isinstance(a, list) else ([a], [b])
            if not isinstance(b, list) or len(a) != len(b) or not all(
                    isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype for x, y in zip(a, b)):
                return f"its {key} tensors have other shapes or dtypes (another model)"
        return None

    @torch.no_grad()
    def load_state_(self, state: dict[str, Any]) -> None:
        """Copy ``state`` (a :meth:`state` that fits: :meth:`layout_problem`) into the group's tensors in place:
        their storage does not move, so views (:attr:`params`), a :class:`harness.tasks.seeds.SeedStack` and a
        captured graph (:class:`CapturedStep`) see the restored values."""
        mine = self.state()
        for key in ("params", "m", "v"):
            for dst, src in zip(mine[key], state[key]):
                dst.copy_(src)
        for name, dst in mine["buffers"].items():
            dst.copy_(state["buffers"][name])
        for key in ("t", "active", "lr"):
            mine[key].copy_(state[key])

    @torch.no_grad()
    def load(self, i: int, model: torch.nn.Module) -> torch.nn.Module:
        """Write seed ``i``'s parameters and buffers into ``model`` (same module tree); returns it."""
        for name, p in model.named_parameters():
            p.copy_((self.params[name] if name in self.params else self.buffers[name])[i])
        for name, b in model.named_buffers():
            if name in self.buffers:
                b.copy_(self.buffers[name][i])
        return model


def bucket_widths(s: int, t: int, widths: tuple[int, int], buckets: int = 4) -> tuple[int, int]:
    """The static shape a batch of widths (``s``, ``t``) is padded to for a captured step: the
    task's widest (S, T) = ``widths`` cut into ``buckets`` equal steps, and the smallest step that
    holds both widths (the same step for S and T, so at most ``buckets`` shapes, hence graphs).

    Example: widths (20, 21), 4 buckets (5, 6), (10, 11), (15, 16), (20, 21): (7, 9) -> (10, 11);
    (3, 4) -> (5, 6); (20, 2) -> (20, 21).

    Raises:
        ValueError: ``s`` or ``t`` is wider than ``widths``.
    """
    if s > widths[0] or t > widths[1]:
        raise ValueError(f"bucket_widths: a batch of widths ({s}, {t}) is wider than the task's {widths}")
    steps = [(math.ceil(widths[0] * i / buckets), math.ceil(widths[1] * i / buckets)) for i in range(1, buckets + 1)]
    return next(w for w in steps if w[0] >= s and w[1] >= t)


class CapturedStep:
    """:meth:`GroupStep.step` replayed as CUDA graphs, one per input shape (``torch.cuda.graph``).
    ``fn``: what to capture instead of ``step.step``, a function of the same inputs that updates the
    same state (the bench's compiled arms pass ``torch.compile(step.step)``: its kernels, fused by
    Inductor, are captured; its first warm-up call compiles).

    The first call with a new shape warms the step up on a side stream (:data:`WARMUP_REPLAYS`
    steps with every seed masked, so nothing moves, and the RNG forked, so the group's dropout stream
    is where it was: a group continued from its checkpoint, which captures later, draws the same
    masks as the uninterrupted one), then captures one step on static input
    buffers; every call copies the batch into them, replays the graph and returns copies of the
    static outputs. The state the graph updates (stacked parameters, Adam moments and step
    counts, the ``active`` mask, the learning rate tensor) lives outside the graph's pool and is
    updated in place, so eager code (evaluation, :meth:`GroupStep.load`, :meth:`GroupStep.stop`,
    :meth:`GroupStep.set_lr`) sees and changes it between replays. No sync inside: the caller reads
    the losses once per logging interval. CUDA only.
    """

    WARMUP_REPLAYS = 3

    def __init__(self, step: GroupStep, fn: Callable | None = None):
        if step.device.type != "cuda":
            raise ValueError("CapturedStep needs a CUDA device (CUDA graphs)")
        self.step = step
        self.fn = fn or step.step  # what is captured: the step, or the same step through torch.compile
        self.graphs: dict[tuple, tuple] = {}

    def __call__(self, src: torch.Tensor, tgt: torch.Tensor, tgt_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`GroupStep.step`. Shape: src (K, B, S), tgt/tgt_y (K, B, T) -> (K,), (K,)."""
        key = (tuple(src.shape), tuple(tgt.shape))
        held = self.graphs.get(key) or self._capture(key, src, tgt, tgt_y)
        inputs, outputs, graph = held
        for static, x in zip(inputs, (src, tgt, tgt_y)):
            static.copy_(x, non_blocking=True)
        graph.replay()
        return outputs[0].clone(), outputs[1].clone()

    def _capture(self, key: tuple, src, tgt, tgt_y) -> tuple:
        st = self.step
        inputs = [x.clone() for x in (src, tgt, tgt_y)]
        active = st.active.clone()
        st.active.zero_()  # the warm-up steps compute everything and change nothing
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        index = st.device.index if st.device.index is not None else torch.cuda.current_device()
        with torch.random.fork_rng(devices=[index]), torch.cuda.stream(side):  # no dropout masks drawn for them
            for _ in range(self.WARMUP_REPLAYS):
                self.fn(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                outputs = self.fn(*inputs)
        finally:
            st.active.copy_(active)
        self.graphs[key] = (inputs, outputs, graph)
        return self.graphs[key]

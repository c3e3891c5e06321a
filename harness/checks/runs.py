"""Running variants: the reference canonical state, eval-mode forward/backward in the check dtype
and in float64, and :class:`CheckSession`, the set-up every check shares (made once).

Shape letters: B batch, S source length, T target length, V vocabulary.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch
from torch import nn
from torch.nn import functional as F

from ..config import ModelConfig
from ..errors import HarnessError
from ..model import build_model, canonical_grad, canonical_state_dict, load_canonical_state_dict
from ..registry import Registry, Variant
from .inputs import CHECK_MODEL, autocast, describe_exception, draw_reference_state, padded_batch, starting
from .expectations import registry_groups
from .policy import Tolerance, get_tolerance


def reference_state(registry: Registry, variants: Iterable[Variant], cfg: ModelConfig,
                    seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """One canonical state covering every canonical name of ``variants``.

    Returns:
        ``(state, errors)``: the state (:func:`draw_reference_state` over the union of names; a name
        two variants export with different shapes takes the first variant's shape: see
        :func:`variant_shapes` for the per-variant layouts) and ``{variant: crash reason}`` for
        variants that could not even be built.
    """
    shapes, errors = variant_shapes(registry, variants, cfg, seed)
    union: dict[str, tuple[int, ...]] = {}
    for own in shapes.values():
        for name, shape in own.items():
            union.setdefault(name, shape)
    return draw_reference_state(union, seed), errors


def variant_shapes(registry: Registry, variants: Iterable[Variant], cfg: ModelConfig,
                   seed: int = 0) -> tuple[dict[str, dict[str, tuple[int, ...]]], dict[str, str]]:
    """Each buildable variant's canonical layout ``{variant: {name: shape}}`` and ``{variant: crash reason}``.

    A component may give its canonical parameters shapes of its own (grouped-query attention's
    ``w_k`` (n_kv d_k, D), a SwiGLU at inner width d_ff): each variant then holds a state drawn over
    its own shapes (:func:`draw_reference_state` is a function of (seed, name, shape), so names with one
    shape get one value everywhere), and a pair with a name in two shapes is not comparable
    (:func:`layout_conflict`).
    """
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    errors: dict[str, str] = {}
    for v in variants:
        try:
            model = build_model(registry, v, cfg, seed)
        except HarnessError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per variant
            errors[v.name] = describe_exception(exc)
            continue
        shapes[v.name] = {name: tuple(t.shape) for name, t in canonical_state_dict(model).items()}
    return shapes, errors


def layout_conflict(a: str, b: str, shapes: dict[str, dict[str, tuple[int, ...]]]) -> str:
    """Why variants ``a`` and ``b`` cannot hold one canonical state ("" when they can): the first
    canonical name they export with different shapes."""
    sa, sb = shapes.get(a, {}), shapes.get(b, {})
    clash = sorted(n for n in set(sa) & set(sb) if sa[n] != sb[n])
    if not clash:
        return ""
    more = f" and {len(clash) - 1} more" if len(clash) > 1 else ""
    return (f"no canonical counterpart: {clash[0]} has shape {sa[clash[0]]} in {a} but {sb[clash[0]]} in "
            f"{b}{more} (a component with parameter shapes of its own); compared by its own contract only, "
            f"in an equivalence class of its own")


def load_variant(registry: Registry, variant: Variant, cfg: ModelConfig, state: dict[str, torch.Tensor],
                 seed: int = 0) -> tuple[nn.Module, list[str]]:
    """Build ``variant`` and load ``state`` through the canonical layout. Returns (model, lossy-load notes)."""
    model = build_model(registry, variant, cfg, seed)
    return model, load_canonical_state_dict(model, state)


@contextlib.contextmanager
def tf32_disabled():
    """Switch TF32 off for CUDA matmul and cuDNN inside the block; yields the policy as text."""
    if not torch.cuda.is_available():
        yield "n/a (no CUDA)"
        return
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield f"off during checks (allow_tf32 was matmul={old[0]}, cudnn={old[1]}; restored afterwards)"
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def canonical_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gradient of every canonical parameter (tied names share one gradient; a canonical view of a
    packed parameter gets the same view of its gradient, :func:`harness.model.canonical_grad`); CPU copies."""
    out = {}
    for name, t in canonical_state_dict(model).items():
        g = canonical_grad(t)  # a view of a packed parameter: the same view of its gradient
        if g is not None:
            out[name] = g.detach().cpu().clone()
    return out


def forward_backward(model: nn.Module, src, tgt, labels, device: torch.device, dtype: str,
                     pad: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Eval-mode logits (B, T, V) and canonical gradients of the mean cross-entropy at real target positions.

    ``dtype``: ``fp32``, ``bf16`` (autocast) or ``fp64`` (the model must already be float64).
    Returns CPU tensors.
    """
    model.eval()
    model.zero_grad(set_to_none=True)
    src, tgt, labels = src.to(device), tgt.to(device), labels.to(device)
    keep = tgt != pad
    with autocast(device, dtype):
        logits = model(src, tgt)
    work = torch.float64 if dtype == "fp64" else torch.float32
    loss = F.cross_entropy(logits[keep].to(work), labels[keep])
    loss.backward()
    return logits.detach().cpu(), canonical_grads(model)


@dataclass
class VariantRun:
    """One variant's logits (B, T, V) and canonical gradients, in the run dtype and in float64."""

    variant: str
    logits: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    logits64: torch.Tensor | None = None
    grads64: dict[str, torch.Tensor] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str = ""


def run_variant(registry: Registry, variant: Variant, cfg: ModelConfig, state: dict[str, torch.Tensor],
                batch, device: torch.device | str = "cpu", dtype: str = "fp32") -> VariantRun:
    """Run ``variant`` holding ``state`` on ``batch`` in ``dtype`` and in float64 (golden); never raises
    for a failing variant (its ``error`` says why)."""
    device = torch.device(device)
    run = VariantRun(variant.name)
    src, tgt, labels = batch
    try:
        model, run.notes = load_variant(registry, variant, cfg, state)
        run.logits, run.grads = forward_backward(model.to(device), src, tgt, labels, device, dtype, cfg.pad)
        model64, _ = load_variant(registry, variant, cfg, state)
        model64 = model64.to(device=device, dtype=torch.float64)
        run.logits64, run.grads64 = forward_backward(model64, src, tgt, labels, device, "fp64", cfg.pad)
    except Exception as exc:  # noqa: BLE001 - a crash is a check result
        run.error = describe_exception(exc)
    return run


# --------------------------------------------------------------------------- the session

@dataclass
class CheckSession:
    """The set-up every check shares, made once (:meth:`create`): config, device, dtype, tolerance,
    the padded batch, the declared equivalence groups, the reference canonical state, the TF32
    policy and the variants' runs.

    Attributes:
        batch: ``(src (B, S), tgt (B, T), labels (B, T))`` from :func:`padded_batch`, CPU int64: 4 short rows and 2
            as long as ``cfg.max_len`` (up to 66), so every whole-model comparison also sees long rows.
        short: the batch without its long rows (:meth:`create`): the model probes' (they probe the long rows
            with one more eval-mode causal probe, :func:`~harness.checks.properties.table.run_properties`).
        task_rows: rows drawn by a task (``check --preset``'s, else the default preset's), or None: the model
            probes also probe them (:func:`~harness.checks.properties.table.run_properties`), and a pair found equivalent on
            :attr:`batch` is compared on them too (:meth:`run_task`).
        task_runs: variant -> :class:`VariantRun` on :attr:`task_rows`, filled by :meth:`run_task`.
        groups: declared-equivalent components (None until :meth:`declared` computes them).
        state: the reference canonical state (:func:`reference_state`), empty until :meth:`load_state`.
        build_errors: variant -> why it could not be built (from :meth:`load_state`).
        tf32: the TF32 policy as text, set inside :meth:`tf32_off`.
        runs: variant -> :class:`VariantRun`, filled by :meth:`run`.
    """

    registry: Registry
    cfg: ModelConfig
    device: torch.device
    dtype: str
    seed: int
    tol: Tolerance
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    groups: dict | None = None
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    shapes: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    build_errors: dict[str, str] = field(default_factory=dict)
    tf32: str = ""
    runs: dict[str, VariantRun] = field(default_factory=dict)
    short: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    task_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    task_runs: dict[str, VariantRun] = field(default_factory=dict)

    @classmethod
    def create(cls, registry: Registry, cfg: ModelConfig | None = None, *, device: torch.device | str = "cpu",
               dtype: str = "fp32", seed: int = 0, groups=None, task_rows=None) -> "CheckSession":
        """Validate ``cfg`` (default :data:`CHECK_MODEL`), look up the tolerance, draw the batch. ``task_rows``:
        rows a task drew (:func:`harness.checks.properties.rows.task_rows`), probed beside the drawn ones.

        Raises:
            ConfigError: bad config, or no tolerance for ``dtype`` on ``device``.
        """
        cfg = (cfg or CHECK_MODEL).validate()
        device = torch.device(device)
        tol = get_tolerance(dtype, device.type)
        return cls(registry, cfg, device, dtype, seed, tol, starting(padded_batch(cfg, seed=seed, long_rows=2), cfg),
                   groups, short=starting(padded_batch(cfg, seed=seed), cfg),  # the probes' batch: the 4 short rows
                   task_rows=task_rows)

    @property
    def keep(self) -> torch.Tensor:
        """(B, T) bool: the real (non-pad) target positions of :attr:`batch`."""
        return self.batch[1] != self.cfg.pad

    def declared(self) -> dict:
        """The equivalence groups: as given to :meth:`create`, else the registrations' (:func:`registry_groups`)."""
        if self.groups is None:
            self.groups = registry_groups(self.registry, None, self.cfg)
        return self.groups

    @contextlib.contextmanager
    def tf32_off(self) -> Iterator["CheckSession"]:
        """:func:`tf32_disabled` for the block; records the policy in :attr:`tf32`."""
        with tf32_disabled() as policy:
            self.tf32 = policy
            yield self

    def load_state(self, variants: Iterable[Variant]) -> None:
        """Draw the reference canonical state covering ``variants`` (:func:`reference_state`) and keep
        each variant's layout (:func:`variant_shapes`, :meth:`state_for`)."""
        self.shapes, self.build_errors = variant_shapes(self.registry, variants, self.cfg, self.seed)
        union: dict[str, tuple[int, ...]] = {}
        for own in self.shapes.values():
            for name, shape in own.items():
                union.setdefault(name, shape)
        self.state = draw_reference_state(union, self.seed)

    def state_for(self, name: str) -> dict[str, torch.Tensor]:
        """The reference state variant ``name`` holds: :attr:`state`, or one drawn over its own shapes
        where they differ from it (the same values for every name of the same shape)."""
        own = self.shapes.get(name, {})
        if all(tuple(self.state[n].shape) == shape for n, shape in own.items() if n in self.state):
            return self.state
        return draw_reference_state(own, self.seed)

    def run_task(self, variant: Variant) -> VariantRun | None:
        """``variant``'s :class:`VariantRun` on :attr:`task_rows` alone (a forward of their own: a component keyed
        on what a whole real batch looks like sees one), run once, then kept; None without task rows."""
        if self.task_rows is None:
            return None
        if variant.name not in self.task_runs:
            self.task_runs[variant.name] = (
                VariantRun(variant.name, error=self.build_errors[variant.name]) if variant.name in self.build_errors
                else run_variant(self.registry, variant, self.cfg, self.state_for(variant.name), self.task_rows,
                                 self.device, self.dtype))
        return self.task_runs[variant.name]

    def run(self, variant: Variant) -> VariantRun:
        """``variant``'s :class:`VariantRun` on :attr:`batch` holding :attr:`state` (run once, then kept)."""
        if variant.name not in self.runs:
            self.runs[variant.name] = (
                VariantRun(variant.name, error=self.build_errors[variant.name]) if variant.name in self.build_errors
                else run_variant(self.registry, variant, self.cfg, self.state_for(variant.name), self.batch, self.device,
                                 self.dtype))
        return self.runs[variant.name]

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
from .inputs import CHECK_MODEL, autocast, describe_exception, draw_reference_state, padded_batch
from .policy import Tolerance, get_tolerance, registry_groups


def reference_state(registry: Registry, variants: Iterable[Variant], cfg: ModelConfig,
                    seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """One canonical state covering every canonical name of ``variants``.

    Returns:
        ``(state, errors)``: the state (:func:`draw_reference_state` over the union of names)
        and ``{variant: crash reason}`` for variants that could not even be built.

    Raises:
        HarnessError: two variants use one canonical name with different shapes (a component
            that does not follow its slot's canonical layout).
    """
    shapes: dict[str, tuple[int, ...]] = {}
    owner: dict[str, str] = {}
    errors: dict[str, str] = {}
    for v in variants:
        try:
            model = build_model(registry, v, cfg, seed)
        except HarnessError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per variant
            errors[v.name] = describe_exception(exc)
            continue
        for name, t in canonical_state_dict(model).items():
            if name in shapes and shapes[name] != tuple(t.shape):
                raise HarnessError(f"canonical parameter {name!r} has shape {shapes[name]} in variant "
                                   f"{owner[name]!r} but {tuple(t.shape)} in {v.name!r}; a component does not "
                                   f"follow its slot's canonical layout (see harness/model.py)")
            shapes.setdefault(name, tuple(t.shape))
            owner.setdefault(name, v.name)
    return draw_reference_state(shapes, seed), errors


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
        batch: ``(src (B, S), tgt (B, T), labels (B, T))`` from :func:`padded_batch`, CPU int64.
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
    build_errors: dict[str, str] = field(default_factory=dict)
    tf32: str = ""
    runs: dict[str, VariantRun] = field(default_factory=dict)

    @classmethod
    def create(cls, registry: Registry, cfg: ModelConfig | None = None, *, device: torch.device | str = "cpu",
               dtype: str = "fp32", seed: int = 0, groups=None) -> "CheckSession":
        """Validate ``cfg`` (default :data:`CHECK_MODEL`), look up the tolerance, draw the batch.

        Raises:
            ConfigError: bad config, or no tolerance for ``dtype`` on ``device``.
        """
        cfg = (cfg or CHECK_MODEL).validate()
        device = torch.device(device)
        tol = get_tolerance(dtype, device.type)
        return cls(registry, cfg, device, dtype, seed, tol, padded_batch(cfg, seed=seed), groups)

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
        """Draw the reference canonical state covering ``variants`` (:func:`reference_state`).

        Raises:
            HarnessError: inconsistent canonical layouts.
        """
        self.state, self.build_errors = reference_state(self.registry, variants, self.cfg, self.seed)

    def run(self, variant: Variant) -> VariantRun:
        """``variant``'s :class:`VariantRun` on :attr:`batch` holding :attr:`state` (run once, then kept)."""
        if variant.name not in self.runs:
            self.runs[variant.name] = (
                VariantRun(variant.name, error=self.build_errors[variant.name]) if variant.name in self.build_errors
                else run_variant(self.registry, variant, self.cfg, self.state, self.batch, self.device, self.dtype))
        return self.runs[variant.name]

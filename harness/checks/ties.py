"""Tied parameters: which canonical names share one storage, whether the ties survive ``.to`` and
``load_state_dict``, and (for a tied embedding) whether the untied counterpart holding the tied
matrix computes the same function.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import ModelConfig
from ..model import build_model, canonical_state_dict, load_canonical_state_dict, parameter_of, unique_parameter_count
from ..registry import Registry, Variant
from .contracts import reference_key
from .inputs import describe_exception, fmt_size, padded_batch
from .pairs import max_abs_diff
from .policy import Tolerance, get_tolerance
from .runs import forward_backward, load_variant

@dataclass
class TieResult:
    """Tied canonical parameters of one variant and whether the ties survive ``.to`` and ``load_state_dict``."""

    variant: str
    groups: list[list[str]]
    params_unique: int
    params_per_use: int
    passed: bool
    detail: str = ""
    untied_logits: float | None = None
    untied_grad: float | None = None


def tie_groups(model: nn.Module) -> list[list[str]]:
    """Canonical names that share one parameter storage (each group sorted, length >= 2)."""
    by_storage: dict[tuple, list[str]] = {}
    for name, t in canonical_state_dict(model).items():
        if isinstance(t, nn.Parameter):
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
            by_storage.setdefault(key, []).append(name)
    return sorted(sorted(v) for v in by_storage.values() if len(v) > 1)


def check_ties(registry: Registry, variant: Variant, cfg: ModelConfig, state: dict[str, torch.Tensor], *,
               device: torch.device | str = "cpu", tol: Tolerance | None = None, seed: int = 0) -> TieResult:
    """Ties after construction, after ``.to(device, float64)`` and after ``load_state_dict`` into a
    fresh model; unique vs per-use parameter counts. For a tied embedding also: the same variant with an
    untied embedding component held to the slot's reference (:func:`_untied_embedding`) holding the
    tied matrix in all three uses computes the same logits, and the tied gradient equals the sum of the untied ones.
    """
    device = torch.device(device)
    tol = tol or get_tolerance("fp32", device.type)
    model, _ = load_variant(registry, variant, cfg, state)
    built = tie_groups(model)
    canon = canonical_state_dict(model)
    per_use = sum(t.numel() for t in canon.values() if parameter_of(t) is not None)
    unique = unique_parameter_count(model)
    problems = []
    moved = tie_groups(model.to(device=device, dtype=torch.float64))
    if moved != built:
        problems.append(f"ties changed after .to({device.type}, float64): {built} -> {moved}")
    model = model.to(device="cpu", dtype=torch.float32)
    fresh = build_model(registry, variant, cfg, seed + 1)
    try:
        fresh.load_state_dict(model.state_dict())
        loaded = tie_groups(fresh)
        if loaded != built:
            problems.append(f"ties changed after load_state_dict: {built} -> {loaded}")
        fresh_canon = canonical_state_dict(fresh)
        if any(not torch.equal(fresh_canon[k], v) for k, v in canonical_state_dict(model).items()):
            problems.append("load_state_dict did not restore every canonical parameter")
    except Exception as exc:  # noqa: BLE001
        problems.append(f"load_state_dict into a fresh model fails: {describe_exception(exc)}")
    res = TieResult(variant.name, built, unique, per_use, not problems, "; ".join(problems))
    untied = _untied_embedding(registry, variant, cfg, seed) if built else None
    if untied:
        try:
            _untied_counterpart(registry, variant, cfg, state, built, tol, res, untied)
        except Exception as exc:  # noqa: BLE001 - e.g. an embedding outside the canonical layout
            res.detail = "; ".join(filter(None, [res.detail, f"untied counterpart not compared: {describe_exception(exc)}"]))
    return res


def _untied_embedding(registry: Registry, variant: Variant, cfg: ModelConfig, seed: int) -> str | None:
    """An embedding component held to the slot's reference that ties nothing in ``variant`` (the untied
    counterpart of a tied embedding), or None."""
    own = variant.resolved()["embedding"]
    for (slot, name) in sorted(registry.components):
        if slot != "embedding" or name == own or reference_key(registry, slot, name) != "reference":
            continue
        try:
            if not tie_groups(build_model(registry, Variant("_untied", {**variant.slots, "embedding": name}), cfg, seed)):
                return name
        except Exception:  # noqa: BLE001 - not a usable counterpart
            continue
    return None


def _untied_counterpart(registry, variant, cfg, state, groups, tol, res: TieResult, embedding: str) -> None:
    untied_v = Variant(f"{variant.name}+{embedding}", {**variant.slots, "embedding": embedding})
    tied, _ = load_variant(registry, variant, cfg, state)
    untied, _ = load_variant(registry, untied_v, cfg, state)
    load_canonical_state_dict(untied, {k: v.detach().clone() for k, v in canonical_state_dict(tied).items()})
    src, tgt, labels = padded_batch(cfg)
    keep = tgt != cfg.pad
    cpu = torch.device("cpu")
    lt, gt = forward_backward(tied, src, tgt, labels, cpu, "fp32", cfg.pad)
    lu, gu = forward_backward(untied, src, tgt, labels, cpu, "fp32", cfg.pad)
    res.untied_logits = max_abs_diff(lt[keep].double(), lu[keep].double())
    res.untied_grad = max(max_abs_diff(gt[grp[0]].double(), sum(gu[n].double() for n in grp)) for grp in groups)
    # fp32 runs of two implementations; hold both to the table's absolute floor scaled by the fudge factor
    limit = tol.threshold(tol.atol)
    if res.untied_logits > limit or res.untied_grad > limit:
        res.passed = False
        res.detail = "; ".join(filter(None, [res.detail, (
            f"untied counterpart holding the tied matrix differs: logits {fmt_size(res.untied_logits)}, "
            f"tied grad vs sum of untied grads {fmt_size(res.untied_grad)} (limit {fmt_size(limit)})")]))


"""Contract of the ``architecture`` slot: an assembler (:class:`harness.slots.Architecture`) holds to what tasks,
decoding and scoring assume of any model, whatever its stacks (:mod:`harness.decoder_only`):

* ``forward(src (B, S), tgt (B, T))`` gives finite logits (B, T, V);
* the logits at target position t equal those of a forward whose target ends at t (no later target token
  reaches them: the prefix-only scoring of :func:`harness.tasks.base.prefix_logits` and greedy decoding rely on it);
* ``embed.logits(decode(encode(src, src_mask), src_mask, tgt, tgt_mask))`` equals ``forward`` (the interface that
  decoding, evaluation and trial groups call).

(Whether the source reaches the target is not a rule: at a degenerate width, d_model = 2 after a LayerNorm, no
model carries it; a model that drops it scores badly instead.)

Built with the slot's default component in every other slot (the registry's defaults), eval mode, float64 on
the check's padded batch.
"""
from __future__ import annotations

import torch

from ..config import ModelConfig
from ..model import build_model
from ..registry import Component, Registry, Variant
from .contract_base import CONFORMS, VIOLATES, ComponentResult, component_result, crash_result
from .inputs import fmt_size, padded_batch
from .policy import ARCHITECTURE_ATOL as ATOL

LABEL = "assembled model (forward, prefix = whole target, decode = forward)"


def _model(comp: Component, cfg: ModelConfig, seed: int):
    reg = Registry.from_plugins()
    reg.components[("architecture", comp.name)] = comp
    slots = {**reg.defaults, "architecture": comp.name}
    return build_model(reg, Variant("_architecture_check", slots), cfg, seed).double().eval()


def _fault(model, src: torch.Tensor, tgt: torch.Tensor, pad: int) -> tuple[str, float]:
    """The first broken rule in words and its size (``""``, worst gap when none)."""
    real = tgt != pad
    with torch.no_grad():
        whole = model(src, tgt)
        if tuple(whole.shape) != (*tgt.shape, model.cfg.vocab) or not bool(torch.isfinite(whole[real]).all()):
            return f"forward gave {tuple(whole.shape)} (finite: {bool(torch.isfinite(whole).all())}), not finite " \
                   f"(B, T, V) = {(*tgt.shape, model.cfg.vocab)}", float("inf")
        worst = 0.0
        for t in range(tgt.size(1)):
            rows = real[:, t]
            if not bool(rows.any()):
                continue
            gap = float((model(src, tgt[:, :t + 1])[:, t] - whole[:, t]).abs()[rows].max())
            worst = max(worst, gap)
            if gap > ATOL:
                return (f"the logits at target position {t} move by {fmt_size(gap)} when the target after it is cut: "
                        "a later target token reaches them (the model sees the future)"), gap
        style = model.mask_style
        memory = model.encode(src, style.src_mask(src, pad))
        via = model.embed.logits(model.decode(memory, style.src_mask(src, pad), tgt, style.tgt_mask(tgt, pad)))
        gap = float((via - whole).abs()[real].max())
        if gap > ATOL:
            return f"embed.logits(decode(encode(src), ...)) differs from forward by {fmt_size(gap)}", gap
    return "", worst


def check_architecture(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``architecture`` component vs the slot's contract (module docstring), at ``cfg`` with every other slot at
    its default. Returns one result: conforms, or violates with the broken rule named; a crash is a violation."""
    try:
        model = _model(comp, cfg, seed)
        src, tgt, _ = padded_batch(cfg, seed=seed)
        fault, size = _fault(model, src, tgt, cfg.pad)
    except Exception as exc:  # noqa: BLE001 - an assembler that raises fails its check
        return [crash_result(comp, LABEL, exc)]
    if fault:
        return [component_result(comp, LABEL, VIOLATES, False, max_abs=size, threshold=ATOL, diagnosis=fault)]
    return [component_result(comp, LABEL, CONFORMS, True, max_abs=size, threshold=ATOL)]

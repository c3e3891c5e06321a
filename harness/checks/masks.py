"""Mask components on their own, as a check-report section: the summary of each mask component's
contract results (:func:`harness.checks.contract_mask.check_mask`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from ..registry import Registry
from .contract_mask import check_mask


@dataclass
class MaskComponentResult:
    """A mask component on its own: does softmax(apply(scores, mask)) match the reference masked softmax?"""

    component: str
    buggy: bool
    padding_ok: bool
    causal_ok: bool
    max_error: float
    fully_masked_row: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.padding_ok and self.causal_ok


def probe_mask_component(registry: Registry, name: str, cfg: ModelConfig, batch=None, seed: int = 0) -> MaskComponentResult:
    """Mask component ``name`` on its own (:func:`harness.checks.contract_mask.check_mask`):
    softmax(apply(scores, mask))
    against the reference masked softmax at real query rows, finite rows, and what a fully masked row
    (a source of pad tokens only) gives. ``batch`` is accepted for compatibility; the contract check
    uses its own two padded batches."""
    comp = registry.component("mask", name)
    return mask_result(comp.name, comp.buggy, check_mask(comp, cfg, seed))


def mask_result(name: str, buggy: bool, results) -> MaskComponentResult:
    """A :class:`MaskComponentResult` from the mask component's contract results
    (:func:`harness.checks.contract_mask.check_mask`), without running them again."""
    res = {r.check.split(" ")[0]: r for r in results}
    padding, causal, finite, fully = res["padding"], res["causal"], res["finite"], res["fully"]
    reasons = [r.diagnosis or r.detail for r in (padding, causal, finite, fully) if not r.ok]
    got = fully.detail.split(",")[0].removeprefix("gives ").strip() if fully.detail else fully.verdict
    return MaskComponentResult(name, buggy, padding.ok and finite.ok and fully.ok, causal.ok,
                               max(x.max_abs or 0.0 for x in (padding, causal)), got, "; ".join(reasons))



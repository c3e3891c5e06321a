"""An undeclared bug, kept as an example of what the harness catches: a causal mask shifted by one.

``tril(diagonal=1)`` where ``tril()`` was meant: decoder position i also attends to position i+1,
the very token it is trained to predict. The component is *not* declared ``buggy``: it is what a
plugin author might ship by mistake. It trains to a much lower held-out cross-entropy than
``baseline`` (it reads the answer), so a harness that only looked at the numbers would rank it best.

What the harness does with it::

    python -m harness --plugin examples/undeclared-bug/shifted_mask.py check --variants shifted_causal_mask
        exit 1: "mask=shifted_causal [causal semantics ...]: causal mask shifted by +1: position i
        attends to position i+1 (1 future token)"
    python -m harness --plugin examples/undeclared-bug/shifted_mask.py run --variants baseline shifted_causal_mask --seeds 5
        exit 1; every shifted_causal_mask trial has status "invalid"; report.md opens with
        "Invalid variants"; no verdict, no P(A > B) for it.

The committed reference run is ``results/reference/invalid-variant/``.
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl


class ShiftedCausalMask:
    """Bool keep-masks like the Annotated Transformer's, with the causal part off by one.

    ``src_mask`` (B, 1, 1, S) = src != pad; ``tgt_mask`` (B, 1, T, T) = (tgt != pad) & tril(diagonal=1);
    ``apply`` fills blocked scores with -1e9.
    """

    def src_mask(self, src, pad):
        return (src != pad)[:, None, None, :]

    def tgt_mask(self, tgt, pad):
        t = tgt.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril(diagonal=1)  # the bug: 1, not 0
        return (tgt != pad)[:, None, None, :] & causal

    def apply(self, scores, mask):
        return scores.masked_fill(~mask, -1e9)


@hookimpl
def harness_add_components():
    return [Component("shifted_causal", "mask", lambda ctx: ShiftedCausalMask(),
                      "bool keep-mask, causal part tril(diagonal=1)", "example of an undeclared bug")]


@hookimpl
def harness_add_variants():
    return [Variant("shifted_causal_mask", {"mask": "shifted_causal"},
                    summary="baseline with a causal mask shifted by one (undeclared bug)",
                    source="examples/undeclared-bug/shifted_mask.py")]

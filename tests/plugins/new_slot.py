"""A plugin that adds a slot: ``activation``, the FFN's elementwise nonlinearity, in one declaration.

One ``Slot`` (``harness_add_slots``), its one component ``squared_relu`` (the slot's default: relu(x)^2,
Primer, So et al. 2021 §3), its contract check (named by the slot, ``check=...:check_activation``) and a
``feed_forward`` component ``act_ffn`` that asks the context for the new slot (``ctx.make("activation")``):
the assembler builds only the built-in slots, so a new slot reaches the model through the components
that use it. The variant ``primer_ffn`` (baseline with ``feed_forward=act_ffn``) trains like any other;
its trial records carry ``slot_activation``.

Loaded by path (``--plugin tests/plugins/new_slot.py``) or as the module ``tests.plugins.new_slot``.
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from harness import BuildContext, Component, Slot, Variant, hookimpl
from harness.checks.contract_base import CONFORMS, VIOLATES, ComponentResult
from harness.checks.policy import COMPONENT_ATOL, COMPONENT_RTOL

NAME = "primer_ffn"


class Activation(Protocol):
    """``activation``: a new ``nn.Module`` per call, elementwise: (..., d_ff) -> (..., d_ff); no parameters."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class SquaredReLU(nn.Module):
    """relu(x)^2, elementwise (So et al. 2021, "Primer", §3). Shape (...,) -> (...,)."""

    def forward(self, x):
        return torch.relu(x).square()


class ActFFN(nn.Module):
    """w_2(dropout(act(w_1 x))), ``act`` from the ``activation`` slot. Shape (B, L, D) -> (B, L, D)."""

    def __init__(self, ctx: BuildContext):
        super().__init__()
        self.w_1 = ctx.linear(ctx.cfg.d_model, ctx.cfg.d_ff)      # (d_ff, D)
        self.w_2 = ctx.linear(ctx.cfg.d_ff, ctx.cfg.d_model)      # (D, d_ff)
        self.act = ctx.make("activation")
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.act(self.w_1(x))))


def check_activation(comp: Component, cfg, seed: int = 0) -> list[ComponentResult]:
    """The ``activation`` slot's contract: elementwise relu(x)^2 on x (4, 7, d_ff), float64."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 7, cfg.d_ff, generator=g, dtype=torch.float64)
    got = comp.factory(None).double()(x)
    ref = torch.relu(x).square()
    gap = float((got - ref).abs().max())
    threshold = COMPONENT_ATOL + COMPONENT_RTOL * float(ref.abs().max())
    return [ComponentResult(comp.slot, comp.name, comp.plugin, comp.declaration(), "relu(x)^2",
                            CONFORMS if gap <= threshold else VIOLATES, gap <= threshold, gap, threshold)]


@hookimpl
def harness_add_slots():
    return [Slot("activation", "the FFN's elementwise nonlinearity (test plugin)", Activation,
                 reference="relu(x)^2 elementwise (So et al. 2021, Primer §3)",
                 check="tests.plugins.new_slot:check_activation")]


@hookimpl
def harness_add_components():
    return [Component("squared_relu", "activation", lambda ctx: SquaredReLU(), "relu(x)^2", "Primer (test plugin)",
                      default=True),
            Component("act_ffn", "feed_forward", ActFFN, "w_2(act(w_1 x)), act from the activation slot",
                      "test plugin", differs="the activation comes from the activation slot (squared ReLU)")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"feed_forward": "act_ffn"}, summary="baseline with a Primer FFN (new slot)",
                    source="test plugin")]

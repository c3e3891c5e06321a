"""Adversarial plugin for the harness, not for the checks: feed-forward networks that set their own start.

* ``own_init_ffn``: the paper's ReLU FFN whose ``init_weights(init)`` (docs/plugins.md) sets a start no
  scheme would draw: ``w_1.weight`` an evenly spaced ramp from -0.3 to 0.3, ``w_2.weight`` N(0, 0.5)
  from ``init.generator("w_2.weight")``, both biases 0.25. The harness must keep all of it whatever the
  variant's ``init`` scheme (tests/test_init.py fails when it overwrites them). It records where it was
  built (``where = (ctx.stack, ctx.layer, ctx.N)``).
* ``ctor_init_ffn``: the same start set in ``__init__`` only, with no ``init_weights``: the documented
  rule is that the scheme overwrites it (values set in a constructor do not survive).

Both compute the paper's FFN and declare nothing: ``check`` must pass them.
"""
from __future__ import annotations

import torch
from torch import nn

from harness import BuildContext, Component, Variant, hookimpl

NAME = "own_init_ffn"
CTOR = "ctor_init_ffn"
BIAS = 0.25


def ramp(shape: tuple[int, ...]) -> torch.Tensor:
    """The distinctive start of ``w_1.weight``: -0.3 .. 0.3 evenly spaced, row-major."""
    return torch.linspace(-0.3, 0.3, int(torch.tensor(shape).prod())).view(shape)


class OwnInitFFN(nn.Module):
    """w_2(dropout(relu(w_1 x))), (B, L, D) -> (B, L, D), with a start of its own."""

    def __init__(self, ctx: BuildContext):
        super().__init__()
        self.w_1 = ctx.linear(ctx.cfg.d_model, ctx.cfg.d_ff)
        self.w_2 = ctx.linear(ctx.cfg.d_ff, ctx.cfg.d_model)
        self.dropout = nn.Dropout(ctx.cfg.dropout)
        self.where = (ctx.stack, ctx.layer, ctx.N)

    def forward(self, x):
        return self.w_2(self.dropout(torch.relu(self.w_1(x))))

    def init_weights(self, init):
        self.w_1.weight.copy_(ramp(tuple(self.w_1.weight.shape)))
        nn.init.normal_(self.w_2.weight, 0.0, 0.5, generator=init.generator("w_2.weight"))
        for lin in (self.w_1, self.w_2):
            if lin.bias is not None:
                lin.bias.fill_(BIAS)


class CtorInitFFN(OwnInitFFN):
    """The same start, set in the constructor only (no ``init_weights``)."""

    init_weights = None  # not callable: the harness treats the module like any other

    def __init__(self, ctx: BuildContext):
        super().__init__(ctx)
        with torch.no_grad():
            self.w_1.weight.copy_(ramp(tuple(self.w_1.weight.shape)))


@hookimpl
def harness_add_components():
    return [Component(NAME, "feed_forward", OwnInitFFN, "ReLU FFN with a start of its own (init_weights)",
                      "test plugin"),
            Component(CTOR, "feed_forward", CtorInitFFN, "ReLU FFN setting a start in __init__ only", "test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"feed_forward": NAME}, summary="baseline with an FFN that initialises itself",
                    source="test plugin"),
            Variant(CTOR, {"feed_forward": CTOR}, summary="baseline with an FFN that sets its start in __init__",
                    source="test plugin")]

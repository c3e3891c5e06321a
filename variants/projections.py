"""Slot ``projections``: the linear layers of attention and the FFN, with or without bias.

* ``biased``: ``nn.Linear(d_in, d_out)`` (Vaswani et al. 2017; Annotated Transformer; notes 000, 004).
* ``bias_free``: ``nn.Linear(d_in, d_out, bias=False)`` -- happy-llm (note 002), d2l
  ``MultiHeadAttention(bias=False)`` (note 003) and note 001's W_q/W_k/W_v/W_o.
"""
from __future__ import annotations

from functools import partial

from torch import nn

from harness import Component, hookimpl


@hookimpl
def harness_add_components():
    return [
        Component("biased", "projections", lambda ctx: nn.Linear, "nn.Linear with bias",
                  "Vaswani et al. 2017; Annotated Transformer", default=True),
        Component("bias_free", "projections", lambda ctx: partial(nn.Linear, bias=False),
                  "nn.Linear(bias=False)", "happy-llm (note 002); d2l §10.5 (note 003); note 001"),
    ]

"""Adversarial plugin: an ``init`` scheme that draws from the global RNG instead of its generator.

``xavier_uniform_`` on every matrix and ``nn.Linear``'s bias rule, exactly the default's distributions, but
drawn with ``nn.init.xavier_uniform_(current)`` (no ``generator=``): the draws depend on everything the
global RNG gave before, i.e. on the order the modules were built and the tensors visited. Two variants that
share a canonical layout (annotated vs packed-QKV attention) then start from different weights, and the
paired seeds every verdict rests on are gone; the statistics of each tensor look right, so no scale check
sees it.

Expected: ``check --variants adv_init_global_rng`` exits 1: "drawn in another order with the global RNG
reseeded came out different: the scheme draws from the global RNG".
"""
from __future__ import annotations

import math

from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_init_global_rng"
EXPECT_CHECK = "fail"
EXPECT_REASON = "draws from the global RNG"


class GlobalRNGXavier:
    """The default's distributions, drawn from the global RNG (the fault)."""

    def init(self, site, current, generator):
        if len(site.shape) > 1:
            return nn.init.xavier_uniform_(current)
        if site.role == "bias" and site.weight is not None and len(site.weight.shape) == 2:
            bound = 1 / math.sqrt(site.weight.fan_in)
            return nn.init.uniform_(current, -bound, bound)
        return current


@hookimpl
def harness_add_components():
    return [Component(NAME, "init", lambda ctx: GlobalRNGXavier(), "xavier from the global RNG", "test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"init": NAME}, summary="baseline started from the global RNG", source="test plugin")]

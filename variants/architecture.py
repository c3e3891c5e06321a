"""Slot ``architecture``: how the stacks are assembled (:mod:`harness.decoder_only`).

* ``encoder_decoder`` (default) -- the paper's encoder over the source and decoder with cross-attention
  (Vaswani et al. 2017 §3.1; every study note).
* ``decoder_only`` -- one causal stack over source + start symbol + target, loss on the target tokens
  (GPT, Radford et al. 2018 §3.1; the "language model" of Raffel et al. 2020 §3.2.1).
* ``prefix_lm`` -- the same stack with full attention inside the source prefix (Raffel et al. 2020 §3.2.1;
  UniLM, Dong et al. 2019).
"""
from __future__ import annotations

from harness import Component, hookimpl
from harness.decoder_only import DecoderOnly, PrefixLM
from harness.model import EncoderDecoder


@hookimpl
def harness_add_components():
    return [
        Component("encoder_decoder", "architecture", lambda ctx: EncoderDecoder,
                  "encoder over the source, decoder with causal self-attention and cross-attention",
                  "Vaswani et al. 2017 §3.1", default=True),
        Component("decoder_only", "architecture", lambda ctx: DecoderOnly,
                  "one causal stack over [source, start, target]; loss on the target tokens",
                  "Radford et al. 2018 (GPT) §3.1; Raffel et al. 2020 §3.2.1",
                  differs="decoder-only: no encoder and no cross-attention; the source is a prefix of one causal "
                          "sequence (Raffel et al. 2020 §3.2.1)"),
        Component("prefix_lm", "architecture", lambda ctx: PrefixLM,
                  "one stack over [source, start, target]: full attention inside the source, causal after it",
                  "Raffel et al. 2020 §3.2.1; UniLM (Dong et al. 2019)",
                  differs="prefix LM: no encoder and no cross-attention; the source is attended bidirectionally "
                          "inside one sequence (Raffel et al. 2020 §3.2.1)"),
    ]

"""Decoder-only and prefix-LM assemblers: one stack over the source and the target packed into one sequence.

The ``architecture`` slot chooses the assembler (``variants/architecture.py``): ``encoder_decoder``
(:class:`harness.model.EncoderDecoder`, Vaswani et al. 2017), ``decoder_only`` (:class:`DecoderOnly`: a GPT,
Radford et al. 2018/2019, trained as a conditional language model over source + target) or ``prefix_lm``
(:class:`PrefixLM`: full attention inside the source prefix, causal after it; Raffel et al. 2020 §3.2.1,
UniLM, Dong et al. 2019). All three take the same batches and expose the same methods, so every task, metric,
decoding routine (greedy, beam), prefix-only evaluation and trial group runs them unchanged:

* ``forward(src (B, S), tgt (B, T)) -> logits (B, T, V)`` at the target positions only;
* ``encode(src, src_mask) -> memory`` and ``decode(memory, src_mask, tgt, tgt_mask) -> (B, T, D)``;
* ``embed`` (``embed.logits``), ``mask_style``, ``cfg``.

Packing. Row b's source holds ``n_b`` tokens before its padding (``n_b`` = 1 + the last non-pad index); the
stack's input is ``src[b, :n_b]`` then ``tgt[b]`` then pads, length S + T::

    [s_1 ... s_n, <start>, y_1, ..., y_{T-1}, pad ...]

The target's start symbol is the separator; the logits at target position t are the stack's output at
packed position ``n_b + t``, so the labels, the loss (target tokens only) and every score keep their meaning.
Source tokens are embedded by ``embed.src`` and target tokens by ``embed.tgt``: with ``embedding=shared`` one
matrix embeds both and is the generator, as GPT-2 ties ``wte`` and ``lm_head``. One positional module
(``tgt_pos``) numbers the packed sequence 0 .. S + T - 1, so the model's positional tables hold
2 x ``model.max_len`` positions (a source and a target of up to ``max_len`` each): a learned table has as many
parameters as the encoder-decoder's two. The stack has ``model.lm_layers`` layers (0: N; the model's ``cfg``
holds the stack's N and context): N + N encoder-decoder layers and an N-layer stack do about the same work per
token, 2N layers have about the same parameters (Raffel et al. 2020 §3.2.2).

No encoder: ``encode`` returns the source ids as floats (B, S, 1) (not learned, exact below 2^24), so callers
that keep, select and stack the memory by rows (greedy and beam decoding, trial groups) carry the source to
``decode``. Masks are made inside ``decode`` from the packed ids by the ``mask`` component, so its bugs (the
study notes' discarded ``masked_fill``, uint8 inversion) act here as in the encoder-decoder; the masks the
caller passes are not used. ``decoder_only``: ``mask_style.tgt_mask(packed, pad)`` (causal + padding over the
whole sequence). ``prefix_lm``: ``mask_style.prefix_mask(packed, pad, n)`` with ``n`` (B,) the prefix lengths:
query i sees key j when j is not padding and (j < n_b or j <= i); a mask component without ``prefix_mask``
cannot build a prefix LM (:class:`harness.errors.PluginError`, naming it).

Layers: each is the encoder's layer (:class:`harness.model.EncoderLayer`: self-attention then feed-forward, each
wrapped by the ``norm`` block), built in the stack ``"decoder"`` with ``ctx.architecture`` naming the assembler,
so canonical names read ``decoder.layers.i.self_attn.w_q.weight`` and a component written for the
encoder-decoder builds unchanged.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from .errors import PluginError
from .model import DECODER_ONLY, PREFIX_LM, BuildContext, EncoderLayer, PositionHooks, Stack
from .registry import Variant


def source_lengths(src: torch.Tensor, pad: int) -> torch.Tensor:
    """(B,) long: 1 + the index of each row's last non-pad token (0 for an all-pad row). Shape: src (B, S)."""
    positions = torch.arange(1, src.size(-1) + 1, device=src.device)
    return torch.where(src != pad, positions, 0).amax(dim=-1)


def target_index(n: torch.Tensor, t: int) -> torch.Tensor:
    """(B, T) long: the packed positions of the target's tokens, ``n_b + 0 .. n_b + T - 1``."""
    return n[:, None] + torch.arange(t, device=n.device)


def pack(src: torch.Tensor, tgt: torch.Tensor, x_src: torch.Tensor, x_tgt: torch.Tensor, pad: int):
    """Source and target packed into one sequence (module docstring).

    Shape:
        src (B, S), tgt (B, T) ids; x_src (B, S, D), x_tgt (B, T, D) their embeddings ->
        ``(ids (B, S + T), x (B, S + T, D), n (B,), index (B, T))``.
    """
    n = source_lengths(src, pad)
    index = target_index(n, tgt.size(1))
    ids = torch.cat([src, src.new_full(tgt.shape, pad)], dim=1).scatter(1, index, tgt)
    x = torch.cat([x_src, x_src.new_zeros(x_tgt.shape)], dim=1)
    x = x.scatter(1, index[..., None].expand(-1, -1, x.size(-1)), x_tgt.to(x.dtype))
    return ids, x, n, index


class DecoderOnly(nn.Module):
    """One causal stack over source + target (module docstring): ``forward(src (B, S), tgt (B, T)) -> (B, T, V)``.

    Source: Radford et al. 2018 (GPT) §3.1 and 2019 (GPT-2) §2.3; the decoder-only "language model" of Raffel et
    al. 2020 §3.2.1 trained on the target given the source as a prefix (loss on target tokens only).

    Raises (at build):
        PluginError: (:class:`PrefixLM`) the mask component has no ``prefix_mask``.
    """

    architecture = DECODER_ONLY

    def __init__(self, ctx: BuildContext, variant: Variant):
        super().__init__()
        ctx.cfg = replace(ctx.cfg, max_len=2 * ctx.cfg.max_len, N=ctx.cfg.lm_layers or ctx.cfg.N)
        ctx.architecture = self.architecture
        self.cfg = ctx.cfg
        self.variant_name = variant.name
        self.slots = {slot: comp.name for slot, comp in ctx.components.items()}
        self.mask_style = ctx.mask
        self._check_mask(ctx)
        self.embed = ctx.make("embedding")
        self.tgt_pos = ctx.make("positional")
        self.position_hooks = (PositionHooks(self.tgt_pos, ctx.cfg.h),)
        ctx.self_positions = self.position_hooks[0]
        self.decoder = Stack(ctx, EncoderLayer, "decoder")
        ctx.self_positions = None

    def _check_mask(self, ctx: BuildContext) -> None:
        """Nothing to check for a causal stack (every mask component has ``tgt_mask``)."""

    def sequence_mask(self, ids: torch.Tensor, n: torch.Tensor):
        """The stack's mask for packed ``ids`` (B, L) in the mask component's convention: causal + padding."""
        return self.mask_style.tgt_mask(ids, self.cfg.pad)

    def encode(self, src: torch.Tensor, src_mask=None) -> torch.Tensor:
        """No encoder: the source ids as floats, (B, S) -> (B, S, 1), carried to :meth:`decode`."""
        return src.to(torch.float32)[..., None]

    def run(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """The stack's output at the target positions. Shape: src (B, S), tgt (B, T) -> (B, T, D)."""
        ids, x, n, index = pack(src, tgt, self.embed.src(src), self.embed.tgt(tgt), self.cfg.pad)
        h = self.decoder(self.tgt_pos(x), self.sequence_mask(ids, n))  # (B, S + T, D)
        return h.gather(1, index[..., None].expand(-1, -1, h.size(-1)))

    def decode(self, memory: torch.Tensor, src_mask, tgt: torch.Tensor, tgt_mask=None) -> torch.Tensor:
        """``memory`` from :meth:`encode` (B, S, 1), tgt (B, T) -> states at the target positions (B, T, D);
        the masks passed are not used (made from the packed ids)."""
        return self.run(memory[..., 0].round().long(), tgt)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask=None, tgt_mask=None) -> torch.Tensor:
        return self.embed.logits(self.run(src, tgt))


class PrefixLM(DecoderOnly):
    """:class:`DecoderOnly` with full (bidirectional) attention inside the source prefix and causal attention
    after it: query i sees key j when j is not padding and (j < n_b or j <= i), so a source position never sees
    a target position. Source: Raffel et al. 2020 §3.2.1 (prefix LM, Fig. 3 right); Dong et al. 2019 (UniLM)."""

    architecture = PREFIX_LM

    def _check_mask(self, ctx: BuildContext) -> None:
        if not callable(getattr(self.mask_style, "prefix_mask", None)):
            comp = ctx.components["mask"]
            raise PluginError(f"mask component {comp.name!r} (plugin {comp.plugin or '?'}) has no "
                              "prefix_mask(ids, pad, prefix): a prefix LM needs one (docs/plugins.md, "
                              "\"Masks for a prefix LM\")")

    def sequence_mask(self, ids: torch.Tensor, n: torch.Tensor):
        return self.mask_style.prefix_mask(ids, self.cfg.pad, n)


def prefix_keep(ids: torch.Tensor, pad: int, prefix: torch.Tensor) -> torch.Tensor:
    """The prefix LM's keep-mask (B, 1, L, L) bool: key j not padding and (j < prefix_b or j <= i).

    Shape: ids (B, L), prefix (B,) -> (B, 1, L, L). Source: Raffel et al. 2020 §3.2.1, Fig. 3."""
    length = ids.size(-1)
    i = torch.arange(length, device=ids.device)[:, None]
    j = torch.arange(length, device=ids.device)[None, :]
    visible = (j <= i) | (j < prefix[:, None, None])  # (B, L, L)
    return ((ids != pad)[:, None, :] & visible)[:, None]

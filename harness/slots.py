"""Slots, each declared once: what it decides, its protocol, its reference, its check, its table column.

A *slot* is one axis of choice (README, "What it does"). Every table about slots derives from the
:class:`Slot` records of :data:`BUILTIN` (and of plugins, through ``harness_add_slots``):
:data:`harness.registry.SLOT_DOCS`, :func:`main_slots` (the slots the single-change variants and
``--grid`` vary, the trial table's slot columns), :data:`harness.checks.contract_base.SLOT_REFERENCES`
and the contract check each slot gets (:func:`harness.checks.contracts.slot_check`). The protocol
classes below are the whole of what a component's ``factory(ctx)`` must return; ``ctx`` is a
:class:`harness.BuildContext` (docs/plugins.md).

Shape letters: B batch, S source length, T target length, L either, D = d_model, H = h heads,
d_k = D / H, V vocabulary.

This module imports no torch (the registry imports it; ``import harness`` stays fast): tensor types
appear in annotations only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

if TYPE_CHECKING:
    from torch import Tensor, nn


class NormBlock(Protocol):
    """``norm``: a new ``nn.Module`` per call wrapping one sub-layer with its residual connection.

    ``forward(x (B, L, D), sublayer) -> (B, L, D)``, ``sublayer`` a callable (B, L, D) -> (B, L, D).
    Class attribute ``final_norm: bool``: True when the encoder and decoder end with a LayerNorm
    (as pre-norm needs). It owns one LayerNorm child named ``norm`` made with ``ctx.layer_norm()``,
    unless its registration declares ``has_layer_norm=False`` (ReZero's ``x + alpha * sublayer(x)``):
    then it makes none and ``final_norm`` is optional (default False). A class attribute
    ``parallel = True`` declares a parallel block (GPT-J; PaLM §2): the layer makes one such module
    and calls ``forward(x, sublayers)`` once with the list of all its sub-layers (encoder:
    self-attention, FFN; decoder: self-attention, cross-attention, FFN).
    """

    final_norm: bool

    def __call__(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor: ...


class LayerNormModule(Protocol):
    """``layer_norm``: a new ``nn.Module`` per call normalising the last dimension, (..., D) -> (..., D).

    Canonical parameters ``weight`` (D,) and ``bias`` (D,).
    """

    def __call__(self, x: Tensor) -> Tensor: ...


class Projections(Protocol):
    """``projections``: one callable ``linear(d_in, d_out) -> nn.Linear``-like module (``weight``
    (d_out, d_in), optional ``bias`` (d_out,)), used by attention and the FFN through ``ctx.linear``."""

    def __call__(self, d_in: int, d_out: int) -> nn.Module: ...


class Positional(Protocol):
    """``positional``: a new ``nn.Module`` per call (one for the source, one for the target).

    ``forward(x (B, L, D)) -> (B, L, D)``: raw token embeddings to the encoder/decoder input.
    Positions that act inside self-attention are optional methods of the same module:
    ``rotate_qk(q (..., Lq, d_k), k (..., Lk, d_k)) -> (q, k)`` (RoPE),
    ``score_bias(tq, tk, device, dtype) -> (H, Tq, Tk)`` added to the scaled scores (ALiBi), and
    ``qk_order(d_k) -> LongTensor (d_k,)`` (the canonical feature each of its own features is, for a
    rotation written in another layout). Attention reaches them through ``ctx.positions``
    (:class:`harness.model.PositionHooks`), never the module itself.
    """

    def __call__(self, x: Tensor) -> Tensor: ...


class FeedForward(Protocol):
    """``feed_forward``: a new ``nn.Module`` per call, (B, L, D) -> (B, L, D), its projections made
    with ``ctx.linear``. Canonical parameters ``w_1`` (d_ff, D) and ``w_2`` (D, d_ff) (ReLU, GELU);
    a gated one ``w_gate``, ``w_up`` (inner, D) and ``w_down`` (D, inner), each ``.weight`` and
    ``.bias`` when ``ctx.linear`` gives biases."""

    def __call__(self, x: Tensor) -> Tensor: ...


class Embedding(Protocol):
    """``embedding``: one ``nn.Module`` per model: raw lookups and the generator.

    Canonical parameters ``src.weight``, ``tgt.weight``, ``generator.weight`` (V, D) and
    ``generator.bias`` (V,); a tied embedding exports its one matrix under all three names.
    """

    def src(self, ids: Tensor) -> Tensor:
        """ids (B, S) -> (B, S, D)."""

    def tgt(self, ids: Tensor) -> Tensor:
        """ids (B, T) -> (B, T, D)."""

    def logits(self, x: Tensor) -> Tensor:
        """x (B, T, D) -> (B, T, V)."""


class Attention(Protocol):
    """``attention``: a new ``nn.Module`` per call (``ctx.attention(cross=...)``).

    ``forward(query (B, Tq, D), key (B, Tk, D), value (B, Tk, D), mask) -> (B, Tq, D)``; the mask is
    whatever the mask component made and is applied with ``ctx.mask.apply`` before the softmax;
    positions with ``ctx.positions.rotate(q, k)`` on the split heads and ``ctx.positions.bias(scores)``
    on the scaled scores (no-ops unless the positional component acts inside attention;
    cross-attention always gets the no-op). Canonical parameters ``w_q``, ``w_k``, ``w_v``, ``w_o``
    (``.weight`` (D, D), ``.bias`` (D,)); grouped-query: ``w_k``, ``w_v`` of (n_kv d_k, D).
    """

    def __call__(self, query: Tensor, key: Tensor, value: Tensor, mask: Any) -> Tensor: ...


class MaskStyle(Protocol):
    """``mask``: one object per model (no parameters) that makes masks and applies them to scores.

    Its convention (keep=True or block=True, 0/-inf additive, lengths) is its own, stated in its
    docstring; the masks must broadcast against scores (B, H, Tq, Tk).
    """

    def src_mask(self, src: Tensor, pad: int) -> Any:
        """src (B, S) token ids -> the source mask."""

    def tgt_mask(self, tgt: Tensor, pad: int) -> Any:
        """tgt (B, T) token ids -> the causal + padding target mask."""

    def apply(self, scores: Tensor, mask: Any) -> Tensor:
        """scores (..., Tq, Tk) -> masked scores of the same shape."""


class InitScheme(Protocol):
    """``init``: one object per model (``factory(ctx)``, ``ctx.cfg`` giving N, D, d_ff ...) that draws the
    initial value of every canonical tensor, after the model is built.

    ``init(site, current, generator) -> Tensor``: ``site`` a :class:`harness.init_schemes.TensorSite` (canonical
    name, shape, role such as ``attn_out`` or ``embedding``, stack ``encoder`` / ``decoder``, layer index);
    ``current`` the value the module made, a float32 CPU copy of shape ``site.shape`` (fill it in place, or
    return a new tensor; return it unchanged to keep the module's value: only for values a module makes
    the same way every time, such as LayerNorm's 1 and 0, never a matrix or bias it drew); ``generator`` a
    ``torch.Generator`` seeded from (seed, canonical name) alone. Returns a tensor of ``site.shape``. Draw
    with ``generator`` only, never the global RNG and never state kept between calls: then variants that
    share the scheme and a canonical layout start equal (paired seeds). The canonical tensors of a module that defines
    ``init_weights(init)`` are not offered: that module initialises itself (docs/plugins.md).
    """

    def init(self, site: Any, current: Tensor, generator: Any) -> Tensor: ...


class Architecture(Protocol):
    """``architecture``: the assembler, a callable ``(ctx, variant) -> nn.Module`` (usually the class itself)
    that builds every other slot's products into a model with ``forward(src (B, S), tgt (B, T)) -> logits
    (B, T, V)``, ``encode(src, src_mask) -> memory``, ``decode(memory, src_mask, tgt, tgt_mask) -> (B, T, D)``,
    ``embed``, ``mask_style`` and ``cfg`` (what tasks, decoding and checks call). It sets ``ctx.architecture``
    and ``ctx.stack`` / ``ctx.layer`` while it builds. Built-ins: :class:`harness.model.EncoderDecoder`,
    :class:`harness.decoder_only.DecoderOnly`, :class:`harness.decoder_only.PrefixLM`.
    """

    def __call__(self, ctx: Any, variant: Any) -> nn.Module: ...


@dataclass(frozen=True)
class Slot:
    """One axis of choice, declared once.

    Args:
        name: the slot's name (``"norm"``, ``"attention"`` ...): what ``Component.slot`` and a
            variant's ``slots`` keys name.
        decides: one line: what the slot decides (``list`` prints it).
        protocol: the typed class (a ``typing.Protocol``) of what a component's ``factory(ctx)``
            returns; its docstring gives the tensor shapes and canonical parameters.
        reference: what every component of the slot computes unless it declares otherwise, with its
            source (paper section, d2l section, study note); ``check`` holds components to it.
        check: the name of the contract check that holds a component to ``reference``: a function
            of :data:`harness.checks.contracts.CHECKS` (``"check_attention"``) or, for a plugin's
            slot, ``"package.module:function"`` (called as ``function(component, cfg, seed) ->
            list[ComponentResult]``). Empty: ``check`` holds the slot's components to nothing on
            their own (they are still inside every model-level check of the variants using them).
        main: a main slot: varied by ``--grid`` (and by the built-in single-change variants); the built-in
            main slots' columns are the trial tables' slot columns when a run varies no slot
            (:data:`harness.report.frames.SLOT_COLS`). Every slot is a column ``slot_<name>`` of the trial
            records, and the tables show each slot that the run's variants vary.
        plugin: the plugin that declared it (set by the registry).

    Raises (when registered, :class:`harness.registry.Registry`):
        PluginError: an empty or non-identifier name, or a protocol that is not a class.
        DuplicateNameError: a name declared twice (naming both plugins).
    """

    name: str
    decides: str
    protocol: type
    reference: str = ""
    check: str = ""
    main: bool = False
    plugin: str = field(default="", compare=False)

    @property
    def column(self) -> str:
        """The slot's column in trial records and tables (``slot_<name>``)."""
        return f"slot_{self.name}"


#: The built-in slots, in the order ``list`` and reports show them.
BUILTIN: tuple[Slot, ...] = (
    Slot("norm", "where LayerNorm sits around each sub-layer (post-norm / pre-norm), or none "
                 "(has_layer_norm=False), or one for all of a layer's sub-layers, summed (parallel = True)",
         NormBlock,
         "final_norm = False: post-norm LayerNorm(x + sublayer(x)); final_norm = True: pre-norm "
         "x + sublayer(LayerNorm(x)) and a final LayerNorm after each stack (Xiong et al. 2020); declared "
         "has_layer_norm=False: x + a * sublayer(x), a fixed gain that gradients reach at initialisation, "
         "no LayerNorm (ReZero, Bachlechner et al. 2021); class attribute parallel = True: the formula "
         "parallel_block, x + sum_i sublayer_i(LayerNorm(x)) (GPT-J; PaLM §2)",
         check="check_norm", main=True),
    Slot("embedding", "source/target embeddings and generator: separate or one shared matrix", Embedding,
         "src(ids) = src.weight[ids] and tgt(ids) = tgt.weight[ids], one lookup per token and nothing "
         "else; logits(x) = x generator.weight^T + generator.bias (Vaswani et al. 2017 §3.4)",
         check="check_embedding", main=True),
    Slot("attention", "how multi-head attention is written (heads split, matmul vs bmm, SDPA)", Attention,
         "scaled dot-product multi-head attention: nn.MultiheadAttention with in_proj_weight = "
         "[w_q; w_k; w_v] and out_proj = w_o, softmax(Q K^T / sqrt(d_k)) over the keys, masks applied "
         "with ctx.mask.apply before the softmax (Vaswani et al. 2017 §3.2)",
         check="check_attention", main=True),
    Slot("mask", "how masks are made and applied to attention scores (bool keep-mask / additive)", MaskStyle,
         "causal: query position i attends to key positions j <= i, itself included, never j > i; padding: no "
         "real query attends to a padded key; every row of a real batch finite; a row whose every key is "
         "blocked as declared by fully_masked_row",
         check="check_mask", main=True),
    Slot("layer_norm", "the LayerNorm formula (nn.LayerNorm / the notes' unbiased std + eps)", LayerNormModule,
         "nn.LayerNorm(d_model): (x - mean) / sqrt(biased variance + eps) * weight + bias over the last "
         "dimension (Ba et al. 2016)",
         check="check_layer_norm"),
    Slot("positional", "positions: added to the embeddings (sinusoidal, learned), rotating q and k (RoPE) or "
                       "biasing the scores (ALiBi) inside self-attention; and the embedding scale",
         Positional,
         "x * sqrt(d_model) + PE[:L] with the sinusoidal PE of Vaswani et al. 2017 §3.5, dropout after; "
         "nothing inside attention (a component that rotates q and k or biases the scores declares it "
         "and names its formula: reference=\"rotary\" / \"linear_biases\", harness.checks.formulas.FORMULAS)",
         check="check_positional"),
    Slot("projections", "whether attention and FFN projections carry a bias", Projections,
         "linear(d_in, d_out) returns an nn.Linear-like module: y = x weight^T (+ bias), weight (d_out, d_in)",
         check="check_projections"),
    Slot("feed_forward", "the position-wise feed-forward network (ReLU / GELU / gated SwiGLU, GEGLU)", FeedForward,
         "FFN(x) = w_2(relu(w_1 x + b_1)) + b_2 with ctx.linear projections, inner width d_ff, dropout "
         "after the activation (Vaswani et al. 2017 §3.3)",
         check="check_feed_forward"),
    Slot("init", "how the weights start: the scheme drawing every canonical tensor (the Annotated Transformer's "
                 "xavier_uniform, PyTorch's defaults, nn.Transformer's reset, GPT-2's scaled residual projections, "
                 "small init, T-Fixup, DeepNet)",
         InitScheme,
         "each canonical tensor drawn from (seed, canonical name) alone: the same values in any order and whatever "
         "the global RNG holds, a finite tensor of the tensor's shape, and a start that changes with the seed, so "
         "variants sharing a scheme and a canonical layout start equal (paired seeds); the default is the "
         "Annotated Transformer's xavier_uniform on every matrix with nn.Linear's bias rule",
         check="check_init"),
    Slot("architecture", "how the stacks are assembled: encoder-decoder, decoder-only (one causal stack over source + "
                         "target) or prefix LM (full attention inside the source, causal after it)",
         Architecture,
         "encoder_decoder: an encoder over the source and a decoder with causal self-attention and cross-attention "
         "(Vaswani et al. 2017 §3.1); decoder_only: one stack over [source, start, target] whose query i sees keys "
         "j <= i (Radford et al. 2018; Raffel et al. 2020 §3.2.1); prefix_lm: the same stack whose query i also "
         "sees every source key and no source query sees a target key (Raffel et al. 2020 §3.2.1; UniLM); in all "
         "three the logits at a target position depend on no later target token",
         check="check_architecture"),
)


def builtin_slot(name: str) -> Slot | None:
    """The built-in :class:`Slot` called ``name``, or None."""
    return next((s for s in BUILTIN if s.name == name), None)


def main_slots(slots: Iterable[Slot] = BUILTIN) -> tuple[str, ...]:
    """The names of the main slots among ``slots`` (default: the built-ins), in order:
    ``("norm", "embedding", "attention", "mask")`` for the built-ins."""
    return tuple(s.name for s in slots if s.main)


def slot_columns(slots: Iterable[Slot] = BUILTIN) -> list[str]:
    """The trial-table columns of the main slots among ``slots`` (``slot_norm``, ...)."""
    return [s.column for s in slots if s.main]

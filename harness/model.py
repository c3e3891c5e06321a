"""The encoder-decoder assembler and what every assembler shares: the build context, layers, canonical
parameters and initialisation (decoder-only and prefix-LM assemblers: :mod:`harness.decoder_only`).

Shape letters used throughout: B batch, S source length, T target length, D = d_model,
H = h heads, d_k = D / H, V vocabulary.

Slot protocols (what a component's ``factory(ctx)`` must return, with shapes and canonical
parameters) are declared once, with each slot, in :mod:`harness.slots` (``Slot.protocol``:
``NormBlock``, ``Embedding``, ``Attention``, ``MaskStyle``, ``LayerNormModule``, ``Positional``,
``Projections``, ``FeedForward``, ``InitScheme``). The assembler builds the built-in slots; a plugin's slot is
made by the components that ask for it (``ctx.make(name)``, :class:`BuildContext`). A component learns where it
sits from the context (``ctx.stack``, ``ctx.layer``, ``ctx.N``).

Canonical parameters: a module that stores parameters in its own layout defines
``canonical_state() -> dict`` and ``load_canonical_state(dict) -> list[str]`` (notes on
anything it could not represent); every other module's own parameters are canonical as
they are. :func:`canonical_state_dict` and :func:`load_canonical_state_dict` walk the
model with these, so two variants that share a layout can exchange weights exactly.

Initialisation (:func:`canonical_init`): the ``init`` slot's scheme draws every canonical tensor from
(seed, canonical name) alone (:mod:`harness.init_schemes`); a module that defines ``init_weights(init)``
initialises its own canonical tensors instead, and the harness keeps what it sets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .config import ModelConfig
from .errors import UnknownNameError
from .init_schemes import DEFAULT_SCHEME, OwnInit, draw, tensor_generator, tensor_sites
from .registry import Component, Registry, Variant


#: What a model's (and a build context's) ``architecture`` says: the assembler that built it (the ``architecture``
#: slot's components build these; :mod:`harness.decoder_only`).
ENCODER_DECODER, DECODER_ONLY, PREFIX_LM = "encoder-decoder", "decoder-only", "prefix LM"


class PositionHooks:
    """What an attention module asks of positions (``ctx.positions``): ``rotate(q, k)`` and ``bias(scores)``.

    Wraps a positional module without registering it (the model owns it as ``src_pos`` /
    ``tgt_pos``); a module without ``rotate_qk`` / ``score_bias`` makes both no-ops, so one attention
    component works with every positional component (sinusoidal, learned, RoPE, ALiBi).

    ``calls`` counts the calls that reached an in-attention method (the variant contract uses it:
    an attention that never asks leaves RoPE or ALiBi out of the model).
    """

    def __init__(self, module=None, h: int = 1):
        self._module = module
        self.h = h
        self.calls = 0

    @property
    def acts(self) -> bool:
        """True when the wrapped module rotates q and k or biases the scores."""
        return hasattr(self._module, "rotate_qk") or hasattr(self._module, "score_bias")

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q (..., Lq, d_k), k (..., Lk, d_k) of one head each (any leading dims) -> rotated (q, k).

        Positions are 0..L-1 along dim -2. With ``qk_order`` the features are first put in the
        component's own layout (the scores q . k do not depend on the order afterwards)."""
        rotate = getattr(self._module, "rotate_qk", None)
        if rotate is None:
            return q, k
        self.calls += 1
        order_fn = getattr(self._module, "qk_order", None)
        if order_fn is not None:
            order = order_fn(q.size(-1)).to(q.device)
            q, k = q[..., order], k[..., order]
        return rotate(q, k)

    def bias(self, scores: torch.Tensor) -> torch.Tensor:
        """scores (B, H or 1, Tq, Tk), or heads folded batch-major (B*H, Tq, Tk) -> scores + bias."""
        score_bias = getattr(self._module, "score_bias", None)
        if score_bias is None:
            return scores
        self.calls += 1
        tq, tk = scores.shape[-2:]
        b = score_bias(tq, tk, scores.device, scores.dtype)  # (H, Tq, Tk)
        if scores.dim() == 3:  # (B*H, Tq, Tk), index = b*H + head
            return (scores.view(-1, self.h, tq, tk) + b).view(scores.shape)
        return scores + b


#: The positions of a cross-attention module, and of a component checked on its own: none.
NO_POSITIONS = PositionHooks()


@dataclass
class BuildContext:
    """What a component's factory receives: the config and its sibling slots' products (public:
    ``from harness import BuildContext``; docs/plugins.md).

    Components never import each other; they ask the context for what they need.

    Attributes:
        cfg: the :class:`harness.config.ModelConfig`: ``d_model`` (D), ``h`` (H, d_k = D / H), ``d_ff``,
            ``N``, ``dropout``, ``vocab`` (V), ``pad``, ``max_len``, ``n_kv_heads``.
        components: slot -> the variant's :class:`harness.registry.Component` for it (every slot of the
            registry, a plugin's slots included).
        mask: the variant's mask object (one per model, shared; :class:`harness.slots.MaskStyle`).
        positions: the :class:`PositionHooks` of the attention module being built: ``rotate(q, k)`` on
            split heads (..., L, d_k), ``bias(scores)`` on scaled scores (B, H or 1, Tq, Tk).
        linear(d_in, d_out): a projection from the ``projections`` slot: weight (d_out, d_in).
        layer_norm(): a new LayerNorm over D from the ``layer_norm`` slot.
        attention(cross=False): a new attention module; ``cross=True`` for cross-attention (no positions).
        make(slot): a new product of ``slot``'s component, e.g. ``ctx.make("feed_forward")`` or a plugin
            slot's ``ctx.make("activation")``.
        stack: where the module being built sits: ``"encoder"`` or ``"decoder"`` inside a stack (its layers and
            its final LayerNorm), ``""`` outside (embeddings, positions, the ``init`` scheme). A component checked
            on its own is built as the encoder's layer 0.
        layer: the index (0 .. N - 1) of the layer being built in its stack; None outside a layer.
        N: the number of layers in each stack (``cfg.N``; the encoder and the decoder have N each).
        architecture: the assembler: :data:`ENCODER_DECODER`, or :data:`DECODER_ONLY` / :data:`PREFIX_LM` (one stack,
            named ``"decoder"``, of self-attention + feed-forward layers; :mod:`harness.decoder_only`).

    Example::

        def factory(ctx: BuildContext) -> nn.Module:   # a feed_forward component
            return nn.Sequential(ctx.linear(ctx.cfg.d_model, ctx.cfg.d_ff), nn.ReLU(),
                                 ctx.linear(ctx.cfg.d_ff, ctx.cfg.d_model))   # (B, L, D) -> (B, L, D)
    """

    cfg: ModelConfig
    components: dict[str, Component]
    _cache: dict[str, Any] = field(default_factory=dict)
    #: the positions the self-attention modules being built get (set by the assembler per stack)
    self_positions: PositionHooks | None = None
    _cross: bool = False
    stack: str = ""
    layer: int | None = None
    #: the assembler being built (the ``architecture`` slot): :data:`ENCODER_DECODER`, :data:`DECODER_ONLY` or
    #: :data:`PREFIX_LM` (set by the assembler before it builds anything; :mod:`harness.decoder_only`)
    architecture: str = ENCODER_DECODER

    @property
    def N(self) -> int:  # noqa: N802 - the paper's symbol
        """Layers per stack (``cfg.N``): the encoder's N and the decoder's M are equal here."""
        return self.cfg.N

    def make(self, slot: str) -> Any:
        """Call the slot's component factory and return a new product.

        Raises:
            UnknownNameError: no component for ``slot`` in this build (a slot no plugin declared).
        """
        if slot not in self.components:
            raise UnknownNameError("slot", slot, self.components, "ctx.make(): slots of this build")
        return self.components[slot].factory(self)

    def _shared(self, slot: str) -> Any:
        if slot not in self._cache:
            self._cache[slot] = self.make(slot)
        return self._cache[slot]

    @property
    def mask(self):
        """The mask style (one object shared by all attention modules)."""
        return self._shared("mask")

    @property
    def positions(self) -> PositionHooks:
        """What the attention module being built applies inside attention (:class:`PositionHooks`):
        its stack's positional module for self-attention, nothing for cross-attention (queries and
        keys come from different sequences; RoPE and ALiBi are defined within one sequence)."""
        if self._cross or self.self_positions is None:
            return NO_POSITIONS
        return self.self_positions

    def attention(self, cross: bool = False) -> Any:
        """A new attention module; ``cross=True`` for the decoder's attention over the memory."""
        old, self._cross = self._cross, cross
        try:
            return self.make("attention")
        finally:
            self._cross = old

    def linear(self, d_in: int, d_out: int) -> nn.Linear:
        """A projection from the ``projections`` slot (with or without bias)."""
        return self._shared("projections")(d_in, d_out)

    def layer_norm(self) -> nn.Module:
        """A new LayerNorm over D from the ``layer_norm`` slot."""
        return self.make("layer_norm")


def residual_blocks(ctx: BuildContext, n: int) -> nn.ModuleList:
    """The ``norm`` component's blocks around a layer's ``n`` sub-layers: ``n`` of them, or one when its class
    declares ``parallel = True`` (it then receives all ``n`` sub-layers at once, see :func:`run_sublayers`)."""
    first = ctx.make("norm")
    if getattr(type(first), "parallel", False):
        return nn.ModuleList([first])
    return nn.ModuleList([first] + [ctx.make("norm") for _ in range(n - 1)])


def run_sublayers(blocks: nn.ModuleList, x: torch.Tensor, sublayers: list) -> torch.Tensor:
    """x (B, L, D) through the sub-layers (callables (B, L, D) -> (B, L, D)): one after another, each
    wrapped by its block, or all handed at once to a parallel block (``blocks[0](x, sublayers)``)."""
    if getattr(type(blocks[0]), "parallel", False):
        return blocks[0](x, sublayers)
    for block, sublayer in zip(blocks, sublayers):
        x = block(x, sublayer)
    return x


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each wrapped by the norm component's residual block (one parallel block
    around both when the component declares ``parallel = True``)."""

    def __init__(self, ctx: BuildContext):
        super().__init__()
        self.self_attn = ctx.attention()
        self.feed_forward = ctx.make("feed_forward")
        self.sublayer = residual_blocks(ctx, 2)

    def forward(self, x: torch.Tensor, src_mask) -> torch.Tensor:
        return run_sublayers(self.sublayer, x, [lambda y: self.self_attn(y, y, y, src_mask), self.feed_forward])


class DecoderLayer(nn.Module):
    """Masked self-attention, source attention over the memory, FFN (each wrapped, or one parallel block)."""

    def __init__(self, ctx: BuildContext):
        super().__init__()
        self.self_attn = ctx.attention()
        self.src_attn = ctx.attention(cross=True)
        self.feed_forward = ctx.make("feed_forward")
        self.sublayer = residual_blocks(ctx, 3)

    def forward(self, x, memory, src_mask, tgt_mask) -> torch.Tensor:
        return run_sublayers(self.sublayer, x, [lambda y: self.self_attn(y, y, y, tgt_mask),
                                                lambda y: self.src_attn(y, memory, memory, src_mask),
                                                self.feed_forward])


class Stack(nn.Module):
    """N layers and, for pre-norm, a final LayerNorm (Identity otherwise). ``stack`` (``"encoder"`` /
    ``"decoder"``) and each layer's index reach the components through ``ctx.stack`` and ``ctx.layer``."""

    def __init__(self, ctx: BuildContext, layer_cls, stack: str):
        super().__init__()
        ctx.stack, layers = stack, []
        for i in range(ctx.cfg.N):
            ctx.layer = i
            layers.append(layer_cls(ctx))
        ctx.layer = None
        self.layers = nn.ModuleList(layers)
        final = getattr(type(self.layers[0].sublayer[0]), "final_norm", False)
        self.norm = ctx.layer_norm() if final else nn.Identity()
        ctx.stack = ""

    def forward(self, x, *args) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, *args)
        return self.norm(x)


class EncoderDecoder(nn.Module):
    """The assembled model: ``forward(src (B, S), tgt (B, T)) -> logits (B, T, V)``.

    Masks are made by the mask component from token ids unless given.
    """

    architecture = ENCODER_DECODER

    def __init__(self, ctx: BuildContext, variant: Variant):
        super().__init__()
        self.cfg = ctx.cfg
        self.variant_name = variant.name
        self.slots = {slot: comp.name for slot, comp in ctx.components.items()}
        self.mask_style = ctx.mask
        self.embed = ctx.make("embedding")
        self.src_pos = ctx.make("positional")
        self.tgt_pos = ctx.make("positional")
        #: the positions each stack's self-attention gets (not modules: src_pos / tgt_pos are registered above)
        self.position_hooks = (PositionHooks(self.src_pos, ctx.cfg.h), PositionHooks(self.tgt_pos, ctx.cfg.h))
        ctx.self_positions = self.position_hooks[0]
        self.encoder = Stack(ctx, EncoderLayer, "encoder")
        ctx.self_positions = self.position_hooks[1]
        self.decoder = Stack(ctx, DecoderLayer, "decoder")
        ctx.self_positions = None

    def make_masks(self, src: torch.Tensor, tgt: torch.Tensor):
        """(src_mask, tgt_mask) in the mask component's convention."""
        pad = self.cfg.pad
        return self.mask_style.src_mask(src, pad), self.mask_style.tgt_mask(tgt, pad)

    def encode(self, src: torch.Tensor, src_mask) -> torch.Tensor:
        """(B, S) ids -> memory (B, S, D)."""
        return self.encoder(self.src_pos(self.embed.src(src)), src_mask)

    def decode(self, memory, src_mask, tgt: torch.Tensor, tgt_mask) -> torch.Tensor:
        """(B, T) ids -> decoder states (B, T, D)."""
        return self.decoder(self.tgt_pos(self.embed.tgt(tgt)), memory, src_mask, tgt_mask)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask=None, tgt_mask=None) -> torch.Tensor:
        if src_mask is None or tgt_mask is None:
            made_src, made_tgt = self.make_masks(src, tgt)
            src_mask = made_src if src_mask is None else src_mask
            tgt_mask = made_tgt if tgt_mask is None else tgt_mask
        memory = self.encode(src, src_mask)
        return self.embed.logits(self.decode(memory, src_mask, tgt, tgt_mask))


def canonical_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters under canonical names (tensors are the live parameters).

    Tied parameters appear under every canonical name that uses them.
    """
    out: dict[str, torch.Tensor] = {}

    def walk(module: nn.Module, prefix: str) -> None:
        if hasattr(module, "canonical_state"):
            for k, v in module.canonical_state().items():
                out[prefix + k] = v
            return
        for name, p in module.named_parameters(recurse=False):
            out[prefix + name] = p
        for name, child in module.named_children():
            walk(child, f"{prefix}{name}.")

    walk(model, "")
    return out


def canonical_grad(t: torch.Tensor) -> torch.Tensor | None:
    """The gradient of one canonical tensor: its own ``.grad`` for a parameter; for a *view* of a
    parameter (a slice of a packed ``qkv`` weight) the same view of the parameter's gradient; None when
    there is none (no backward yet, or a tensor that is neither, such as a bias exported as zeros).
    """
    if isinstance(t, nn.Parameter):
        return t.grad
    base = t._base
    if not isinstance(base, nn.Parameter) or base.grad is None:
        return None
    g = base.grad
    if tuple(g.stride()) != tuple(base.stride()):
        g = g.contiguous() if base.is_contiguous() else g
    if tuple(g.stride()) != tuple(base.stride()):
        return None
    offset = t.storage_offset() - base.storage_offset()
    return g.as_strided(t.size(), t.stride(), g.storage_offset() + offset)


def parameter_of(t: torch.Tensor) -> nn.Parameter | None:
    """The parameter a canonical tensor is or views (None for a tensor that is neither)."""
    if isinstance(t, nn.Parameter):
        return t
    return t._base if isinstance(t._base, nn.Parameter) else None


def load_canonical_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Copy canonical parameters into ``model`` (no grad). Returns notes on what was lossy
    (e.g. a bias that a bias-free component cannot hold, or tied weights that differed).

    Raises:
        KeyError: a canonical parameter of ``model`` is missing from ``state``.
    """
    notes: list[str] = []

    def walk(module: nn.Module, prefix: str) -> None:
        if hasattr(module, "canonical_state"):
            sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            notes.extend(prefix + n for n in module.load_canonical_state(sub))
            return
        with torch.no_grad():
            for name, p in module.named_parameters(recurse=False):
                if prefix + name not in state:
                    raise KeyError(f"canonical parameter {prefix + name!r} missing")
                p.copy_(state[prefix + name])
        for name, child in module.named_children():
            walk(child, f"{prefix}{name}.")

    walk(model, "")
    return notes


def self_initialised(model: nn.Module) -> dict[str, nn.Module]:
    """canonical prefix -> module, for every module of ``model`` that defines ``init_weights`` (found on the
    canonical walk: the highest such module of each branch, at or above a ``canonical_state`` module)."""
    out: dict[str, nn.Module] = {}

    def walk(module: nn.Module, prefix: str) -> None:
        if callable(getattr(module, "init_weights", None)):
            out[prefix] = module
            return
        if hasattr(module, "canonical_state"):
            return
        for name, child in module.named_children():
            walk(child, f"{prefix}{name}.")

    for name, child in model.named_children():
        walk(child, f"{name}.")
    return out


def canonical_init(model: nn.Module, seed: int, scheme=None) -> None:
    """Initialise every canonical parameter of ``model`` from ``seed`` with ``scheme`` (the ``init`` slot's
    product, :class:`harness.slots.InitScheme`; default the Annotated Transformer's xavier rule,
    :class:`harness.init_schemes.AnnotatedXavier`).

    Each canonical tensor is drawn with a generator seeded from (seed, canonical name) alone
    (:func:`harness.init_schemes.tensor_generator`), so two variants with the same canonical layout and the same
    scheme start from identical weights (paired seeds), whatever their internal layout or parameter
    registration order. A module that defines ``init_weights(init)`` (:func:`self_initialised`) is skipped by
    the scheme and then called, under ``torch.no_grad()``, with a :class:`harness.init_schemes.OwnInit` (its
    prefix, per-tensor generators from the same rule, the scheme's own draw): what it sets is kept.

    Raises:
        PluginError: the scheme returned a tensor of another shape, or no tensor.
    """
    scheme = DEFAULT_SCHEME if scheme is None else scheme
    state = canonical_state_dict(model)
    own = self_initialised(model)
    sites = tensor_sites({name: tuple(t.shape) for name, t in state.items()})
    fresh = {}
    for name in sorted(state):
        new = state[name].detach().to("cpu", torch.float32).clone()
        if not any(name.startswith(prefix) for prefix in own):
            new = draw(scheme, sites[name], new, tensor_generator(seed, name))
        fresh[name] = new
    load_canonical_state_dict(model, fresh)
    with torch.no_grad():
        for prefix, module in own.items():
            module.init_weights(OwnInit(prefix, seed, scheme, sites))


def unique_parameter_count(model: nn.Module) -> int:
    """Parameters counted once per storage (tied weights count once)."""
    seen, total = set(), 0
    for p in model.parameters():  # nn.Module.parameters() already de-duplicates by identity
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel()
    return total


def build_model(registry: Registry, variant: Variant, cfg: ModelConfig, seed: int = 0) -> nn.Module:
    """Assemble ``variant`` with ``cfg`` by its ``architecture`` component (:class:`EncoderDecoder` by default;
    :mod:`harness.decoder_only`) and initialise it from ``seed`` with its ``init`` scheme
    (:func:`canonical_init`).

    Raises:
        ConfigError: invalid ``cfg``.  UnknownNameError: a slot's component is not registered.
        PluginError: the ``init`` scheme returned a tensor of the wrong shape.
    """
    cfg.validate()
    comps = {slot: registry.component(slot, name) for slot, name in variant.resolved().items()}
    torch.manual_seed(seed)
    ctx = BuildContext(cfg, comps)
    assemble = ctx.make("architecture") if "architecture" in comps else EncoderDecoder
    model = assemble(ctx, variant)
    canonical_init(model, seed, ctx.make("init"))
    return model

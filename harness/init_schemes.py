"""Initialisation: where each canonical tensor sits, the generator it is drawn from, and the default rule.

The ``init`` slot's component is a *scheme* (:class:`harness.slots.InitScheme`): after the assembler has
built a model, :func:`harness.model.canonical_init` hands the scheme every canonical tensor (the names
of :func:`harness.model.canonical_state_dict`) one at a time, as a :class:`TensorSite` with a
``torch.Generator`` of its own, and loads what the scheme returns through the canonical layout.

Pairing (paired seeds): the generator of a canonical tensor is seeded from (seed, canonical name) alone
(:func:`tensor_generator`), and a scheme sees nothing but the site (name, shape, role, place) and that
generator, so two variants with the same canonical layout and the same ``init`` component start from
identical weights, whatever their module layout or parameter registration order. The checks hold a
scheme to that (``check_init``: the same draws in any order, whatever the global RNG holds).

Roles (:attr:`TensorSite.role`) are read from the canonical names the slots fix (docs/components.md): a
component that exports its parameters under those names gets the roles a scheme scales by.

==============  ===========================================================================
role            canonical tensors
==============  ===========================================================================
``embedding``   ``embed.src.weight``, ``embed.tgt.weight`` (V, D): the token lookup tables
``generator``   ``embed.generator.weight`` (V, D)
``positions``   every matrix of the positional modules ``src_pos`` / ``tgt_pos`` (learned (max_len, D))
``attn_qk``     ``w_q.weight``, ``w_k.weight`` of a ``self_attn`` / ``src_attn`` module
``attn_value``  ``w_v.weight`` of an attention module
``attn_out``    ``w_o.weight`` of an attention module: a residual output projection
``ffn_in``      ``w_1.weight``, ``w_gate.weight``, ``w_up.weight`` of a ``feed_forward`` module
``ffn_out``     ``w_2.weight``, ``w_down.weight``: a residual output projection
``matrix``      any other tensor of two or more dimensions
``bias``        a vector whose name ends in ``bias`` (:attr:`TensorSite.weight`: its matrix, if any)
``vector``      any other vector or scalar (LayerNorm gains, ReZero's alpha, QK-norm gains)
==============  ===========================================================================

The default rule, :class:`AnnotatedXavier`, is the Annotated Transformer's ``make_model``: xavier_uniform_
on every matrix, ``nn.Linear``'s bias rule, everything else as the module made it. It lives here, not in
``variants/``, because the checks start a module as every run does (:func:`harness.model.canonical_init`
without a scheme); the built-in ``init`` component of that name returns it.

Shape letters: V vocabulary, D = d_model.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Mapping

import torch
from torch import nn

from .errors import PluginError

#: The roles a :class:`TensorSite` can have (module docstring).
ROLES = ("embedding", "generator", "positions", "attn_qk", "attn_value", "attn_out", "ffn_in", "ffn_out",
         "matrix", "bias", "vector")

_ATTENTION_ROLES = {"w_q": "attn_qk", "w_k": "attn_qk", "w_v": "attn_value", "w_o": "attn_out"}
_FFN_ROLES = {"w_1": "ffn_in", "w_gate": "ffn_in", "w_up": "ffn_in", "w_2": "ffn_out", "w_down": "ffn_out"}
_ATTENTION_MODULES = ("self_attn", "src_attn")
_STACKS = ("encoder", "decoder")


def tensor_generator(seed: int, name: str) -> torch.Generator:
    """The generator canonical tensor ``name`` is drawn from: seeded from (seed, name) alone (CRC-32 of the name).

    The same formula since the harness began, so every stored result's initial weights are reproduced.
    """
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))


@dataclass(frozen=True)
class TensorSite:
    """One canonical tensor as an init scheme sees it.

    Attributes:
        name: the canonical name, e.g. ``encoder.layers.1.self_attn.w_o.weight``.
        shape: its shape, e.g. (D, D).
        role: what it is (one of :data:`ROLES`; module docstring), read from the canonical name.
        stack: ``"encoder"`` / ``"decoder"`` for a tensor inside a stack (its layers and its final
            LayerNorm), ``""`` outside (embeddings, positions, generator).
        layer: its layer's index in the stack, 0 .. N - 1; None outside a layer.
        sublayer: the layer's child it belongs to: ``"self_attn"``, ``"src_attn"`` (the decoder's
            attention over the memory), ``"feed_forward"``, ``"sublayer"`` (the residual blocks); ``""``
            outside a layer.
        weight: for a ``bias``, the site of the matrix ``<prefix>weight`` beside it (None when there is none).
        unit: the shapes of the canonical tensors of the same sub-layer (or top-level module), keyed by
            their names relative to it (``{"w_q.weight": (D, D), ...}``): a scheme that treats q, k and v as
            one packed matrix reads their rows here.
    """

    name: str
    shape: tuple[int, ...]
    role: str
    stack: str = ""
    layer: int | None = None
    sublayer: str = ""
    weight: "TensorSite | None" = None
    unit: Mapping[str, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def fan_in(self) -> int:
        """Inputs per output unit of a matrix (``shape[1]`` times any trailing dims; torch's rule); 0 for a vector."""
        return self.shape[1] * math.prod(self.shape[2:]) if len(self.shape) > 1 else 0

    @property
    def fan_out(self) -> int:
        """Outputs per input unit of a matrix (``shape[0]`` times any trailing dims); 0 for a vector."""
        return self.shape[0] * math.prod(self.shape[2:]) if len(self.shape) > 1 else 0


def _place(parts: list[str]) -> tuple[str, int | None, str, int]:
    """(stack, layer, sublayer, index of the unit's first part after its prefix) of a split canonical name."""
    if parts[0] in _STACKS and len(parts) > 3 and parts[1] == "layers" and parts[2].isdigit():
        return parts[0], int(parts[2]), parts[3], 4
    if parts[0] in _STACKS:
        return parts[0], None, "", 1
    return "", None, "", 1


def _matrix_role(parts: list[str], sublayer: str) -> str:
    owner = parts[-2] if len(parts) > 1 else ""
    if parts[0] == "embed" and owner in ("src", "tgt"):
        return "embedding"
    if parts[0] == "embed" and owner == "generator":
        return "generator"
    if parts[0] in ("src_pos", "tgt_pos"):
        return "positions"
    if sublayer in _ATTENTION_MODULES and owner in _ATTENTION_ROLES:
        return _ATTENTION_ROLES[owner]
    if sublayer == "feed_forward" and owner in _FFN_ROLES:
        return _FFN_ROLES[owner]
    return "matrix"


def tensor_sites(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, TensorSite]:
    """A :class:`TensorSite` for every canonical name of ``shapes`` (a model's ``{name: shape}``)."""
    units: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, shape in shapes.items():
        parts = name.split(".")
        start = _place(parts)[3]
        units.setdefault(".".join(parts[:start]), {})[".".join(parts[start:])] = tuple(shape)
    sites: dict[str, TensorSite] = {}
    for name in sorted(shapes, key=lambda n: (n.endswith("bias"), n)):  # matrices first: a bias names its weight
        parts, shape = name.split("."), tuple(shapes[name])
        stack, layer, sublayer, start = _place(parts)
        unit = units[".".join(parts[:start])]
        if len(shape) > 1:
            role, weight = _matrix_role(parts, sublayer), None
        elif name.endswith("bias"):
            role, weight = "bias", sites.get(name[: -len("bias")] + "weight")
        else:
            role, weight = "vector", None
        sites[name] = TensorSite(name, shape, role, stack, layer, sublayer, weight, unit)
    return sites


class AnnotatedXavier:
    """The default scheme (component ``init`` default): the Annotated Transformer's ``make_model``.

    Every tensor of two or more dimensions: ``nn.init.xavier_uniform_``, U(-a, a) with
    a = sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010), embeddings and the generator included (the
    Annotated code loops ``for p in model.parameters(): if p.dim() > 1``). A bias beside a matrix
    ``<prefix>weight``: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), ``nn.Linear``'s own rule (the Annotated loop leaves
    it as ``nn.Linear`` made it). Everything else (LayerNorm gains 1 and biases 0, ReZero's alpha) as the module
    made it. Bitwise the harness's initialisation before the ``init`` slot existed (tests/test_init.py).
    """

    def init(self, site: TensorSite, current: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``current`` (float32, CPU, the module's value; may be overwritten) -> the initial value of ``site``."""
        if len(site.shape) > 1:
            return nn.init.xavier_uniform_(current, generator=generator)
        if site.role == "bias" and site.weight is not None and len(site.weight.shape) == 2:
            bound = 1.0 / math.sqrt(site.weight.shape[1])
            return current.uniform_(-bound, bound, generator=generator)
        return current


#: The scheme :func:`harness.model.canonical_init` uses when given none.
DEFAULT_SCHEME = AnnotatedXavier()


class OwnInit:
    """What a self-initialising module's ``init_weights(init)`` receives (docs/plugins.md, "Initialisation").

    Attributes:
        prefix: the module's canonical prefix, e.g. ``"encoder.layers.0.feed_forward."``.
        seed: the model's seed.
    """

    def __init__(self, prefix: str, seed: int, scheme, sites: Mapping[str, TensorSite]):
        self.prefix, self.seed = prefix, seed
        self._scheme, self._sites = scheme, sites

    def generator(self, name: str) -> torch.Generator:
        """The generator of the module's canonical tensor ``name`` (relative, e.g. ``"w_1.weight"``): seeded from
        (seed, full canonical name) alone, as the scheme's own draws, so drawing with it keeps the pairing."""
        return tensor_generator(self.seed, self.prefix + name)

    def site(self, name: str) -> TensorSite:
        """The :class:`TensorSite` of the module's canonical tensor ``name`` (relative).

        Raises:
            KeyError: the module exports no canonical tensor of that name.
        """
        return self._sites[self.prefix + name]

    def drawn(self, name: str) -> torch.Tensor:
        """What the variant's ``init`` scheme gives canonical tensor ``name`` (relative): a new float32 CPU
        tensor, drawn from :meth:`generator` (a component may scale it, or ignore it)."""
        site = self.site(name)
        return draw(self._scheme, site, torch.zeros(site.shape), self.generator(name))


def draw(scheme, site: TensorSite, current: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``scheme.init(site, current, generator)``, held to the protocol: a tensor of ``site.shape`` (float32, CPU).

    Raises:
        PluginError: the scheme returned something else (naming the scheme and the tensor).
    """
    out = scheme.init(site, current, generator)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != site.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise PluginError(f"init scheme {type(scheme).__name__}: init() must return a tensor of shape {site.shape} "
                          f"for {site.name}, got {got}")
    return out.detach().to("cpu", torch.float32)


"""Slot ``init``: how the weights start. Each component is a scheme (``harness.slots.InitScheme``): after the
build it draws every canonical tensor from a generator seeded from (seed, canonical name) alone, so variants
that share a scheme and a canonical layout start equal; only the ``init`` choice moves the start.

The roles a scheme scales by (``embedding``, ``attn_value``, ``attn_out``, ``ffn_out`` ...) are read from the
canonical names (``harness.init_schemes``). N is ``model.N``, the layers of each stack (the encoder's N and
the decoder's M of the papers are equal here). D = d_model. "Keeps" means the value the module made
(LayerNorm gains 1, biases 0; ReZero's alpha 0).

* ``xavier`` (default): the Annotated Transformer's ``make_model``: xavier_uniform_ on every matrix,
  ``nn.Linear``'s bias rule U(+-1/sqrt(fan_in)); bitwise the harness's initialisation before this slot
  existed (``harness.init_schemes.AnnotatedXavier``).
* ``torch_default``: PyTorch's module defaults, what a model whose code initialises nothing gets: every
  projection and the generator as ``nn.Linear.reset_parameters`` (kaiming_uniform_(a = sqrt(5)), i.e.
  U(+-1/sqrt(fan_in)); bias the same); embedding tables (tokens, learned positions) as ``nn.Embedding``:
  N(0, 1). d2l's models are built this way, and its ``train_seq2seq`` (which trains §10.7's Transformer)
  then re-draws every ``nn.Linear`` weight: that is ``d2l``.
* ``d2l``: d2l's ``train_seq2seq``: ``net.apply(xavier_init_weights)``, xavier_uniform_ on the weight of every
  ``nn.Linear`` (projections and the generator), their biases and the embedding tables left at PyTorch's
  defaults (U(+-1/sqrt(fan_in)) and N(0, 1)).
* ``nn_transformer``: ``nn.Transformer._reset_parameters`` (xavier_uniform_ on every parameter of more than one
  dimension) over ``nn.MultiheadAttention``'s layout: q, k and v are one packed ``in_proj_weight`` ((3D, D) for
  multi-head attention), so each is drawn from that matrix's bound sqrt(6 / (D + 3D)), not sqrt(6 / 2D); the
  attention biases are 0 (``MultiheadAttention._reset_parameters``), the feed-forward biases ``nn.Linear``'s
  rule. Embeddings, positions and the generator sit outside ``nn.Transformer``: the same loop over the whole
  model gives them xavier_uniform_ too.
* ``gpt2``: GPT-2 (Radford et al. 2019 §2.3; nanoGPT ``_init_weights``): every matrix and embedding
  N(0, 0.02), biases 0, and the residual output projections (attention ``w_o``, FFN ``w_2`` / ``w_down``)
  N(0, 0.02 / sqrt(n)) with n the residual layers of the stack: "we scale the weights of residual layers at
  initialization by a factor of 1/sqrt(N) where N is the number of residual layers". n = 2N in the encoder
  (nanoGPT's 2 * n_layer: attention and MLP per block) and 3N in the decoder (self-attention,
  cross-attention and FFN each add to the residual stream).
* ``small``: SmallInit (Nguyen & Salazar 2019 §2.2, §3.1; their code ``layers.py``): Xavier *normal* as the
  base, with every attention matrix drawn at the feed-forward's smaller std sqrt(2 / (D + 4D)) = sqrt(2 / 5D)
  instead of sqrt(2 / 2D) (the sqrt(2/5) ~ 0.63 reduction); other matrices xavier_normal_; word embeddings
  N(0, std D^-1/2) ("mean 0 and standard deviation sqrt(1/d)", §3.2), which here also covers learned
  positions and the generator (tied to the target embedding in the paper); biases 0 (their code).
* ``t_fixup``: T-Fixup (Huang et al. 2020, Algorithm: "Improving Transformer Optimization Through Better
  Initialization", ICML 2020): xavier_uniform_ on every matrix but the input embeddings, which get
  N(0, std D^-1/2); then the decoder's attention ``w_v`` and ``w_o`` (self- and cross-attention), its FFN
  matrices and both input embeddings (source and target; learned positions too) times (9N)^-1/4, and the
  encoder's attention ``w_v``, ``w_o`` and FFN matrices times 0.67 N^-1/4. Biases 0 (fairseq's ``Linear``
  and ``MultiheadAttention``, which the T-Fixup code builds on). T-Fixup's recipe also removes every
  LayerNorm and the learning-rate warm-up: those are the ``norm`` slot (a residual block with
  ``has_layer_norm=False``) and ``train.warmup``, which this scheme does not change.
* ``deepnet``: DeepNet's initialisation (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000
  Layers", Figure 2 and Table 1, encoder-decoder column): ``xavier_normal_(w, gain=beta)`` on the FFN
  matrices, ``w_v`` and ``w_o``, ``xavier_normal_(w, gain=1)`` on ``w_q`` and ``w_k``, with
  beta = 0.87 (N^4 M)^(-1/16) in the encoder and (12 M)^(-1/4) in the decoder (N = M = ``model.N``; the
  decoder's cross-attention included, as torchscale's ``v_proj`` / ``out_proj``). Everything the paper does
  not name keeps the ``xavier`` rule. Its other half, the residual alpha inside post-norm,
  LayerNorm(alpha x + G(x)), belongs to the ``norm`` slot: ``norm=deepnorm`` (``variants/norm.py``), which
  takes alpha from :func:`deepnet_alpha`; variant ``deepnet`` uses both.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, hookimpl
from harness.init_schemes import DEFAULT_SCHEME, TensorSite
from harness.model import ENCODER_DECODER

_ATTENTION = ("attn_qk", "attn_value", "attn_out")
_FFN = ("ffn_in", "ffn_out")
_TABLES = ("embedding", "positions")


def one_stack(ctx) -> bool:
    """Whether the model being built is one stack (decoder-only or prefix LM, ``ctx.architecture``)."""
    return getattr(ctx, "architecture", ENCODER_DECODER) != ENCODER_DECODER


def deepnet_alpha(stack: str, n: int, m: int, single: bool = False) -> float:
    """DeepNet's residual up-scaling alpha (Wang et al. 2022, Table 1): in an encoder-decoder, encoder
    0.81 (N^4 M)^(1/16), decoder (3M)^(1/4), N encoder and M decoder layers (``stack`` ``"decoder"`` or else the
    encoder's); in one stack of M layers (``single``: decoder-only, prefix LM) (2M)^(1/4)."""
    if single:
        return (2 * m) ** 0.25
    return (3 * m) ** 0.25 if stack == "decoder" else 0.81 * (n ** 4 * m) ** (1 / 16)


def deepnet_beta(stack: str, n: int, m: int, single: bool = False) -> float:
    """DeepNet's init down-scaling beta (Wang et al. 2022, Table 1): encoder 0.87 (N^4 M)^(-1/16), decoder
    (12M)^(-1/4); one stack of M layers (``single``) (8M)^(-1/4)."""
    if single:
        return (8 * m) ** -0.25
    return (12 * m) ** -0.25 if stack == "decoder" else 0.87 * (n ** 4 * m) ** (-1 / 16)


class TorchDefault:
    """PyTorch's module defaults (``nn.Linear``, ``nn.Embedding``), drawn per canonical tensor (d2l's code)."""

    def init(self, site: TensorSite, current: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if site.role in _TABLES:
            return nn.init.normal_(current, generator=g)
        if len(site.shape) > 1:
            return nn.init.kaiming_uniform_(current, a=math.sqrt(5), generator=g)
        if site.role == "bias" and site.weight is not None:
            bound = 1 / math.sqrt(site.weight.fan_in) if site.weight.fan_in else 0.0
            return nn.init.uniform_(current, -bound, bound, generator=g)
        return current


class D2L:
    """d2l's ``train_seq2seq``: xavier_uniform_ on every ``nn.Linear`` weight, embedding tables N(0, 1)."""

    def init(self, site: TensorSite, current: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if site.role in _TABLES:
            return nn.init.normal_(current, generator=g)
        return DEFAULT_SCHEME.init(site, current, g)


class NNTransformer:
    """``nn.Transformer._reset_parameters`` over ``nn.MultiheadAttention``'s packed q, k, v."""

    def init(self, site: TensorSite, current: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if site.role in ("attn_qk", "attn_value"):
            packed = sum(site.unit.get(f"w_{x}.weight", (0,))[0] for x in "qkv")  # rows of in_proj_weight
            bound = math.sqrt(6.0 / (site.fan_in + max(packed, site.fan_out)))
            return nn.init.uniform_(current, -bound, bound, generator=g)
        if site.role == "bias" and site.weight is not None and site.weight.role in _ATTENTION:
            return nn.init.zeros_(current)
        return DEFAULT_SCHEME.init(site, current, g)


class GPT2:
    """GPT-2's N(0, 0.02) with residual output projections at 0.02 / sqrt(residual layers): 2 per layer in an
    encoder or a one-stack model (decoder-only, prefix LM: GPT-2's own 2N), 3 in an encoder-decoder's decoder."""

    def __init__(self, n_layers: int, single: bool = False):
        self.n, self.single = n_layers, single

    def init(self, site: TensorSite, current: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if len(site.shape) > 1:
            std = 0.02
            if site.role in ("attn_out", "ffn_out"):
                std /= math.sqrt((3 if site.stack == "decoder" and not self.single else 2) * self.n)
            return nn.init.normal_(current, 0.0, std, generator=g)
        return nn.init.zeros_(current) if site.role == "bias" else current


class SmallInit:
    """Nguyen & Salazar 2019's SmallInit: Xavier normal, attention at sqrt(2 / 5D), embeddings N(0, D^-1/2)."""

    def __init__(self, d_model: int):
        self.d = d_model

    def init(self, site: TensorSite, current: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if site.role in _ATTENTION:
            return nn.init.normal_(current, 0.0, math.sqrt(2 / (5 * self.d)), generator=g)
        if site.role in (*_TABLES, "generator"):
            return nn.init.normal_(current, 0.0, self.d ** -0.5, generator=g)
        if len(site.shape) > 1:
            return nn.init.xavier_normal_(current, generator=g)
        return nn.init.zeros_(current) if site.role == "bias" else current


class TFixup:
    """T-Fixup (Huang et al. 2020): xavier, embeddings N(0, D^-1/2), v / w_o / FFN and embeddings scaled by depth."""

    def __init__(self, d_model: int, n_layers: int):
        self.d, self.n = d_model, n_layers

    def scale(self, site: TensorSite) -> float:
        """The factor of ``site``: (9N)^-1/4 for the embeddings and the decoder's v, w_o and FFN matrices,
        0.67 N^-1/4 for the encoder's, 1 elsewhere (``w_q``, ``w_k``, the generator)."""
        if site.role in _TABLES or (site.stack == "decoder" and site.role in ("attn_value", "attn_out", *_FFN)):
            return (9 * self.n) ** -0.25
        if site.stack == "encoder" and site.role in ("attn_value", "attn_out", *_FFN):
            return 0.67 * self.n ** -0.25
        return 1.0

    def init(self, site: TensorSite, current: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if site.role in _TABLES:
            return nn.init.normal_(current, 0.0, self.d ** -0.5, generator=g).mul_(self.scale(site))
        if len(site.shape) > 1:
            return nn.init.xavier_uniform_(current, generator=g).mul_(self.scale(site))
        return nn.init.zeros_(current) if site.role == "bias" else current


class DeepNetInit:
    """DeepNet's ``deepnorm_init``: xavier_normal_ with gain beta on FFN, v and out projections, gain 1 on q, k."""

    def __init__(self, n_layers: int, single: bool = False):
        self.n, self.single = n_layers, single

    def init(self, site: TensorSite, current: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if site.role in ("attn_value", "attn_out", *_FFN):
            gain = deepnet_beta(site.stack, self.n, self.n, self.single)
            return nn.init.xavier_normal_(current, gain=gain, generator=g)
        if site.role == "attn_qk":
            return nn.init.xavier_normal_(current, gain=1.0, generator=g)
        return DEFAULT_SCHEME.init(site, current, g)


@hookimpl
def harness_add_components():
    return [
        Component("xavier", "init", lambda ctx: DEFAULT_SCHEME,
                  "xavier_uniform on every matrix, nn.Linear's bias rule, LayerNorm 1 / 0",
                  "Annotated Transformer make_model (notes 000, 001); Glorot & Bengio 2010", default=True),
        Component("torch_default", "init", lambda ctx: TorchDefault(),
                  "PyTorch's module defaults: nn.Linear U(+-1/sqrt(fan_in)), nn.Embedding N(0, 1)",
                  "nn.Linear.reset_parameters, nn.Embedding.reset_parameters (d2l's models as built)"),
        Component("d2l", "init", lambda ctx: D2L(),
                  "xavier_uniform on every nn.Linear weight, biases U(+-1/sqrt(fan_in)), embeddings N(0, 1)",
                  "d2l train_seq2seq xavier_init_weights (note 003, d2l §10.7 trains with it)"),
        Component("nn_transformer", "init", lambda ctx: NNTransformer(),
                  "nn.Transformer._reset_parameters: xavier_uniform with q, k, v as one packed (3D, D) matrix, "
                  "attention biases 0",
                  "torch/nn/modules/transformer.py, activation.py (MultiheadAttention._reset_parameters)"),
        Component("gpt2", "init", lambda ctx: GPT2(ctx.cfg.N, one_stack(ctx)),
                  "N(0, 0.02), biases 0, w_o and w_2 at 0.02 / sqrt(2N) (encoder, one-stack models) or sqrt(3N) "
                  "(an encoder-decoder's decoder)",
                  "Radford et al. 2019 §2.3 (GPT-2); nanoGPT model.py _init_weights"),
        Component("small", "init", lambda ctx: SmallInit(ctx.cfg.d_model),
                  "SmallInit: xavier_normal, attention std sqrt(2 / 5D), embeddings N(0, D^-1/2), biases 0",
                  "Nguyen & Salazar 2019 §2.2, §3.1-3.2 (Transformers without Tears)"),
        Component("t_fixup", "init", lambda ctx: TFixup(ctx.cfg.d_model, ctx.cfg.N),
                  "T-Fixup: xavier, embeddings N(0, D^-1/2) x (9N)^-1/4, v / w_o / FFN x (9N)^-1/4 (decoder), "
                  "0.67 N^-1/4 (encoder)",
                  "Huang et al. 2020 (ICML), T-Fixup algorithm"),
        Component("deepnet", "init", lambda ctx: DeepNetInit(ctx.cfg.N, one_stack(ctx)),
                  "DeepNet: xavier_normal gain beta on FFN, w_v, w_o (encoder 0.87 (N^4 M)^-1/16, decoder "
                  "(12M)^-1/4; one stack (8M)^-1/4), gain 1 on w_q, w_k",
                  "Wang et al. 2022 (DeepNet) Figure 2, Table 1"),
    ]

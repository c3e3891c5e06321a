"""A decoder-only or prefix-LM stack against ``torch.nn.TransformerEncoder`` given the same packed, embedded input
and the same attention mask: causal for ``decoder_only``, the prefix mask for ``prefix_lm`` (Raffel et al. 2020
§3.2.1). The stack of :mod:`harness.decoder_only` is N encoder-style layers (self-attention, feed-forward), which
is what PyTorch's ``nn.TransformerEncoderLayer`` computes; a causal mask makes it the GPT block.

Shape letters: B batch, S source length, T target length, L = S + T the packed length, D = d_model.
"""
from __future__ import annotations

import warnings

import torch

from ..config import ModelConfig
from ..decoder_only import pack, prefix_keep
from ..model import ENCODER_DECODER, PREFIX_LM, canonical_state_dict
from ..registry import Registry, Variant
from .inputs import autocast, describe_exception, padded_batch
from .pairs import CRASHES, NOT_COMPARABLE, ReferenceResult, reference_verdict, tensor_diff
from .policy import get_tolerance
from .runs import canonical_grads, load_variant
from .transformer import (compare_with_nn_transformer, make_nn_transformer, nn_transformer_name,
                          nn_transformer_structure, stack_model, torch_grads, torch_state)


def encoder_name(name: str) -> tuple[str, int | None]:
    """Canonical stack parameter -> (``nn.TransformerEncoder`` parameter, block of ``in_proj`` or None):
    ``decoder.layers.0.self_attn.w_k.weight`` -> (``layers.0.self_attn.in_proj_weight``, 1).

    Raises:
        KeyError: no counterpart (cross-attention, a component's own parameter name)."""
    if not name.startswith("decoder."):
        raise KeyError(f"no nn.TransformerEncoder counterpart for {name!r}")
    tname, block = nn_transformer_name("encoder." + name[len("decoder."):])
    return tname[len("encoder."):], block


def compare_lm_with_torch(registry: Registry, variant: Variant, cfg: ModelConfig, state: dict[str, torch.Tensor],
                          *, device="cpu", dtype: str = "fp32", seed: int = 0, groups=None) -> list[ReferenceResult]:
    """``variant``'s one stack (decoder-only or prefix LM) vs ``nn.TransformerEncoder`` (norm_first as the variant,
    final LayerNorm only where pre-norm has one), on the check's padded batch packed as the model packs it:
    the stack's output at the real target positions and the gradient of every canonical stack parameter.
    Returns one :class:`ReferenceResult` (not comparable, with the reason, where the structures differ)."""
    device = torch.device(device)
    rows = nn_transformer_structure(variant, groups, registry)  # post-norm: the row without nn.Transformer's final norm
    _label, first, _final, _bias, reason = next((r for r in rows if not r[4]), rows[0])
    probe, _ = load_variant(registry, variant, cfg, state)
    canon = canonical_state_dict(probe)
    bias = any(k.endswith("self_attn.w_q.bias") for k in canon)
    label = f"nn.TransformerEncoder(norm_first={first}{'' if bias else ', bias=False'}, {probe.architecture} mask)"
    if not reason and any(k.endswith(("attn.w_k.weight",)) and tuple(t.shape) != (cfg.d_model, cfg.d_model)
                          for k, t in canon.items()):
        reason = "K/V heads shared by groups of query heads, which nn.MultiheadAttention cannot hold"
    if reason:
        return [ReferenceResult(variant.name, label, NOT_COMPARABLE, NOT_COMPARABLE, True, detail=reason,
                                buggy=variant.buggy)]
    note = "" if bias else "LayerNorm biases held at 0 (bias=False has none); their gradients not compared"
    try:
        tol = get_tolerance(dtype, device.type)
        low = _lm_pair(registry, variant, cfg, state, first, bias, device, dtype, seed)
        high = _lm_pair(registry, variant, cfg, state, first, bias, device, "fp64", seed)
        keep = padded_batch(cfg, seed=seed)[1] != cfg.pad
        o = tensor_diff("stack output", low[0], low[2], high[0], high[2], tol, keep)
        grads = [tensor_diff(n, low[1][n], low[3][n], high[1][n], high[3][n], tol) for n in sorted(low[1])]
        return [reference_verdict(variant.name, label, "equivalent", o, grads, variant.buggy, detail=note)]
    except Exception as exc:  # noqa: BLE001 - a crash is the verdict
        return [ReferenceResult(variant.name, label, "equivalent", CRASHES, False, detail=f"crashes: "
                                f"{describe_exception(exc)}", buggy=variant.buggy)]


def torch_mask(model, ids: torch.Tensor, n: torch.Tensor, h: int) -> torch.Tensor:
    """The reference's ``mask`` (True = blocked): (L, L) causal for a decoder-only model, (B * H, L, L) from
    :func:`harness.decoder_only.prefix_keep` (padding included) for a prefix LM."""
    length = ids.size(1)
    if model.architecture == PREFIX_LM:
        return (~prefix_keep(ids, model.cfg.pad, n)[:, 0]).repeat_interleave(h, dim=0)
    return ~torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()


def _lm_pair(registry, variant, cfg, state, norm_first, bias, device, dtype, seed):
    """(ours (B, T, D), our gradients, theirs (B, T, D), their gradients by canonical name) at ``dtype``."""
    wdtype = torch.float64 if dtype == "fp64" else torch.float32
    model, canon = stack_model(registry, variant, cfg, state, bias, device, wdtype, ("decoder.",))
    ref = make_nn_transformer(cfg, norm_first, norm_first, bias).encoder
    ref.load_state_dict(torch_state(canon, encoder_name), strict=True)
    ref = ref.to(device, wdtype).eval()
    src, tgt, _ = (t.to(device) for t in padded_batch(cfg, seed=seed))
    with torch.no_grad():
        ids, x, n, index = pack(src, tgt, model.embed.src(src), model.embed.tgt(tgt), cfg.pad)
        x = model.tgt_pos(x)
    r = torch.randn(*tgt.shape, cfg.d_model, generator=torch.Generator().manual_seed(seed + 61))
    weight = r.to(device, wdtype) * (tgt != cfg.pad)[..., None].to(wdtype)
    at = index[..., None].expand(-1, -1, cfg.d_model)
    with autocast(device, dtype):
        ours = model.decoder(x, model.sequence_mask(ids, n)).gather(1, at)
    (ours.to(wdtype) * weight).sum().backward()
    ours_grads = {k: v for k, v in canonical_grads(model).items() if k in canon}
    with autocast(device, dtype), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = ref(x, mask=torch_mask(model, ids, n, cfg.h), src_key_padding_mask=ids == cfg.pad).gather(1, at)
    (theirs.to(wdtype) * weight).sum().backward()
    return ours.detach().cpu(), ours_grads, theirs.detach().cpu(), torch_grads(ref, ours_grads, encoder_name, cfg.d_model)


def architecture_of(registry: Registry, variant: Variant) -> str:
    """The ``architecture`` attribute of ``variant``'s assembler (:data:`harness.model.ENCODER_DECODER` when it
    declares none)."""
    comp = registry.component("architecture", variant.resolved()["architecture"])
    try:
        return getattr(comp.factory(None), "architecture", ENCODER_DECODER)
    except Exception:  # noqa: BLE001 - an assembler that needs its context: the encoder-decoder comparison says why
        return ENCODER_DECODER


def compare_stack_with_torch(registry: Registry, variant: Variant, cfg: ModelConfig, state: dict[str, torch.Tensor],
                             **kw) -> list[ReferenceResult]:
    """The variant's stacks against PyTorch's: :func:`compare_lm_with_torch` for a decoder-only or prefix-LM
    variant, :func:`harness.checks.transformer.compare_with_nn_transformer` for an encoder-decoder."""
    if architecture_of(registry, variant) != ENCODER_DECODER:
        return compare_lm_with_torch(registry, variant, cfg, state, **kw)
    return compare_with_nn_transformer(registry, variant, cfg, state, **kw)

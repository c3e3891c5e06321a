"""Whole encoder-decoder stacks against ``torch.nn.Transformer(norm_first=False/True)``, given the
same embedded inputs (the embeddings, scaling, positional encoding and generator live outside
``nn.Transformer``), as far as the structures match.

Shape letters: B batch, S source length, T target length, D = d_model.
"""
from __future__ import annotations

import dataclasses
import re
import warnings

import torch
from torch import nn

from ..config import ModelConfig
from ..model import canonical_state_dict
from ..registry import Registry, Variant
from .contract_base import reference_components, sibling_context
from .contracts import reference_key
from .inputs import CHECK_MODEL, autocast, describe_exception, draw_reference_state, padded_batch
from .pairs import CRASHES, NOT_COMPARABLE, ReferenceResult, kink_note, reference_verdict, tensor_diff
from .expectations import held_to_reference, registry_groups
from .policy import get_tolerance
from .runs import canonical_grads, load_variant

_TORCH_NAME_PATTERNS = [
    (re.compile(r"(self_attn|src_attn)\.w_([qkv])\.(weight|bias)"),
     lambda m: (f"{'self_attn' if m[1] == 'self_attn' else 'multihead_attn'}.in_proj_{m[3]}", "qkv".index(m[2]))),
    (re.compile(r"(self_attn|src_attn)\.w_o\.(weight|bias)"),
     lambda m: (f"{'self_attn' if m[1] == 'self_attn' else 'multihead_attn'}.out_proj.{m[2]}", None)),
    (re.compile(r"feed_forward\.w_([12])\.(weight|bias)"), lambda m: (f"linear{m[1]}.{m[2]}", None)),
    (re.compile(r"sublayer\.(\d)\.norm\.(weight|bias)"), lambda m: (f"norm{int(m[1]) + 1}.{m[2]}", None)),
]


def nn_transformer_name(name: str) -> tuple[str, int | None]:
    """Canonical stack parameter -> (``nn.Transformer`` parameter, block of ``in_proj`` or None).

    ``encoder.layers.0.self_attn.w_k.weight`` -> (``encoder.layers.0.self_attn.in_proj_weight``, 1);
    ``decoder.layers.1.sublayer.2.norm.bias`` -> (``decoder.layers.1.norm3.bias``, None).

    Raises:
        KeyError: no counterpart in ``nn.Transformer``.
    """
    if re.fullmatch(r"(encoder|decoder)\.norm\.(weight|bias)", name):
        return name, None
    m = re.fullmatch(r"(encoder|decoder)\.layers\.(\d+)\.(.+)", name)
    if m:
        for pat, fn in _TORCH_NAME_PATTERNS:
            mm = pat.fullmatch(m[3])
            if mm:
                tname, block = fn(mm)
                return f"{m[1]}.layers.{m[2]}.{tname}", block
    raise KeyError(f"no nn.Transformer counterpart for canonical parameter {name!r}")


def _unmapped(canon: dict[str, torch.Tensor]) -> str:
    """The first stack parameter of ``canon`` with no ``nn.Transformer`` counterpart (:func:`nn_transformer_name`),
    or ``""``: parameters outside the stacks (embeddings, generator) are not compared and do not count."""
    for name in sorted(canon):
        if name.startswith(("encoder.", "decoder.")):
            try:
                nn_transformer_name(name)
            except KeyError:
                return name
    return ""


def make_nn_transformer(cfg: ModelConfig, norm_first: bool, final_norm: bool = True, bias: bool = True) -> nn.Transformer:
    """``nn.Transformer`` with the check config, batch_first; ``final_norm=False`` builds it with
    ``custom_encoder``/``custom_decoder`` whose ``norm=None`` (no LayerNorm after the stacks);
    ``bias=False`` drops the biases of every Linear and LayerNorm (PyTorch's ``bias`` argument)."""
    d, h, n, ff, p = cfg.d_model, cfg.h, cfg.N, cfg.d_ff, cfg.dropout
    kw = dict(batch_first=True, norm_first=norm_first, bias=bias)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # enable_nested_tensor warning for norm_first=True
        if final_norm:
            return nn.Transformer(d, h, n, n, ff, p, **kw)
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, h, ff, p, **kw), n, norm=None,
                                    enable_nested_tensor=False)
        dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, h, ff, p, **kw), n, norm=None)
        return nn.Transformer(d, h, n, n, ff, p, custom_encoder=enc, custom_decoder=dec, **kw)


_STACK_LN_BIAS = re.compile(r"(encoder|decoder)\.(.+\.)?norm\.bias")


def nn_transformer_structure(variant: Variant, groups=None, registry: Registry | None = None,
                             bias: bool | None = None) -> list[tuple[str, bool, bool, bool, str]]:
    """How ``variant``'s encoder-decoder stack relates to ``nn.Transformer``.

    Returns:
        rows ``(reference label, norm_first, final_norm, bias, reason)``; ``reason`` is empty when the
        structures match and the comparison can run, else it says why it cannot. ``bias=False``
        (projections without biases: no ``self_attn.w_q.bias`` in the canonical state) is compared with
        ``nn.Transformer(bias=False)``, which has no LayerNorm biases either: the variant's LayerNorm
        biases are held at 0 for that comparison (their gradients are not compared).
    """
    registry = registry or Registry.from_plugins()
    groups = registry_groups(registry) if groups is None else groups
    r = variant.resolved()
    reasons = []
    norm_key = reference_key(registry, "norm", r["norm"])
    if norm_key not in ("reference:post", "reference:pre"):
        reasons.append(f"norm={r['norm']} declares a difference from post-norm and pre-norm (the only two "
                       f"nn.Transformer offers, norm_first)")
    if not held_to_reference(registry, "layer_norm", r["layer_norm"], groups):
        reasons.append(f"layer_norm={r['layer_norm']} declares a difference from nn.LayerNorm "
                       f"(biased variance, eps 1e-5 inside the square root)")
    if not held_to_reference(registry, "projections", r["projections"], groups):
        reasons.append(f"projections={r['projections']} declares a difference from nn.Linear")
    if not held_to_reference(registry, "attention", r["attention"], groups):
        reasons.append(f"attention={r['attention']} is not declared equivalent to nn.MultiheadAttention")
    if not held_to_reference(registry, "mask", r["mask"], groups):
        reasons.append(f"mask={r['mask']} is not declared equivalent to nn.Transformer's masks")
    if not held_to_reference(registry, "feed_forward", r["feed_forward"], groups):
        reasons.append(f"feed_forward={r['feed_forward']} declares a difference from the ReLU FFN (nn.Transformer's "
                       f"linear1 / linear2 with activation=relu)")
    if _acts_inside_attention(registry.component("positional", r["positional"])):
        reasons.append(f"positional={r['positional']} acts inside attention (rotates q and k or biases the scores); "
                       f"nn.MultiheadAttention has no place for it")
    first = norm_key == "reference:pre"
    bias = True if bias is None else bias
    label = f"nn.Transformer(norm_first={first}{'' if bias else ', bias=False'})"
    if reasons:
        return [(label, first, True, bias, "; ".join(reasons))]
    if first:
        return [(label, True, True, bias, "")]
    return [(label, False, True, bias,
             "nn.Transformer always appends a final LayerNorm after the encoder and after the decoder "
             "(encoder.norm, decoder.norm); post-norm has none, so the stock module computes a different function "
             "(compared below with norm=None instead)"),
            (f"{label}, encoder/decoder norm=None", False, False, bias, "")]


def _acts_inside_attention(comp) -> bool:
    """Whether a positional component's module rotates q and k or biases the scores (built at the check config)."""
    try:
        mod = comp.factory(sibling_context(CHECK_MODEL, reference_components(positional=comp)))
    except Exception:  # noqa: BLE001 - a component that cannot be built: its own check says why
        return False
    return hasattr(mod, "rotate_qk") or hasattr(mod, "score_bias")


def compare_with_nn_transformer(registry: Registry, variant: Variant, cfg: ModelConfig,
                                state: dict[str, torch.Tensor], *, device: torch.device | str = "cpu",
                                dtype: str = "fp32", seed: int = 0, groups=None) -> list[ReferenceResult]:
    """``variant``'s encoder and decoder stacks vs ``nn.Transformer`` as far as the structures match.

    Both get the same embedded inputs (the variant's embedding + positional output, eval mode), masks
    from the ids (nn.Transformer: ``tgt_mask`` (T, T) True = blocked, ``*_key_padding_mask`` (B, L));
    decoder output (B, T, D) is compared at real target positions and the gradient of every canonical
    stack parameter against its mapped ``nn.Transformer`` gradient.
    """
    device = torch.device(device)
    tol = get_tolerance(dtype, device.type)
    out = []
    probe, _ = load_variant(registry, variant, cfg, state)
    canon = canonical_state_dict(probe)
    has_bias = any(k.endswith("self_attn.w_q.bias") for k in canon)
    other = sorted(k for k, t in canon.items() if k.endswith(("attn.w_k.weight", "attn.w_v.weight"))
                   and tuple(t.shape) != (cfg.d_model, cfg.d_model))
    unmapped = _unmapped(canon)
    for label, first, final, bias, reason in nn_transformer_structure(variant, groups, registry, has_bias):
        if other and not reason:
            reason = (f"{other[0]} has shape {tuple(canon[other[0]].shape)}, not (d_model, d_model): K/V heads shared "
                      f"by groups of query heads, which nn.Transformer's MultiheadAttention cannot hold (the attention "
                      f"component is compared with nn.MultiheadAttention through repeated K/V rows instead)")
        if unmapped and not reason:
            out.append(ReferenceResult(variant.name, label, "equivalent", CRASHES, False, buggy=variant.buggy,
                                       detail=f"cannot be laid onto nn.Transformer: {unmapped!r} has no counterpart "
                                              "there; its component does not export the canonical parameter names "
                                              "(docs/components.md, \"Canonical parameters\")"))
            continue
        if reason:
            out.append(ReferenceResult(variant.name, label, NOT_COMPARABLE, NOT_COMPARABLE, True, detail=reason,
                                       buggy=variant.buggy))
            continue
        note = "" if bias else ("LayerNorm biases held at 0 (nn.Transformer(bias=False) has none); "
                                "their gradients not compared")
        try:
            o, grads = _stack_diffs(registry, variant, cfg, state, (first, final, bias), device, dtype, seed, tol)
            res = reference_verdict(variant.name, label, "equivalent", o, grads, variant.buggy, detail=note)
            if not res.ok and o.within:  # only a gradient is off: a kink met by rounding on this draw, or a fault
                o2, grads2 = _stack_diffs(registry, variant, cfg, _redrawn(state, seed + 1), (first, final, bias),
                                          device, dtype, seed + 1, tol)
                kink = kink_note(res.grad_worst, "nn.Transformer's")
                again = reference_verdict(variant.name, label, "equivalent", o2, grads2, variant.buggy,
                                          detail="; ".join(x for x in (note, kink) if x))
                res = again if again.ok else dataclasses.replace(res, detail="; ".join(
                    x for x in (note, _backward_note(res.grad_worst)) if x))
        except Exception as exc:  # noqa: BLE001
            res = ReferenceResult(variant.name, label, "equivalent", CRASHES, False,
                                  detail=f"crashes: {describe_exception(exc)}", buggy=variant.buggy)
        out.append(res)
    return out


def _stack_diffs(registry, variant, cfg, state, structure, device, dtype, seed, tol):
    """The decoder output's and every gradient's :class:`~harness.checks.pairs.TensorDiff` (``variant`` vs
    ``nn.Transformer`` of ``structure`` = (norm_first, final_norm, bias)) on the padded batch of ``seed``."""
    lp = _stack_pair(registry, variant, cfg, state, *structure, device, dtype, seed)
    hp = _stack_pair(registry, variant, cfg, state, *structure, device, "fp64", seed)
    keep = padded_batch(cfg, seed=seed)[1] != cfg.pad
    o = tensor_diff("decoder output", lp[0], lp[2], hp[0], hp[2], tol, keep)
    return o, [tensor_diff(n, lp[1][n], lp[3][n], hp[1][n], hp[3][n], tol) for n in sorted(lp[1])]


def _redrawn(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Another reference state of the same shapes (:func:`~harness.checks.inputs.draw_reference_state`)."""
    return draw_reference_state({k: tuple(v.shape) for k, v in state.items()}, seed)


def _backward_note(d) -> str:
    """Why a gradient gap with matching outputs that recurs on a second draw is a difference of function."""
    return (f"the outputs agree but {d.name}'s gradient differs on two reference states and batches (float64 runs: "
            f"{d.golden:.3g} apart): the backward is not the derivative of the forward (a detach or straight-through "
            f"trick, a custom autograd.Function), so training follows other gradients than nn.Transformer's")


def stack_model(registry, variant, cfg, state, bias: bool, device, wdtype, stacks: tuple[str, ...]):
    """``(model, canon)``: ``variant`` holding ``state`` in eval mode at ``wdtype`` on ``device``, and its canonical
    parameters under ``stacks`` (name prefixes); with ``bias`` False its LayerNorm biases held at 0 and left out
    (PyTorch's ``bias=False`` has none)."""
    if not bias:
        state = {k: (torch.zeros_like(v) if _STACK_LN_BIAS.fullmatch(k) else v) for k, v in state.items()}
    model, _ = load_variant(registry, variant, cfg, state)
    model = model.to(device, wdtype).eval()
    canon = {k: v for k, v in canonical_state_dict(model).items()
             if k.startswith(stacks) and (bias or not _STACK_LN_BIAS.fullmatch(k))}
    return model, canon


def _stack_pair(registry, variant, cfg, state, norm_first, final_norm, bias, device, dtype, seed):
    wdtype = torch.float64 if dtype == "fp64" else torch.float32
    model, canon = stack_model(registry, variant, cfg, state, bias, device, wdtype, ("encoder.", "decoder."))
    ref = make_nn_transformer(cfg, norm_first, final_norm, bias)
    ref.load_state_dict(torch_state(canon, nn_transformer_name), strict=True)
    ref = ref.to(device, wdtype).eval()
    src, tgt, _ = padded_batch(cfg, seed=seed)
    src, tgt = src.to(device), tgt.to(device)
    with torch.no_grad():
        x_src = model.src_pos(model.embed.src(src))
        x_tgt = model.tgt_pos(model.embed.tgt(tgt))
    r = torch.randn(*tgt.shape, cfg.d_model, generator=torch.Generator().manual_seed(seed + 61))
    weight = r.to(device, wdtype) * (tgt != cfg.pad)[..., None].to(wdtype)
    src_mask, tgt_mask = model.make_masks(src, tgt)
    with autocast(device, dtype):
        ours = model.decoder(x_tgt, model.encoder(x_src, src_mask), src_mask, tgt_mask)
    (ours.to(wdtype) * weight).sum().backward()
    ours_grads = canonical_grads(model)
    ours_grads = {k: v for k, v in ours_grads.items() if k in canon}
    causal_block = ~torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool, device=device).tril()
    with autocast(device, dtype), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = ref(x_src, x_tgt, tgt_mask=causal_block, src_key_padding_mask=src == cfg.pad,
                     tgt_key_padding_mask=tgt == cfg.pad, memory_key_padding_mask=src == cfg.pad)
    (theirs.to(wdtype) * weight).sum().backward()
    their_grads = torch_grads(ref, ours_grads, nn_transformer_name, cfg.d_model)
    return ours.detach().cpu(), ours_grads, theirs.detach().cpu(), their_grads


def torch_state(canon: dict[str, torch.Tensor], name_of) -> dict[str, torch.Tensor]:
    """The PyTorch module's state from canonical stack parameters: ``name_of(canonical) -> (its name, block)``;
    the blocks 0, 1, 2 (q, k, v) of one ``in_proj`` are concatenated, (3D, D) or (3D,)."""
    blocks: dict[str, dict[int, torch.Tensor]] = {}
    state = {}
    for name, t in canon.items():
        tname, block = name_of(name)
        if block is None:
            state[tname] = t.detach()
        else:
            blocks.setdefault(tname, {})[block] = t.detach()
    state.update({k: torch.cat([v[i] for i in range(3)]) for k, v in blocks.items()})
    return state


def torch_grads(ref: nn.Module, names, name_of, d: int) -> dict[str, torch.Tensor]:
    """The gradient of each canonical name in ``names`` from the PyTorch module ``ref`` (after its backward): its
    parameter's, or the (D, ...) block of a packed ``in_proj``; CPU copies."""
    params, out = dict(ref.named_parameters()), {}
    for name in names:
        tname, block = name_of(name)
        gr = params[tname].grad
        out[name] = (gr if block is None else gr[block * d:(block + 1) * d]).detach().cpu().clone()
    return out


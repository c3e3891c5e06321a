"""The ``init`` slot's contract: a scheme draws each canonical tensor from (seed, canonical name) alone.

What pairing needs (paired seeds: variants that share an ``init`` scheme and a canonical layout start from
identical weights) is checked on a layout holding every role the built-in slots export (token embeddings,
generator, learned positions, attention ``w_q`` .. ``w_o`` with biases in both stacks and the decoder's
cross-attention, a ReLU and a gated FFN, LayerNorm gains and biases, a scalar gain):

* every draw is a finite tensor of the tensor's shape;
* drawn again in the reverse order, with the global RNG reseeded and other module values handed over for
  the matrices and biases (a module draws those from the global RNG as it is built), every tensor is bitwise
  the same: a scheme that draws from ``torch.randn`` / ``nn.init`` without ``generator=``, keeps a counter
  between calls or keeps a module's own random matrix or bias gives two variants whose modules are built in
  another order different starts;
* the draws change with the seed: a scheme that ignores its generator starts every seed alike, and the
  spread across seeds that every verdict rests on loses its initialisation part.

Shape letters: V vocabulary, D = d_model.
"""
from __future__ import annotations

import torch

from ..config import ModelConfig
from ..errors import PluginError
from ..init_schemes import draw, tensor_generator, tensor_sites
from ..registry import Component
from .contract_base import CONFORMS, VIOLATES, ComponentResult, component_result, crash_result, \
    reference_components, sibling_context

LABEL = "draws from (seed, canonical name) alone"


def init_layout(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """A canonical layout with every role: ``{name: shape}`` for ``cfg``'s N layers per stack (the encoder with a
    ReLU FFN, the decoder with a gated one and cross-attention)."""
    d, v, f = cfg.d_model, cfg.vocab, cfg.d_ff
    out: dict[str, tuple[int, ...]] = {"embed.src.weight": (v, d), "embed.tgt.weight": (v, d),
                                       "embed.generator.weight": (v, d), "embed.generator.bias": (v,),
                                       "src_pos.weight": (cfg.max_len, d), "tgt_pos.weight": (cfg.max_len, d)}
    ffn = {"encoder": {"w_1": (f, d), "w_2": (d, f)}, "decoder": {"w_gate": (f, d), "w_up": (f, d), "w_down": (d, f)}}
    for stack, attention in (("encoder", ("self_attn",)), ("decoder", ("self_attn", "src_attn"))):
        for i in range(cfg.N):
            layer = f"{stack}.layers.{i}."
            for module in attention:
                for x in "qkvo":
                    out[f"{layer}{module}.w_{x}.weight"], out[f"{layer}{module}.w_{x}.bias"] = (d, d), (d,)
            for name, shape in ffn[stack].items():
                out[f"{layer}feed_forward.{name}.weight"], out[f"{layer}feed_forward.{name}.bias"] = shape, shape[:1]
            for j in range(len(attention) + 1):
                out[f"{layer}sublayer.{j}.norm.weight"] = out[f"{layer}sublayer.{j}.norm.bias"] = (d,)
        out[f"{stack}.norm.weight"] = out[f"{stack}.norm.bias"] = (d,)
    out["encoder.layers.0.sublayer.0.alpha"] = ()
    return out


def module_values(sites, global_seed: int) -> dict[str, torch.Tensor]:
    """What the modules hold before the scheme runs: matrices and the biases beside them random (``nn.Linear`` draws
    them from the global RNG as it is built, so they depend on the build order: ``global_seed`` stands for one
    order), the other vectors fixed as a module makes them (LayerNorm gains 1, its biases and the rest 0)."""
    g = torch.Generator().manual_seed(global_seed)
    drawn = {n for n, site in sites.items()
             if len(site.shape) > 1 or (site.weight is not None and len(site.weight.shape) > 1)}
    return {n: (torch.randn(site.shape, generator=g) if n in drawn
                else torch.ones(site.shape) if n.endswith("norm.weight") else torch.zeros(site.shape))
            for n, site in sorted(sites.items())}


def _draw_all(scheme, sites, names: list[str], seed: int, global_seed: int) -> tuple[dict, dict]:
    """(the module values handed over, the scheme's draws) for ``names`` in that order."""
    held = module_values(sites, global_seed)
    torch.manual_seed(global_seed)
    return held, {n: draw(scheme, sites[n], held[n].clone(), tensor_generator(seed, n)).clone() for n in names}


def _fault(held: dict, first: dict, again: dict, other_seed: dict) -> str:
    """The first broken rule, in words ("" when none)."""
    for name, t in first.items():
        if not bool(torch.isfinite(t).all()):
            return f"{name}: the scheme drew non-finite values"
    moved = [n for n in first if not torch.equal(first[n], again[n])]
    kept = [n for n in moved if torch.equal(first[n], held[n])]
    if kept:
        return (f"{kept[0]} (and {len(kept) - 1} more) keeps the value the module was built with, drawn "
                f"from the global RNG in build order, so variants whose modules are built in another order start "
                f"apart; draw every matrix and every bias beside one (e.g. nn.init.zeros_ for a bias)")
    if moved:
        return (f"{moved[0]} (and {len(moved) - 1} more) drawn in another order with the global RNG reseeded came out "
                f"different: the scheme draws from the global RNG or keeps state between tensors, so variants whose "
                f"modules are built in another order start apart; draw with the generator the harness passes "
                f"(nn.init.*_(t, generator=generator))")
    if all(torch.equal(first[n], other_seed[n]) for n in first):
        return ("every tensor is the same at another seed: the scheme ignores its generator, so every seed starts "
                "alike and the spread across seeds loses its initialisation part")
    return ""


def check_init(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``init`` component (a scheme, :class:`harness.slots.InitScheme`) vs the slot's contract on
    :func:`init_layout`: finite draws of the right shape, the same values in reverse order with the global RNG
    reseeded, and a start that changes with the seed. The global RNG is restored afterwards.

    Returns:
        one result: conforms, or violates with the broken rule named (a wrong shape names the tensor).
    """
    try:
        scheme = comp.factory(sibling_context(cfg, reference_components(init=comp)))
        sites = tensor_sites(init_layout(cfg))
        names = sorted(sites)
        with torch.random.fork_rng(devices=[]):
            held, first = _draw_all(scheme, sites, names, seed, 1234)
            again = _draw_all(scheme, sites, names[::-1], seed, 98765)[1]
            other_seed = _draw_all(scheme, sites, names, seed + 1, 1234)[1]
    except PluginError as exc:  # init() returned no tensor, or one of another shape
        return [component_result(comp, LABEL, VIOLATES, False, diagnosis=str(exc))]
    except Exception as exc:  # noqa: BLE001 - a scheme that raises fails its check
        return [crash_result(comp, LABEL, exc)]
    fault = _fault(held, first, again, other_seed)
    if fault:
        return [component_result(comp, LABEL, VIOLATES, False, diagnosis=fault)]
    return [component_result(comp, LABEL, CONFORMS, True)]

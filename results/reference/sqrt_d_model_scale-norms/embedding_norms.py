"""How large the token embeddings are next to the positional encoding, at initialisation and after
training, with and without the x sqrt(d_model) scale (the notes' reason for the scale: without it
PE "drowns" the embedding). Reads the runs made by this folder's README commands (--save-models)."""
import math
import sys

from harness.api import build_model
from harness.saved import load_model
from variants.positional import sinusoidal_table

SEEDS = range(4)


def rms(w):
    return w.pow(2).mean().sqrt().item()


def embedding_rms(model):
    """RMS of the source and target tables' content rows (tokens 3..V-1), as the encoder/decoder see them."""
    e = model.embed
    return {"src": rms(e.src_lut.weight.detach()[3:]), "tgt": rms(e.tgt_lut.weight.detach()[3:])}


for run in sys.argv[1:]:
    first = load_model(run, "baseline", 0, with_config=True)[1]
    d = first.model.d_model
    pe = rms(sinusoidal_table(64, d)[:first.train.seq_len + 2])  # the positions a copy sequence takes
    print(f"run {run}: d_model {d}, PE RMS {pe:.3f} (positions 0..{first.train.seq_len + 1})")
    for variant, scale in (("baseline", math.sqrt(d)), ("unscaled_embeddings", 1.0)):
        for when in ("init", "trained"):
            ratios = {"src": [], "tgt": []}
            for seed in SEEDS:
                model = build_model(variant, first.model, seed=seed) if when == "init" else load_model(run, variant, seed)
                for side, r in embedding_rms(model).items():
                    ratios[side].append(pe / (r * scale))
            mean = {k: sum(v) / len(v) for k, v in ratios.items()}
            print(f"  {variant:20s} {when:8s} PE / embedding (as added): src {mean['src']:.2f}, tgt {mean['tgt']:.2f}"
                  f"  [seeds: src {min(ratios['src']):.2f}-{max(ratios['src']):.2f}, "
                  f"tgt {min(ratios['tgt']):.2f}-{max(ratios['tgt']):.2f}]")

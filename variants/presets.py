"""Built-in variants: the paper's baseline, one single-slot change each, one variant per study note.

The five study notes, their sources, choices, bugs and open questions: docs/seeds.md.

``baseline`` keeps the paper's choices (Vaswani et al. 2017): post-norm, separate embeddings
(the Annotated Transformer's code does not tie either), annotated attention, bool masks,
``nn.LayerNorm``, x*sqrt(d_model) + PE, biased projections.

The choices of today's implementations (nanoGPT, LLaMA-style code, x-transformers, timm) are in the
group ``modern`` (``--variants group:modern``), kept out of ``all`` so the main job does not grow:
one change from the baseline each, and ``modern``, the LLaMA-style variant with all of them. The
group ``questions`` holds controlled changes that answer the notes' open questions (the
sqrt(d_model) scale; BatchNorm instead of LayerNorm). The group ``init`` holds one change of the
``init`` slot each (``deepnet`` also takes DeepNorm's residual, the other half of DeepNet), also out of
``all``.
"""
from __future__ import annotations

from harness import Variant, hookimpl
from harness.config import WINDOW_DEFAULT

SEED_PRESETS = [
    Variant("seed_000", {"norm": "pre", "layer_norm": "annotated"},
            summary="Annotated-style notes: pre-norm + final LayerNorm, unbiased-std LayerNorm (eps outside "
                    "sqrt), four cloned Linears, bool mask -1e9. Fixed: nothing in the model (its MHA test mask "
                    "masked every position, a test-only bug).",
            source="note 000 (cnblogs / Annotated Transformer code)"),
    Variant("seed_001", {"attention": "d2l", "projections": "bias_free", "layer_norm": "unbiased_var",
                         "positional": "scaled_input_ln"},
            summary="Notebook: post-norm with the stack's LayerNorm on its input, unbiased-variance LayerNorm, "
                    "d2l heads folded into the batch (bias-free), bool masks. Fixed: masked_fill result now "
                    "assigned, masks repeated per head, sqrt(self.d_model) instead of a global, start symbol 1.",
            source="note 001 (Annotated notebook + d2l MHA)"),
    Variant("seed_002", {"norm": "pre", "layer_norm": "annotated", "attention": "happy_llm",
                         "projections": "bias_free", "mask": "additive"},
            summary="happy-llm: pre-norm + final LayerNorm, bias-free projections, float32 softmax, additive "
                    "-inf mask. Fixed: K/V reshaped with their own length, padding mask added, d_ff from config.",
            source="note 002 (Datawhale happy-llm ch. 2)"),
    Variant("seed_003", {"attention": "d2l", "projections": "bias_free", "mask": "valid_lens"},
            summary="d2l 10.7: post-norm AddNorm with nn.LayerNorm, bias-free d2l attention, valid_lens masking "
                    "(-1e6). Fixed: LayerNorm over d_model only (its test normalised over [100, 24]).",
            source="note 003 (d2l §10.7)"),
    Variant("seed_004", {"norm": "pre", "positional": "unscaled_ln"},
            summary="CSDN BERT-style: pre-norm + final LayerNorm, LayerNorm after embedding + PE, no sqrt(d_model). "
                    "Fixed: causal mask made on the input's device as bool, combined with the padding mask.",
            source="note 004 (CSDN article)"),
]


def _modern(name: str, slots: dict, summary: str, source: str) -> Variant:
    return Variant(name, slots, summary=summary, source=source, group="modern")


MODERN = [
    _modern("modern", {"norm": "pre", "layer_norm": "rmsnorm", "positional": "rope", "feed_forward": "swiglu",
                       "projections": "bias_free", "attention": "sdpa_packed"},
            "LLaMA-style: pre-norm + RMSNorm, RoPE, SwiGLU (2/3 d_ff), bias-free projections, packed-QKV SDPA",
            "Touvron et al. 2023 (LLaMA); Narang et al. 2021"),
    _modern("learned_positions", {"positional": "learned"}, "baseline with learned absolute positions",
            "GPT-2 wpe; BERT; Gehring et al. 2017"),
    _modern("rope_positions", {"positional": "rope"}, "baseline with rotary positions (no additive PE)",
            "Su et al. 2021 (RoFormer)"),
    _modern("alibi_positions", {"positional": "alibi"}, "baseline with ALiBi score biases (no additive PE)",
            "Press et al. 2022"),
    _modern("rmsnorm", {"layer_norm": "rmsnorm"}, "baseline with RMSNorm", "Zhang & Sennrich 2019"),
    _modern("gelu_ffn", {"feed_forward": "gelu"}, "baseline with a GELU FFN", "Hendrycks & Gimpel 2016"),
    _modern("swiglu_ffn", {"feed_forward": "swiglu"}, "baseline with a SwiGLU FFN (2/3 d_ff)", "Shazeer 2020"),
    _modern("geglu_ffn", {"feed_forward": "geglu"}, "baseline with a GEGLU FFN (2/3 d_ff)", "Shazeer 2020"),
    _modern("bias_free", {"projections": "bias_free"}, "baseline with bias-free projections", "PaLM; LLaMA"),
    _modern("packed_attention", {"attention": "sdpa_packed"}, "baseline with packed-QKV SDPA attention",
            "nanoGPT; timm"),
    _modern("gqa_attention", {"attention": "gqa"},
            "baseline with grouped-query attention (n_kv_heads K/V heads, default h/2)", "Ainslie et al. 2023; LLaMA-2/3"),
    _modern("sliding_window", {"mask": "sliding_window"},
            "baseline with sliding-window causal self-attention in the decoder (w = model.window, default "
            f"{WINDOW_DEFAULT})", "Mistral (Jiang et al. 2023)"),
    _modern("qk_norm_attention", {"attention": "qk_norm"},
            "baseline with QK-norm (RMSNorm on each head's q and k)", "Gemma 3; Qwen3"),
    _modern("parallel_block", {"norm": "parallel"},
            "baseline with parallel blocks: attention and FFN from one LayerNorm, summed (final LayerNorm)",
            "GPT-J (Wang & Komatsuzaki 2021); PaLM (Chowdhery et al. 2022 §2)"),
    _modern("mqa_attention", {"attention": "mqa"}, "baseline with multi-query attention (one K/V head)",
            "Shazeer 2019; PaLM"),
]


#: Learning-rate stability (group ``stability``, out of ``all``): pre-norm with QK-norm, the block whose
#: learning-rate curve Wortsman et al. 2023 find flat where plain pre-norm's attention logits grow
#: (experiments/wortsman_qk_norm_lr.toml, against ``pre_norm``).
STABILITY = [
    Variant("pre_norm_qk_norm", {"norm": "pre", "attention": "qk_norm"},
            summary="pre_norm with QK-norm (RMSNorm on each head's q and k)",
            source="Wortsman et al. 2023 §3.1.1; Dehghani et al. 2023", group="stability"),
]


#: The notes' open question "why multiply the embeddings by sqrt(d_model)?" (notes 000, 001) as
#: controlled changes, in the group ``questions`` (out of ``all``): the scale dropped with separate
#: embeddings (experiments/sqrt_d_model_scale.toml) and with the paper's tied ones, where the same
#: matrix is the generator (experiments/sqrt_d_model_scale_tied.toml, against shared_embeddings); and,
#: to tell the token-to-PE ratio from the input's magnitude, the same pair with a LayerNorm on the sum,
#: which makes both inputs equally large (experiments/sqrt_d_model_scale_ln.toml).
QUESTIONS = [
    Variant("unscaled_embeddings", {"positional": "unscaled"},
            summary="baseline without the sqrt(d_model) scale of the embeddings (x + PE)",
            source="Vaswani §3.4 ablated; notes 000, 001 ask why the scale", group="questions"),
    Variant("shared_unscaled", {"embedding": "shared", "positional": "unscaled"},
            summary="shared_embeddings without the sqrt(d_model) scale (one matrix for both embeddings and the "
                    "generator, x + PE)",
            source="Vaswani §3.4 ablated; Press & Wolf 2017", group="questions"),
    Variant("embed_ln_scaled", {"positional": "scaled_input_ln"},
            summary="baseline with a LayerNorm on x*sqrt(d_model) + PE (the input's magnitude fixed, the paper's "
                    "token-to-PE ratio; dropout before the norm, note 001's order)",
            source="note 001's input LayerNorm, alone; the sqrt(d_model) question", group="questions"),
    Variant("embed_ln_unscaled", {"positional": "unscaled_ln"},
            summary="baseline with a LayerNorm on x + PE (the input's magnitude fixed, the PE sqrt(d_model) times "
                    "larger against the token; dropout after the norm, note 004's order: compare the two at dropout 0)",
            source="note 004's BERT-style embeddings, alone; the sqrt(d_model) question", group="questions"),
    Variant("no_positions", {"positional": "nope"},
            summary="baseline with no positional encoding (x*sqrt(d_model) only): its logits do not change when "
                    "the source is shuffled",
            source="note 004: why encode positions at all? (Vaswani §3.5 ablated)", group="questions"),
    Variant("batchnorm", {"layer_norm": "batchnorm"},
            summary="baseline with BatchNorm in every LayerNorm's place (statistics over the batch's tokens in "
                    "training): the probes flag it, its trials are invalid but scored",
            source="notes 000, 002, d2l §10.7.3 (note 003): why LayerNorm and not BatchNorm?", group="questions"),
]


def _init(name: str, slots: dict, summary: str, source: str) -> Variant:
    return Variant(name, slots, summary=summary, source=source, group="init")


#: How the weights start, one change each from the baseline (``--variants group:init``): the schemes of the
#: seed tutorials and of the papers (variants/init.py). Pairs with the baseline are the same function at
#: equal weights (``check`` puts them in its class); only training shows what the start changes.
INIT = [
    _init("torch_default_init", {"init": "torch_default"},
          "baseline started from PyTorch's module defaults (nn.Linear U(+-1/sqrt(fan_in)), nn.Embedding N(0, 1))",
          "nn.Linear / nn.Embedding reset_parameters"),
    _init("d2l_init", {"init": "d2l"}, "baseline started as d2l's train_seq2seq does (xavier Linears, N(0, 1) "
          "embeddings)", "d2l train_seq2seq (note 003)"),
    _init("nn_transformer_init", {"init": "nn_transformer"},
          "baseline started as nn.Transformer resets itself (q, k, v from one packed matrix's bound, attention "
          "biases 0)", "torch nn.Transformer._reset_parameters"),
    _init("gpt2_init", {"init": "gpt2"},
          "baseline started from N(0, 0.02) with residual output projections scaled by 1/sqrt(residual layers)",
          "Radford et al. 2019 §2.3; nanoGPT"),
    _init("small_init", {"init": "small"}, "baseline with SmallInit (attention std sqrt(2 / 5D))",
          "Nguyen & Salazar 2019 §2.2"),
    _init("t_fixup_init", {"init": "t_fixup"},
          "baseline (post-norm, LayerNorm kept) with T-Fixup's initialisation only", "Huang et al. 2020"),
    _init("deepnet", {"norm": "deepnorm", "init": "deepnet"},
          "baseline with DeepNet: DeepNorm's residual alpha in post-norm and its beta-scaled initialisation",
          "Wang et al. 2022 (DeepNet)"),
]


def _arch(name: str, slots: dict, summary: str, source: str) -> Variant:
    return Variant(name, slots, summary=summary, source=source, group="architecture",
                   compared_with="" if name == "gpt" else "gpt")


#: The architecture as the one change (``--variants group:architecture``, out of ``all``): the baseline's
#: components in a decoder-only stack and in a prefix LM (Raffel et al. 2020 §3.2 compares the three), and the
#: LLaMA-style ``modern`` components in the decoder-only model they come from (harness/decoder_only.py).
ARCHITECTURE = [
    _arch("gpt", {"architecture": "decoder_only"},
          "baseline's components (post-norm, sinusoidal, ReLU, separate embeddings) in one causal stack over "
          "[source, start, target]; no encoder, no cross-attention",
          "Radford et al. 2018 (GPT) §3.1; Raffel et al. 2020 §3.2.1 (decoder-only LM)"),
    _arch("prefix_lm", {"architecture": "prefix_lm"},
          "gpt with full attention inside the source prefix, causal after it",
          "Raffel et al. 2020 §3.2.1 (prefix LM); UniLM (Dong et al. 2019)"),
    _arch("modern_gpt", {**MODERN[0].slots, "architecture": "decoder_only", "embedding": "shared"},
          "LLaMA-style decoder-only: pre-norm + RMSNorm, RoPE, SwiGLU, bias-free projections, packed-QKV SDPA, "
          "one tied embedding matrix",
          "Touvron et al. 2023 (LLaMA); Press & Wolf 2017 (tying)"),
]


#: The one-change variants of ``group:modern`` in the decoder-only model they come from (``group:modern_lm``, out
#: of ``all``; compared with ``gpt``), and NoPE, which only a causal decoder can do without (Kazemnejad et al.
#: 2023): ``lm_rope_positions``, ``lm_alibi_positions``, ... (experiments/modern_lm_text.toml,
#: experiments/length_generalisation_lm.toml).
MODERN_LM = [
    Variant(f"lm_{v.name}", {**v.slots, "architecture": "decoder_only"},
            summary=(f"gpt with {v.summary[len('baseline with '):]}" if v.summary.startswith("baseline with ")
                     else f"decoder-only: {v.summary}").replace(f", default {WINDOW_DEFAULT}", "").replace(" in the decoder", ""),
            source=v.source, group="modern_lm", compared_with="gpt")
    for v in MODERN[1:]
] + [Variant("lm_no_positions", {"positional": "nope", "architecture": "decoder_only"},
             summary="gpt with no positional encoding (NoPE): order only from the causal mask",
             source="Kazemnejad et al. 2023; Haviv et al. 2022", group="modern_lm", compared_with="gpt")]


@hookimpl
def harness_add_variants():
    return [
        Variant("baseline", {}, summary="the paper's choices: post-norm, separate embeddings, annotated "
                "attention, bool masks", source="Vaswani et al. 2017"),
        Variant("pre_norm", {"norm": "pre"}, summary="baseline with pre-norm (+ final LayerNorm)",
                source="Xiong et al. 2020; Annotated Transformer"),
        Variant("shared_embeddings", {"embedding": "shared"},
                summary="baseline with one matrix for source, target and generator", source="Vaswani §3.4; Press & Wolf 2017"),
        Variant("d2l_attention", {"attention": "d2l"}, summary="baseline with d2l-style folded-head attention",
                source="d2l §10.5"),
        Variant("additive_mask", {"mask": "additive"}, summary="baseline with 0/-inf additive masks",
                source="happy-llm; PyTorch float masks"),
        Variant("torch_attention", {"attention": "torch"},
                summary="baseline with F.scaled_dot_product_attention", source="PyTorch SDPA"),
        *SEED_PRESETS,
        *MODERN,
        *QUESTIONS,
        *STABILITY,
        *INIT,
        *ARCHITECTURE,
        *MODERN_LM,
    ]

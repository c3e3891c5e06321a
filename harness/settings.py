"""The names of the config keys, now and in stored records: the aliases ``--set`` answers with the
right key, parsing ``--set KEY=VALUE``, how stored configs are read and hashed across renames and
added keys (:func:`stored_train`, :func:`hash_view`, :func:`current_view`), and the settings table
(``python -m harness list --settings``) generated from the config dataclasses' fields and the ``Args:``
entries of their docstrings, so there is no second hand-written list.

Imports only :mod:`harness.errors`; :mod:`harness.config` uses it.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import re
from typing import Any

from .errors import ConfigError

#: How the config hash names a key (:func:`hash_view`): ``train.noam_factor`` was called ``lr``
#: before it was renamed, and runs stored then keep their hash; ``train.lr``, the peak learning rate
#: added since, is hashed as ``peak_lr`` so the two never meet.
HASH_NAMES: dict[str, dict[str, str]] = {"train": {"noam_factor": "lr", "lr": "peak_lr"}}

#: The ``train`` keys of a record stored before ``noam_factor`` was renamed from ``lr``: a train
#: table with all of them, ``lr`` among them and no ``noam_factor``, is such a record, and its ``lr``
#: is read as ``noam_factor`` (:func:`stored_train`).
OLD_TRAIN_KEYS = frozenset({"task", "seq_len", "batch", "steps", "lr", "warmup", "schedule", "label_smoothing",
                            "eval_every", "eval_sequences", "eval_seed", "grad_clip", "stop_at_solved"})

#: Config keys added after runs were stored, with their defaults: section -> {name: default}. A
#: key at its default is left out of the hash (:func:`hash_view`), so stored runs stay resumable.
ADDED: dict[str, dict[str, Any]] = {"train": {"beam": 1, "bucket": False, "log_every": 1, "checkpoint_every": "60s",
                                              "optimizer": "adam", "weight_decay": None, "decay_all": False,
                                              "lr": None, "min_lr": 0.0, "decay_fraction": 0.2},
                                    "model": {"n_kv_heads": 0, "window": 0, "lm_layers": 0},
                                    "task": {"split": "hash", "path": ""}}

#: Config sections added after runs were stored: left out of the hash when every key in them is at
#: its default (:func:`hash_view`), so a run stored without the section keeps its hash.
ADDED_SECTIONS = frozenset({"task"})

#: Names that tutorials, other libraries and habit give to a config key, -> the key ``--set`` and
#: experiment files take. Nothing reads an alias: :func:`unknown_key_message` names the key in its
#: error. ``factor`` is the Noam factor, which is not a learning rate (the step size is noam_factor *
#: d_model^-0.5 * min(t^-0.5, t * warmup^-1.5)); the learning-rate names go to ``train.lr``, the peak
#: learning rate of every schedule but ``noam``.
ALIASES: dict[str, str] = {
    **dict.fromkeys(("learning_rate", "base_lr", "peak_lr", "max_lr", "lr_max", "eta"), "train.lr"),
    **dict.fromkeys(("factor", "noam", "lr_factor"), "train.noam_factor"),
    **dict.fromkeys(("final_lr", "eta_min", "lr_min", "end_lr"), "train.min_lr"),
    **dict.fromkeys(("wd", "decay", "l2", "weight_decay_rate"), "train.weight_decay"),
    **dict.fromkeys(("optim", "opt", "optimiser"), "train.optimizer"),
    **dict.fromkeys(("cooldown", "cooldown_fraction", "decay_frac"), "train.decay_fraction"),
    **dict.fromkeys(("heads", "n_heads", "num_heads", "nhead", "n_head", "num_attention_heads"), "model.h"),
    **dict.fromkeys(("layers", "n_layers", "num_layers", "n_layer", "num_blocks", "num_encoder_layers",
                     "num_decoder_layers", "depth"), "model.N"),
    **dict.fromkeys(("d_ffn", "ffn_dim", "dim_ff", "dim_pffn", "dim_feedforward", "d_inner", "d_hidden",
                     "ffn_num_hiddens", "hidden_dim", "intermediate_size"), "model.d_ff"),
    **dict.fromkeys(("dim", "d_embed", "dim_embed", "n_embd", "hidden_size", "num_hiddens", "width"),
                    "model.d_model"),
    **dict.fromkeys(("vocab_size", "n_vocab", "ntoken"), "model.vocab"),
    **dict.fromkeys(("max_seq_len", "max_position_embeddings", "max_length", "n_ctx"), "model.max_len"),
    **dict.fromkeys(("pad_id", "pad_token_id", "padding_idx"), "model.pad"),
    **dict.fromkeys(("batch_size", "bs"), "train.batch"),
    **dict.fromkeys(("n_steps", "num_steps", "max_steps", "iterations", "iters"), "train.steps"),
    **dict.fromkeys(("warmup_steps", "n_warmup", "warmup_iters"), "train.warmup"),
    **dict.fromkeys(("smoothing", "label_smoothing_eps"), "train.label_smoothing"),
    **dict.fromkeys(("clip", "clip_grad", "max_grad_norm"), "train.grad_clip"),
    **dict.fromkeys(("length", "sequence_length"), "train.seq_len"),
    **dict.fromkeys(("scheduler", "lr_schedule", "lr_scheduler"), "train.schedule"),
    **dict.fromkeys(("p_drop", "drop_prob", "dropout_rate", "hidden_dropout_prob"), "model.dropout"),
}

#: What an alias's error adds, by the key it names.
ALIAS_NOTES = {
    "train.noam_factor": " (the Noam factor, not a learning rate: the step size is noam_factor * d_model^-0.5 * "
                         "min(t^-0.5, t * warmup^-1.5))",
    "train.lr": " (the peak learning rate of every schedule but noam, which takes train.noam_factor)",
}


def unknown_key_message(key: str, sections: tuple[str, ...], known: dict[str, set[str]],
                        candidates: list[str]) -> str:
    """The one-line error for an unknown ``--set`` key: the key an alias stands for
    (:data:`ALIASES`), the same name in another section, or the closest keys
    (``difflib.get_close_matches``).

    Args:
        key: ``section.name`` as given. sections: the sections the caller takes. known: section ->
            its key names. candidates: every dotted key, in the order to list them.
    """
    section, _, name = key.rpartition(".")
    if not section and len(sections) == 1:
        section = sections[0]
    if section in known and section not in sections:
        return f"{key!r}: only {' and '.join(s + '.<name>' for s in sections)} keys apply here"
    if section and section not in known:
        where = f"unknown config section {section!r} in {key!r}"
    else:
        where = f"unknown config key {key!r}" if section else f"config key {key!r} needs its section"
    candidates = [k for k in candidates if k.partition(".")[0] in sections]
    alias = ALIASES.get(name) or ALIASES.get(name.lower())
    if alias and alias.partition(".")[0] in sections:
        return f"{where}; {name!r} is called {alias!r} here{ALIAS_NOTES.get(alias, '')}"
    names = [c.partition(".")[2] for c in candidates]
    close = set(difflib.get_close_matches(name, names, n=3, cutoff=0.6))
    close |= set(difflib.get_close_matches(name.lower(), [n.lower() for n in names], n=3, cutoff=0.6))
    guesses = [k for k in candidates if k.partition(".")[2] == name] + \
        [k for k in candidates if k.partition(".")[2] in close or k.partition(".")[2].lower() in close]
    guesses = list(dict.fromkeys(guesses))[:3]
    hints = ["did you mean " + ", ".join(repr(g) for g in guesses) + "?"] if guesses else \
        ["keys: " + ", ".join(candidates)]
    return f"{where}; " + "; ".join(hints)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["train.steps=200", "model.d_model=128"]`` (``--set KEY=VALUE``) -> ``{"train.steps": 200, ...}``;
    values are Python literals where they parse (``ast.literal_eval``), else the raw string.

    Raises:
        ConfigError: an item without ``=`` or without a key.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE (e.g. train.steps=200), got {item!r}")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        out[key.strip()] = value
    return out


#: An ``Args:`` entry's first line: one or more names (``pad, smoothing:``), a colon, the text.
_ENTRY = re.compile(r"(\w+(?:\s*,\s*\w+)*):\s*(.*)")


def field_docs(cls: type) -> dict[str, str]:
    """name -> the text of its entry in ``cls``'s docstring ``Args:`` section (continuation lines
    joined, whitespace collapsed); an entry naming several fields (``a, b: ...``) gives each the text."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    out: dict[str, str] = {}
    lines = doc.splitlines()
    if "Args:" not in lines:
        return out
    body, indent, current = lines[lines.index("Args:") + 1:], None, []
    for line in body + ["End:"]:
        stripped = line.strip()
        depth = len(line) - len(line.lstrip())
        if stripped and depth == 0:  # the next section (Raises:, Attributes:) ends the entries
            line, stripped, depth = "", "", -1
        indent = depth if indent is None and stripped else indent
        match = _ENTRY.fullmatch(stripped) if depth == indent else None
        if (match or depth < 0) and current:
            for name in current[0]:
                out[name] = " ".join(" ".join(current[1:]).split())
            current = []
        if depth < 0:
            break
        if match:
            current = [[n.strip() for n in match.group(1).split(",")], match.group(2)]
        elif current and stripped:
            current.append(stripped)
    return out


def setting_rows(sections: dict[str, type]) -> list[dict[str, str]]:
    """One row per config key (``python -m harness list --settings``): ``key`` (``section.name``),
    ``type`` (``float or None``: None means not set), ``default`` and ``meaning`` (:func:`field_docs`, as
    plain text: reST roles and literals unmarked; empty where the docstring has no entry)."""
    rows = []
    for section, cls in sections.items():
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            kind = (f.type if isinstance(f.type, str) else f.type.__name__).replace(" | ", " or ")
            meaning = re.sub(r":\w+:`~?([^`]+)`", r"\1", docs.get(f.name, "")).replace("``", "")
            rows.append({"key": f"{section}.{f.name}", "type": kind, "default": repr(default), "meaning": meaning})
    return rows


def stored_train(data: Any) -> Any:
    """A train table as this code reads it: a record stored before the rename (:data:`OLD_TRAIN_KEYS`,
    no ``noam_factor``) with its ``lr`` under ``noam_factor``; any other table unchanged."""
    if isinstance(data, dict) and OLD_TRAIN_KEYS <= data.keys() and "noam_factor" not in data:
        data = {("noam_factor" if k == "lr" else k): v for k, v in data.items()}
    return data


def hash_view(config: dict) -> dict:
    """A config dict (``RunConfig.to_dict()`` or a stored one) as its hash sees it: a stored train
    table read as today (:func:`stored_train`), keys named as :data:`HASH_NAMES` says (so runs stored
    before a rename keep their hash) and keys added since at their default left out (:data:`ADDED`), an
    added section (:data:`ADDED_SECTIONS`) with nothing left in it too."""
    out = {}
    for section, table in config.items():
        if section == "train":
            table = stored_train(table)
        names = HASH_NAMES.get(section, {})
        added = ADDED.get(section, {})
        out[section] = {names.get(k, k): v for k, v in table.items() if k not in added or v != added[k]} \
            if isinstance(table, dict) else table
        if section in ADDED_SECTIONS and out[section] == {}:
            del out[section]
    return out


def current_view(config: dict) -> dict:
    """A stored config dict as this code reads it: an old train record's ``lr`` under ``noam_factor``
    (:func:`stored_train`) and a key or section added since the run was stored at its default (:data:`ADDED`,
    the value that keeps the older code's behaviour). What ``compare`` lists as config differences."""
    out = {}
    for section, table in {**dict.fromkeys(ADDED_SECTIONS, {}), **config}.items():
        if isinstance(table, dict):
            table = {**ADDED.get(section, {}), **(stored_train(table) if section == "train" else table)}
        out[section] = table
    return out


def noam_lr_message(lr: float, warmup: int, d_model: int | None) -> str:
    """The one-line refusal of ``train.lr`` with the ``noam`` schedule: what ``train.lr`` meant before
    (the Noam factor) and what to set instead."""
    if d_model is None:
        meant, want = "noam_factor * d_model^-0.5 * warmup^-0.5", "lr * sqrt(d_model * warmup)"
    else:
        meant = f"{lr:g} * {d_model}^-0.5 * {warmup}^-0.5 = {lr * (d_model * warmup) ** -0.5:.3g}"
        want = f"{lr * (d_model * warmup) ** 0.5:.4g}"
    return (f"train.lr={lr:g} is a peak learning rate, which the noam schedule does not take (train.lr once "
            f"set the Noam factor: a peak step size of {meant}); for a peak of {lr:g} set "
            f"train.noam_factor={want}, or keep train.lr and choose train.schedule=cosine, linear, wsd or constant")

"""Saved models: ``run --save-models`` keeps each trial's final weights under the run, and a
stored run's model can be rebuilt and used on new input.

The path of the weights, for every executor (in this process, a process pool, Ray):

1. the trial (:func:`keep_weights`, the last step of ``harness.train._run``) serialises the
   trained model's ``state_dict`` (``torch.save``, CPU tensors) into its result as bytes under
   :data:`WEIGHTS_KEY` when its spec says ``save_model``;
2. the run, before it stores the trial (:func:`store_weights`, called by
   :func:`harness.runner.execute`), writes them atomically to ``models/<trial key>.pt`` and puts
   ``{"file", "sha256", "bytes"}`` in their place under :data:`MODEL_KEY`, so the trial file
   (itself checksummed) records the weights' SHA-256;
3. ``python -m harness verify`` checks every recorded file against its SHA-256
   (:func:`model_problems`); :func:`load_model` checks it too before it loads.

:func:`load_model` rebuilds the module from the trial's stored spec (the variant's slots, the
config, the plugins) exactly as the trial built it, then loads the weights; :func:`decode_texts`
runs the task's own decoding (:func:`harness.tasks.decoding.beam_search`, greedy at ``beam=1``)
on new input read and written by the task (:meth:`harness.Task.encode_input`,
:meth:`harness.Task.decode_output`; g2p: letters in, ARPAbet out).
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .errors import ConfigError, StoreError
from .trial import TrialResult, TrialSpec, trial_key
from .verification import MODEL_KEY, MODELS_DIR, model_problems

if TYPE_CHECKING:
    import torch

#: Result key of the serialised weights between the trial and the store (never stored).
WEIGHTS_KEY = "weights"


def keep_weights(spec: TrialSpec, result, model: torch.nn.Module) -> None:
    """Attach ``model``'s ``state_dict`` (bytes of ``torch.save``, tensors on the CPU) to the
    :class:`harness.trial.TrialResult` ``result`` when ``spec.save_model``; else do nothing."""
    if not spec.save_model:
        return
    import torch

    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buf)
    result.extra[WEIGHTS_KEY] = buf.getvalue()


def with_save_model(specs: list[TrialSpec]) -> list[TrialSpec]:
    """Copies of the planned trials ``specs`` that ask for their weights (``save_model``)."""
    return [dataclasses.replace(ts, save_model=True) for ts in specs]


def store_weights(root: Path, key: str, result: TrialResult) -> None:
    """Move the weights a trial returned (:data:`WEIGHTS_KEY` in ``result.extra``) to
    ``root/models/<key>.pt`` (atomic) and record their file, SHA-256 and size in ``result.extra``
    (:data:`MODEL_KEY`). A result without weights is left as it is."""
    data = result.extra.pop(WEIGHTS_KEY, None)
    if data is None:
        return
    from .store import atomic_write_bytes

    rel = f"{MODELS_DIR}/{key}.pt"
    (Path(root) / MODELS_DIR).mkdir(exist_ok=True)
    atomic_write_bytes(Path(root) / rel, data)
    result.extra[MODEL_KEY] = {"file": rel, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}




def load_model(run, variant: str, seed: int = 0, point: str = "", *, device: str = "cpu",
               results_dir: str = "results", with_config: bool = False):
    """The trained model of one trial of a run made with ``--save-models``, in eval mode.

    Args:
        run: a run folder, a run id under ``results_dir`` or ``latest``.
        variant, seed, point: the trial (``point``: the sweep point's name, ``""`` without a sweep).
        device: where the module is put (``cpu``, ``cuda``).
        with_config: return ``(model, RunConfig, Task)`` instead of the model alone.

    Returns:
        harness.model.EncoderDecoder: built from the trial's stored spec (its variant's slots,
        config and plugins), weights from ``models/<key>.pt``; ``model(src, tgt)`` gives logits
        (B, T, V) for ids ``src`` (B, S) and ``tgt`` (B, T).

    Raises:
        StoreError: no such run, or its weights file is missing or fails its checksum.
        ConfigError: no such trial, or the run was made without ``--save-models``.

    Warns:
        HarnessWarning: this checkout's code (the project's source or a plugin file) differs from the
            code that trained the trial (:func:`warn_if_code_changed`).
    """
    import torch

    from .config import RunConfig
    from .lookup import resolve_run
    from .model import build_model
    from .registry import Variant
    from .trial import registry_for

    store = resolve_run(str(run), results_dir)
    key = trial_key(variant, int(seed), point)
    spec = next((t for t in store.meta().trials or [] if t.key == key), None)
    if spec is None:
        have = ", ".join(t.key for t in store.meta().trials or []) or "none"
        raise ConfigError(f"run {store.root} has no trial {key!r} (variant {variant!r}, seed {seed}); its trials: {have}")
    trial = store.read_trial(store.trial_path(key), quarantine=False)
    rec = trial.extra.get(MODEL_KEY) if trial is not None else None
    if not rec:
        raise ConfigError(f"trial {key} of {store.root} kept no weights: it was run without --save-models "
                          f"(python -m harness run ... --save-models)" if trial else
                          f"trial {key} of {store.root} is not stored (an interrupted run: resume it first)")
    problems = model_problems(store.root, [trial])
    if problems:
        raise StoreError(f"{store.root}: {problems[0]}")
    warn_if_code_changed(store, key, spec.plugins)
    cfg = RunConfig.from_dict(spec.config)
    registry = registry_for(spec.plugins)
    model = build_model(registry, Variant(spec.variant, dict(spec.slots)), cfg.model, seed=spec.seed)
    state = torch.load(io.BytesIO((store.root / rec["file"]).read_bytes()), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    model = model.to(device).eval()
    return (model, cfg, registry.task(cfg.train.task).for_config(cfg)) if with_config else model


def warn_if_code_changed(store, key: str, plugins: dict | None) -> None:
    """One :class:`harness.errors.HarnessWarning` line when the code that would rebuild trial ``key`` of
    ``store`` (the project's source and the plugin files of ``plugins``, ``PluginSpec.to_dict()``)
    differs from the code that trained it (:func:`harness.provenance.trial_code`); nothing when the
    run recorded no code."""
    import warnings

    from .errors import HarnessWarning
    from .plugins import PluginSpec
    from .provenance import code_changes, current_code, trial_code

    trained = trial_code(store.meta(), key)
    if trained is None:
        return
    changes = code_changes(trained, current_code(PluginSpec.from_dict(plugins)).record)
    if changes:
        warnings.warn(f"trial {key} of {store.root} was trained by other code than this: {'; '.join(changes)} "
                      f"(the weights now run through the new code)", HarnessWarning, stacklevel=3)


def decode_texts(model, cfg, task, texts: Sequence[str], beam: int = 1, device: str = "cpu") -> list[str]:
    """The task's decoding of new input: each text read by ``task.encode_input``, decoded by beam
    search of width ``beam`` (1: greedy; at most ``model.max_len - 1`` tokens), written by
    ``task.decode_output``.

    Raises:
        ConfigError: an input the task cannot read, or ``beam < 1``.
    """
    import torch

    from .tasks.base import PAD
    from .tasks.decoding import beam_search

    if beam < 1:
        raise ConfigError(f"--beam must be >= 1, got {beam}")
    rows = [task.encode_input(t, cfg) for t in texts]
    width = max(len(r) for r in rows)
    src = torch.tensor([r + (PAD,) * (width - len(r)) for r in rows], dtype=torch.long, device=device)  # (B, S)
    hyps = beam_search(model, src, cfg.model.max_len - 1, beam, cfg.model.pad)
    return [task.decode_output(h, cfg) for h in hyps]

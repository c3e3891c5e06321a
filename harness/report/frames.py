"""Loading a stored run into pandas and ordering it: trial and curve frames, variant and point order.

:data:`METRICS` names the metrics a report or ``compare`` can use; :data:`TRAINED` the trial
statuses that trained to the end. Nothing here knows about experiments or commands.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..runmeta import RunMeta
from ..slots import slot_columns

from ..store import RunStore

#: The main slots' trial-table columns (``slot_norm`` ...), from the slots' declarations (``Slot.main``).
SLOT_COLS = slot_columns()

#: metric -> (higher is better, label with unit). Metrics a report or compare can use.
METRICS: dict[str, tuple[bool, str]] = {
    "heldout_ce": (False, "held-out cross-entropy (nats/token, unsmoothed)"),
    "exact_match": (True, "held-out exact-match (fraction of sequences)"),
    "heldout_token_acc": (True, "held-out token accuracy (teacher forcing)"),
    "final_train_loss": (False, "final training loss (label-smoothed, nats/token)"),
    "early_loss": (False, "early training loss (mean of the first 10 steps)"),
    "steps_to_solve": (False, "steps to held-out exact-match >= 0.99"),
    "wer": (False, "word error rate (share of held-out words matching no reference pronunciation; "
                   "free-running decoding)"),
    "per": (False, "phoneme error rate (edit distance to the closest reference / its phonemes; "
                   "free-running decoding)"),
}
#: Metrics only some tasks report (``g2p``): shown, compared and plotted where the trials have them.
RATE_METRICS = ("wer", "per")
DEFAULT_METRIC = "heldout_ce"

#: Statuses of trials that trained to the end: ``invalid`` trials (a failed integrity probe, see
#: :func:`harness.checks.probes.integrity_reasons`) keep their numbers in the tables but never get a verdict.
TRAINED = ("ok", "invalid")


def invalid_variants(df: pd.DataFrame) -> dict[str, list[str]]:
    """variant -> the distinct reasons its trials were marked ``invalid`` (first reason of each trial)."""
    if df.empty or "status" not in df:
        return {}
    out: dict[str, list[str]] = {}
    for r in df[df["status"] == "invalid"].itertuples():
        reason = str(getattr(r, "reason", "") or "")
        first = reason.split("; ")[0]
        lst = out.setdefault(r.variant, [])
        if first not in lst:
            lst.append(first)
    return out


# ----------------------------------------------------------------------------- loading

def trials_frame(store: RunStore) -> pd.DataFrame:
    """One row per stored trial (the ``row`` dicts), ``point`` filled with "" when absent."""
    rows = [{k: v for k, v in t.row.items() if k != "traceback"} for t in store.load_trials()]
    df = pd.DataFrame(rows)
    if len(df) and "point" not in df.columns:
        df["point"] = ""
    if len(df):
        df["point"] = df["point"].fillna("")
    return df


def curves_frame(store: RunStore) -> pd.DataFrame:
    """Every curve row of every trial with its variant, seed and point."""
    return pd.DataFrame([{"variant": t.row["variant"], "seed": t.row["seed"], "point": t.row.get("point", "") or "", **c}
                         for t in store.load_trials() for c in t.curve])


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    if col not in df:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[col], errors="coerce")


def variant_order(df: pd.DataFrame, baseline: str | None, meta: RunMeta | None = None) -> list[str]:
    """Baseline first, then the run's variant order (name order), then anything else."""
    present = list(dict.fromkeys(df["variant"])) if len(df) else []
    order = [v for v in (meta.variants if meta else []) if v in present]
    order += sorted(v for v in present if v not in order)
    if baseline in order:
        order.remove(baseline)
        order.insert(0, baseline)
    return order


def point_order(df: pd.DataFrame, meta: RunMeta | None = None) -> list[str]:
    """Sweep points in plan order (``config.json`` ``points``), "" (no sweep) first."""
    present = list(dict.fromkeys(df["point"])) if len(df) else [""]
    planned = list(meta.points or {}) if meta else []
    order = [p for p in planned if p in present]
    order += [p for p in present if p not in order]
    return order


def resolve_baseline(df: pd.DataFrame, meta: RunMeta | None = None, baseline: str | None = None) -> str | None:
    """The explicit baseline (None when absent from the run), ``baseline`` when present, else the first variant.

    A caller that has a preferred baseline (an experiment's) passes it as ``baseline``.
    """
    if not len(df):
        return baseline
    present = set(df["variant"])
    if baseline:
        return baseline if baseline in present else None
    if "baseline" in present:
        return "baseline"
    order = variant_order(df, None, meta)
    return order[0] if order else None



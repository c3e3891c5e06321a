"""Checking an experiment's published claims against a run, and its failure analysis.

:func:`evaluate_claim` dispatches on the claim's ``check`` (:data:`CLAIM_CHECKS`); each check
returns ``(status, evidence)`` with status ``reproduced``, ``not reproduced`` or
``inconclusive``. :func:`failed_mask` and :func:`failure_frame` apply the experiment's
definition of "failed to converge"; :func:`departures` states where the run departs from the
paper's picture.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .. import stats
from ..report import point_order, resolve_baseline, variant_order
from ..runmeta import RunMeta
from ..trial import NO_RESULT
from .spec import MODEL_FIELDS, Experiment, _eval_expr


def failure_definition(exp: Experiment) -> str | None:
    """The experiment's definition of "failed to converge", in words (None when it has none)."""
    conds = [f"{m} < {t:g}" for m, t in exp.analysis.get("fail_if_below", {}).items()]
    conds += [f"{m} > {t:g}" for m, t in exp.analysis.get("fail_if_above", {}).items()]
    if not conds:
        return None
    return ("a run **failed to converge** when it diverged (non-finite loss or gradient norm) or, at the end "
            "of training, " + " or ".join(conds) + " (a missing value counts as failed)")


def failed_mask(df, exp: Experiment):
    """Boolean Series over ``df``: failed to converge (see :func:`failure_definition`)."""
    failed = df["status"] != "ok"
    for m, t in exp.analysis.get("fail_if_below", {}).items():
        v = pd.to_numeric(df.get(m), errors="coerce")
        failed |= ~(v >= t)
    for m, t in exp.analysis.get("fail_if_above", {}).items():
        v = pd.to_numeric(df.get(m), errors="coerce")
        failed |= ~(v <= t)
    return failed


def failure_frame(df, exp: Experiment, meta: RunMeta):
    """Per (variant, point) failure counts and converged-only quality, plus a pooled row per variant."""
    ran = df[~df["status"].isin(NO_RESULT)].copy()
    ran["_failed"] = failed_mask(ran, exp)
    baseline = resolve_baseline(df, meta, exp.baseline)
    rows = []
    for point in point_order(ran, meta) + ["(all points)"]:
        for v in variant_order(ran, baseline, meta):
            g = ran[ran["variant"] == v] if point == "(all points)" else ran[(ran["variant"] == v) & (ran["point"] == point)]
            if g.empty:
                continue
            k, n = int(g["_failed"].sum()), len(g)
            lo, hi = stats.wilson_interval(k, n)
            conv = g[~g["_failed"]]
            rows.append({"point": point, "variant": v,
                         "failed x/n [Wilson 95%]": f"{k}/{n} [{lo:.2f}, {hi:.2f}]",
                         "diverged": int((g["status"] == "diverged").sum()),
                         "converged": len(conv),
                         "converged: held-out CE IQM [95% CI]": stats.fmt_ci(*stats.iqm_ci(conv["heldout_ce"].to_numpy(float))),
                         "converged: exact-match IQM [95% CI]": stats.fmt_ci(*stats.iqm_ci(conv["exact_match"].to_numpy(float))),
                         "_k": k, "_n": n, "_lo": lo, "_hi": hi})
    return pd.DataFrame(rows)


def departures(exp: Experiment, df, rows, baseline, metric, meta) -> list[str]:
    """Data-driven statements of where this run departs from the paper's picture (plain sentences)."""
    out: list[str] = set_on_top_note(meta)
    if df is None or len(df) == 0:
        return out
    for c in exp.claims:
        try:
            status, _ = evaluate_claim(c, exp, df, rows, baseline, metric, meta)
        except (KeyError, ValueError):
            continue
        if status != "reproduced":
            out.append(f"The claim \"{c['text']}\" is **{status}** here (numbers under Claims checked).")
    if exp.kind == "grad_norm_at_init":
        ok = df[df["status"] == "ok"]
        for v in dict.fromkeys(ok["variant"]):
            g = ok[ok["variant"] == v]
            theory = exp.measure.get("theory_slope", {}).get(v)
            Ns = sorted(set(int(n) for n in g["N"]))
            if theory is None or len(Ns) < 2:
                continue
            for stack in ("decoder", "encoder"):
                sl, lo, hi = stats.loglog_slope_ci(Ns, [g[g["N"] == n][f"{stack[:3]}_last"].to_numpy(float) for n in Ns])
                if not math.isnan(lo) and not lo <= theory <= hi:
                    how = ("shrinks more slowly with N than" if theory < 0 and sl > theory else
                           "shrinks faster with N than" if sl < theory else "grows with N, unlike")
                    out.append(f"{v} ({g.iloc[0].get('slot_norm')}-norm), last {stack} layer: slope {sl:.2f} "
                               f"[95% CI {lo:.2f}, {hi:.2f}] excludes the theoretical {theory:g}; the gradient norm "
                               f"{how} Theorem 1 predicts.")
        return out
    ran = df[~df["status"].isin(NO_RESULT)]
    if exp.analysis and len(ran):
        failed = failed_mask(ran, exp)
        n_div = int((ran["status"] == "diverged").sum())
        if failed.any() and n_div == 0:
            out.append(f"No run diverged (no non-finite loss or gradient norm): all {int(failed.sum())} runs counted "
                       f"as failed to converge ended below the threshold at the end of the budget, a plateau or a "
                       f"run too slow for {meta.config.get('train', {}).get('steps')} steps; this "
                       f"miniature does not tell the two apart.")
        for c in exp.claims:
            if c["check"] != "failure_rate_greater":
                continue
            for point in dict.fromkeys(ran["point"]):
                g = ran[(ran["variant"] == c["b"]) & (ran["point"] == point)]
                k = int(failed_mask(g, exp).sum()) if len(g) else 0
                if len(g) and k / len(g) >= 0.5:
                    where = f" at {point}" if point else ""
                    out.append(f"{c['b']} also failed to converge{where} ({k}/{len(g)} seeds): its advantage over "
                               f"{c['a']} does not hold there.")
    if rows and all(r.solved == 0 for r in rows):
        steps = meta.config.get("train", {}).get("steps")
        out.append(f"No run reached held-out exact-match >= 0.99 within {steps} steps, so quality is compared "
                   f"before the task is solved.")
    return out




def set_on_top_note(meta) -> list[str]:
    """One sentence when the run set config keys on top of its experiment file (``--set``, stored as
    ``cli_overrides``; e.g. ``--set train.task=sort`` on a file written for copy): the claims' text and
    the notes are the file's, so the report says they are read for other values. ``seeds=`` only
    changes the sample and is not named. Empty otherwise."""
    changed = [o for o in meta.cli_overrides or [] if not str(o).startswith("seeds=")]
    if not changed:
        return []
    return [f"This run sets {', '.join(changed)} on top of the experiment file (--set). The claims' text and "
            "the setup notes are the file's, written for its own values: read them for this run's."]


def evaluate_claim(c: dict, exp: Experiment, df, rows, baseline, metric, meta) -> tuple[str, str]:
    """(status, evidence) for one claim; status is reproduced / not reproduced / inconclusive.

    Raises:
        ValueError: an unknown ``check``.  KeyError: a claim without a key its check needs.
    """
    if df is None or len(df) == 0:
        return "inconclusive", "no data"
    check = CLAIM_CHECKS.get(c["check"])
    if check is None:
        raise ValueError(f"unknown check {c['check']!r}")
    return check(c, exp, df, rows, baseline, metric, meta)


def _params_difference(c: dict, exp: Experiment, df, rows, baseline, metric, meta) -> tuple[str, str]:
    pa = df[df["variant"] == c["a"]]["params"].dropna()
    pb = df[df["variant"] == c["b"]]["params"].dropna()
    if pa.empty or pb.empty:
        return "inconclusive", f"{c['a']} or {c['b']} has no parameter count in this run"
    cfg = meta.config.get("model", {})
    expected = _eval_expr(str(c["expected"]), {k: cfg[k] for k in MODEL_FIELDS if k in cfg})
    got = int(pa.iloc[0]) - int(pb.iloc[0])
    ok = got == expected
    return ("reproduced" if ok else "not reproduced",
            f"params({c['a']}) - params({c['b']}) = {int(pa.iloc[0])} - {int(pb.iloc[0])} = {got}; "
            f"expected {c['expected']} = {expected} (V={cfg.get('vocab')}, d_model={cfg.get('d_model')}).")


def _verdict(c: dict, exp: Experiment, df, rows, baseline, metric, meta) -> tuple[str, str]:
    want = c["expected"]
    invalid = [r for r in rows if r.variant in (c["variant"], baseline) and r.invalid]
    if invalid:
        return "inconclusive", (f"{invalid[0].variant} is invalid (it failed an integrity probe: "
                                f"{invalid[0].invalid[0]}); no verdict is drawn from it")
    found = [r for r in rows if r.variant == c["variant"] and r.comparison is not None
             and (c.get("point") is None or r.point == c.get("point"))]
    if not found:
        return "inconclusive", f"no paired comparison of {c['variant']} with {baseline} in this run"
    if all(r.same_function for r in found):  # check proves the same function: the outcomes are rounding
        return ("reproduced" if want == "equivalent" else "not reproduced",
                f"check proves {c['variant']} computes the same function as {baseline}: their differences are "
                f"floating-point rounding (expected: {want}).")
    parts, statuses = [], []
    for r in found:
        cmp_ = r.comparison
        where = f" at {r.point}" if r.point else ""
        parts.append(f"P({c['variant']} > {baseline}){where} on {metric} = "
                     f"{stats.fmt_ci(cmp_.p, cmp_.low, cmp_.high, 2)} (Wilson 95%) over {cmp_.n_pairs} paired seeds -> "
                     f"{cmp_.label()}")
        statuses.append("reproduced" if cmp_.verdict == want else
                        "inconclusive" if cmp_.verdict == "no claim" else "not reproduced")
    status = ("not reproduced" if "not reproduced" in statuses else
              "reproduced" if all(s == "reproduced" for s in statuses) else "inconclusive")
    return status, "; ".join(parts) + f" (expected: {want})."


def _failure_rate_greater(c: dict, exp: Experiment, df, rows, baseline, metric, meta) -> tuple[str, str]:
    ran = df[~df["status"].isin(NO_RESULT)].copy()
    ran["_failed"] = failed_mask(ran, exp)
    pts = point_order(ran, meta)
    ga = [ran[(ran["variant"] == c["a"]) & (ran["point"] == p)]["_failed"].to_numpy(bool) for p in pts]
    gb = [ran[(ran["variant"] == c["b"]) & (ran["point"] == p)]["_failed"].to_numpy(bool) for p in pts]
    if not any(len(g) for g in ga) or not any(len(g) for g in gb):
        return "inconclusive", f"{c['a']} or {c['b']} has no runs"
    keep = [i for i in range(len(pts)) if len(ga[i]) and len(gb[i])]
    ga, gb, pts = [ga[i] for i in keep], [gb[i] for i in keep], [pts[i] for i in keep]
    d, lo, hi = stats.rate_difference_ci(ga, gb)
    ka, na = int(sum(g.sum() for g in ga)), sum(len(g) for g in ga)
    kb, nb = int(sum(g.sum() for g in gb)), sum(len(g) for g in gb)
    per = "; ".join(f"{p or 'all'}: {int(a.sum())}/{len(a)} vs {int(b.sum())}/{len(b)}" for p, a, b in zip(pts, ga, gb))
    if math.isnan(lo):
        status = "inconclusive"
    else:  # significant in the predicted direction / no effect or the opposite one / a CI covering 0
        status = "reproduced" if lo > 0 else "not reproduced" if d <= 0 else "inconclusive"
    return status, (f"failed to converge: {c['a']} {ka}/{na}, {c['b']} {kb}/{nb}; pooled difference "
                    f"{d:+.2f} [95% CI {lo:+.2f}, {hi:+.2f}] (Newcombe hybrid score interval); per point: {per}.")


def _slope(c: dict, exp: Experiment, df, rows, baseline, metric, meta) -> tuple[str, str]:
    stack = c.get("stack", "decoder")
    col = f"{stack[:3]}_last"
    g = df[(df["variant"] == c["variant"]) & (df["status"] == "ok")]
    if g.empty or col not in g:
        return "inconclusive", f"no measurements of {c['variant']}"
    Ns = sorted(set(int(n) for n in g["N"]))
    s, lo, hi = stats.loglog_slope_ci(Ns, [g[g["N"] == n][col].to_numpy(float) for n in Ns])
    a, b = c["within"]
    status = ("reproduced" if a <= lo and hi <= b else
              "not reproduced" if hi < a or lo > b else "inconclusive")
    return status, (f"{stack} last-layer slope for {c['variant']} = {s:.3f} [95% CI {lo:.3f}, {hi:.3f}] over "
                    f"N = {Ns}; predicted range [{a}, {b}].")


def _ratio_greater(c: dict, exp: Experiment, df, rows, baseline, metric, meta) -> tuple[str, str]:
    n = int(c["N"])
    ga = df[(df["variant"] == c["a"]) & (df["N"] == n) & (df["status"] == "ok")].set_index("seed")["dec_last_over_first"]
    gb = df[(df["variant"] == c["b"]) & (df["N"] == n) & (df["status"] == "ok")].set_index("seed")["dec_last_over_first"]
    seeds = sorted(set(ga.index) & set(gb.index))
    if not seeds:
        return "inconclusive", f"no paired measurements at N = {n}"
    wins = int(np.sum(ga.loc[seeds].to_numpy(float) > gb.loc[seeds].to_numpy(float)))
    frac = wins / len(seeds)
    status = "reproduced" if frac >= float(c["min_fraction"]) else "not reproduced"
    return status, (f"decoder last/first-layer gradient ratio at N = {n}: {c['a']} > {c['b']} in {wins}/{len(seeds)} "
                    f"paired seeds (needed >= {float(c['min_fraction']):.0%}); medians {ga.median():.3g} vs "
                    f"{gb.median():.3g}.")


def _sensitivity_lower(c: dict, exp: Experiment, df, rows, baseline, metric, meta) -> tuple[str, str]:
    """``a`` is less sensitive to the learning rate than ``b`` (Wortsman et al. 2023 §2.2): each seed's
    sensitivity over the swept learning rates, paired by seed, sign test (:func:`harness.stats.compare_paired`)."""
    from ..report.tuning import DEV_CE, seed_sensitivities, sensitivity, swept_lrs

    lrs = swept_lrs(meta)
    if not lrs or DEV_CE not in df:
        return "inconclusive", "the run does not sweep train.lr alone, or has no dev cross-entropy"
    vocab = int(meta.config.get("model", {}).get("vocab", 0))
    sa, sb = (seed_sensitivities(df, lrs, v, vocab) for v in (c["a"], c["b"]))
    seeds = sorted(set(sa) & set(sb))
    if not seeds:
        return "inconclusive", f"no seed of {c['a']} and {c['b']} has every learning rate of the grid"
    cmp_ = stats.compare_paired([sa[s] for s in seeds], [sb[s] for s in seeds], higher_is_better=False)
    status = {"better": "reproduced", "no claim": "inconclusive"}.get(cmp_.verdict, "not reproduced")
    return status, (f"learning-rate sensitivity (Wortsman et al. 2023 §2.2, dev cross-entropy, nats/token) over "
                    f"{len(lrs)} learning rates {min(lrs.values()):g}-{max(lrs.values()):g}: of the median curves "
                    f"{sensitivity(df, lrs, c['a'], vocab):.3f} ({c['a']}) vs {sensitivity(df, lrs, c['b'], vocab):.3f} "
                    f"({c['b']}); per seed, {c['a']} lower in {cmp_.wins} of {cmp_.n_pairs} pairs -> {cmp_.label()} "
                    f"(expected: lower).")


def _tuned_verdict(c: dict, exp: Experiment, df, rows, baseline, metric, meta) -> tuple[str, str]:
    """The verdict of ``variant`` against the baseline when each is at its own learning rate chosen on dev
    (:mod:`harness.report.tuning`), compared with ``expected``."""
    from ..report import aggregate
    from ..report.tuning import TUNED, choose_lrs, dev_column, swept_lrs, tuned_frame

    lrs, column = swept_lrs(meta), dev_column(metric, df)
    if not lrs or column is None:
        return "inconclusive", "the run does not sweep train.lr alone, or has no dev column for " + metric
    from ..report.frames import run_metrics, verdict_metric

    higher = verdict_metric(metric, run_metrics(meta)).higher_is_better
    chosen = choose_lrs(df, lrs, column, higher)
    frame = tuned_frame(df, chosen)
    status, evidence = _verdict(dict(c, point=TUNED), exp, frame, aggregate(frame, baseline, metric, meta), baseline,
                                metric, meta)
    picks = ", ".join(f"{v} {chosen[v]['lr']:g}" for v in (c["variant"], baseline) if v in chosen)
    return status, f"at the learning rates chosen on {column} ({picks}): {evidence}"


#: claim ``check`` -> its evaluation (the keys each needs: :data:`harness.experiments.spec.CHECKS`)
CLAIM_CHECKS = {
    "params_difference": _params_difference,
    "verdict": _verdict,
    "failure_rate_greater": _failure_rate_greater,
    "slope": _slope,
    "ratio_greater": _ratio_greater,
    "sensitivity_lower": _sensitivity_lower,
    "tuned_verdict": _tuned_verdict,
}

"""What a reader should see before any training number: which variants compute the same function.

``check`` (seconds on the CPU) groups variants into equivalence classes: same outputs and
gradients from the same canonical weights (see :mod:`harness.checks`). ``run`` records the classes
of its variants in ``config.json`` (key ``check``) and its report opens with them; the suite
(:mod:`harness.suite`) uses them as its negative control.
"""
from __future__ import annotations

import time

from .errors import HarnessError
from .report import Section
from .stats import MIN_PAIRS_SIGN_TEST
from .runmeta import RunMeta


def check_classes(registry, variants, full: bool = False, configs=None) -> dict:
    """Equivalence classes of ``variants`` from ``check`` (CPU, fp32), at the model configs the caller
    trains (``configs``: ``(model config, task rows)`` pairs; None: the check config, as ``check`` itself).

    ``full``: the whole check (:func:`harness.checks.run_checks`, with its failures; what the suite
    records); else only its pair comparisons (:func:`harness.checks.whole.equivalence_classes`: the same
    classes in a fraction of the time; what ``run`` records), on one intra-op thread (the caller's
    count restored: the check's ops are small, and a second thread slowed them 4-13x on a busy
    2-core machine, docs/benchmarks.md). Two variants share a class only when they do at every config
    given (a sweep over ``model.*`` keys gives several): whether two components compute the same function
    can depend on the model config (at h = 2 grouped-query attention with h/2 K/V heads is multi-query
    attention). A check that cannot run (a plugin's variant that does not build, say) is recorded, never
    raised: the classes are context for the training numbers, not a gate (the run gate is).

    Two variants of one class with different ``init`` schemes compute the same function but start from other
    weights, so their training differs by more than rounding: ``starts`` records each variant's ``init``
    component, and the reports compare such variants (:func:`harness.report.rows.training_classes`).

    Returns:
        ``{"classes": [[names]], "failures": [lines], "scope": "full"|"pairs", "wall_s": seconds,
        "models": [{N, d_model, h, ...}], "starts": {variant: init component}}``; on an error ``{"classes": [],
        "failures": [], "error": "one line", "wall_s": 0.0}``.
    """
    import torch

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small ops: 3.8 s vs 15-50 s with 2 threads on a busy 2-core machine
    try:
        found = [_classes_at(registry, variants, full, cfg, rows) for cfg, rows in (configs or [(None, "default")])]
    except (HarnessError, RuntimeError, ValueError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return {"classes": [], "failures": [], "error": reason, "wall_s": 0.0}
    finally:
        torch.set_num_threads(threads)
    classes = meet([c for c, _ in found])
    failures = list(dict.fromkeys(f for _, fs in found for f in fs))
    models = [model_summary(cfg) for cfg, _ in configs] if configs else []
    return {"classes": classes, "failures": failures, "scope": "full" if full else "pairs",
            "wall_s": round(time.perf_counter() - t0, 2), "models": models, "starts": starts_of(variants)}


def starts_of(variants) -> dict[str, str]:
    """variant -> its ``init`` component (the scheme its weights start from; "" when it names none)."""
    return {v.name: str(v.slots.get("init", "")) for v in variants}


#: The model keys a report names when it says at which model config check grouped the variants.
SUMMARY_KEYS = ("N", "d_model", "h", "d_ff", "n_kv_heads", "window", "max_len", "vocab")


def model_summary(cfg) -> dict:
    """The keys of :data:`SUMMARY_KEYS` that ``cfg`` (a :class:`harness.config.ModelConfig`) has."""
    return {k: getattr(cfg, k) for k in SUMMARY_KEYS if hasattr(cfg, k)}


def _classes_at(registry, variants, full: bool, cfg, rows) -> tuple[list[list[str]], list[str]]:
    """(classes, failures) of ``variants`` at model config ``cfg`` (None: the check config)."""
    from .checks.whole import equivalence_classes, run_checks

    if full:
        report = run_checks(registry, [v for v in variants if not v.buggy], cfg, device="cpu", dtype="fp32",
                            task_rows=rows)
        return report.classes(), report.failures()
    return equivalence_classes(registry, variants, cfg, device="cpu", dtype="fp32", task_rows=rows), []


def meet(partitions: list[list[list[str]]]) -> list[list[str]]:
    """The finest partition that every one of ``partitions`` coarsens: two names share a class only
    when they share one in each partition (sorted as the inputs: by first appearance in the first)."""
    if len(partitions) == 1:
        return partitions[0]
    label = {}
    for part in partitions:
        for i, cls in enumerate(part):
            for name in cls:
                label.setdefault(name, []).append(i)
    out: dict[tuple, list[str]] = {}
    for cls in partitions[0]:
        for name in cls:
            out.setdefault(tuple(label[name]), []).append(name)
    return list(out.values())


def record_check(reg, variants, log=None, configs=None) -> dict:
    """check's equivalence classes of ``variants`` (:func:`harness.overview.check_classes`) at ``configs``
    (:func:`check_configs`: the run's model configs), with one line to ``log`` (the run's :func:`run_log`: its
    log.txt, and stderr unless quiet) naming the classes that hold more than one variant."""
    result = check_classes(reg, variants, configs=configs)
    if log:
        multi = ["{" + ", ".join(c) + "}" for c in result["classes"] if len(c) > 1]
        what = (f"check could not group them: {result['error']}" if result.get("error") else
                f"{len(result['classes'])} class(es); same function: {'; '.join(multi) or 'none'}")
        log(f"check: {len(variants)} variant(s), {what} ({result['wall_s']:.1f} s)")
    return result


def check_configs(reg, plan) -> list:
    """``(model config, task rows)`` for each distinct model config the plan's trials train (one unless a
    sweep varies ``model.*`` keys): check groups the variants at the configs the run trains, since whether two
    components compute the same function can depend on them (h, n_kv_heads, window, ...). The task rows are
    the run's task's (:func:`harness.checks.properties.rows.task_rows`; None when the task cannot draw rows this
    model takes). ``plan``: a :class:`harness.runner.Plan` (its ``points`` and ``seeds``)."""
    from .checks.properties.rows import task_rows

    out, seen = [], set()
    for _, cfg in plan.points:
        key = repr(cfg.model)
        if key in seen:
            continue
        seen.add(key)
        try:
            rows = task_rows(reg.task(cfg.train.task).for_config(cfg), cfg.train.seq_len, cfg.model, plan.seeds[0] if plan.seeds else 0)
        except HarnessError:
            rows = None
        out.append((cfg.model, rows))
    return out


def class_of(classes: list[list[str]], name: str) -> list[str]:
    """The check class that contains ``name`` (``[name]`` when check did not see it)."""
    return next((c for c in classes if name in c), [name])


def at_models(models: list[dict] | None) -> str:
    """"at N = 1, d_model = 64, h = 4, ...; " for the model configs check grouped at ("" for none recorded:
    runs recorded before the classes followed the run's config, at the check config)."""
    if not models:
        return ""
    shown = ("N", "d_model", "h", "d_ff", "n_kv_heads", "window")  # the last two only when set (0: the default)
    return "at " + " and ".join(", ".join(f"{k} = {v}" for k, v in m.items() if k in shown and (v or k in shown[:4]))
                                for m in models) + "; "


def classes_section(check: dict, heading: str = "## Which variants compute the same function") -> list[str]:
    """Markdown lines: the check's equivalence classes (singletons in one line), or why there are none."""
    out = [heading, ""]
    if check.get("error"):
        return out + [f"`check` could not group these variants: {check['error']}", ""]
    classes = check.get("classes", [])
    multi = [c for c in classes if len(c) > 1]
    single = [c[0] for c in classes if len(c) == 1]
    what = "check's pair comparisons" if check.get("scope") == "pairs" else "`python -m harness check`"
    out += [f"{what} on these variants (CPU, fp32, {at_models(check.get('models'))}{check.get('wall_s', 0):.1f} s): variants in "
            "one class give the same outputs and gradients from the same weights, so, started by the same `init` "
            "scheme, their training differs only by floating-point rounding; every other pair computes a different "
            "function.", ""]
    out += [f"- class {i}: {', '.join(c)}" for i, c in enumerate(multi, 1)]
    if single:
        out.append(f"- each in a class of its own: {', '.join(single)}")
    starts = check.get("starts") or {}
    moved = [c for c in multi if len({starts.get(n, "") for n in c}) > 1]
    if moved:
        named = "; ".join(", ".join(f"{n} (init={starts.get(n, '?')})" for n in c) for c in moved)
        out += ["", f"Within a class, variants with another `init` scheme start from other weights: the same "
                    f"function, trained from another start, so the run compares them like different functions "
                    f"({named})."]
    if check.get("failures"):
        out += ["", f"check reported {len(check['failures'])} problem(s) (see `python -m harness check`); first: "
                    f"{check['failures'][0]}"]
    return out + [""]


def suite_pointer(meta: RunMeta) -> list[str]:
    """Markdown lines under the results of a run too small for verdicts: where the claims are."""
    if len(meta.seeds or []) >= MIN_PAIRS_SIGN_TEST:
        return []
    return [f"With {len(meta.seeds or [])} paired seed(s) this run gives no verdict (one needs >= "
            f"{MIN_PAIRS_SIGN_TEST}). For claims: `python -m harness run --suite` trains every variant on copy, "
            "reverse, sort and copy_length with 8 paired seeds and gives verdicts with a negative control "
            "(docs/suite.md; reference: results/reference/suite/suite.md).", ""]


def overview_sections(meta: RunMeta) -> list:
    """The run report's extra sections from its ``config.json``: the check's equivalence classes at
    the top (when the run recorded them, key ``check``) and the pointer to the suite after the
    results."""
    out = []
    if meta.check:
        out.append(Section("top", classes_section(meta.check)))
    pointer = suite_pointer(meta)
    if pointer:
        out.append(Section("after_results", pointer))
    return out

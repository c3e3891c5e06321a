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


def check_classes(registry, variants, full: bool = False) -> dict:
    """Equivalence classes of ``variants`` from ``check`` (CPU, fp32, the check config).

    ``full``: the whole check (:func:`harness.checks.run_checks`, with its failures; what the suite
    records); else only its pair comparisons (:func:`harness.checks.whole.equivalence_classes`: the same
    classes in a fraction of the time; what ``run`` records), on one intra-op thread (the caller's
    count restored: the check's ops are small, and a second thread slowed them 4-13x on a busy
    2-core machine, docs/benchmarks.md). A check that cannot run (a plugin's
    variant that does not build, say) is recorded, never raised: the classes are context for the
    training numbers, not a gate (the run's own integrity gate is).

    Returns:
        ``{"classes": [[names]], "failures": [lines], "scope": "full"|"pairs", "wall_s": seconds}``;
        on an error ``{"classes": [], "failures": [], "error": "one line", "wall_s": 0.0}``.
    """
    import torch

    from .checks.whole import equivalence_classes, run_checks

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small ops: 3.8 s vs 15-50 s with 2 threads on a busy 2-core machine
    try:
        if full:
            report = run_checks(registry, [v for v in variants if not v.buggy], device="cpu", dtype="fp32")
            classes, failures = report.classes(), report.failures()
        else:
            classes, failures = equivalence_classes(registry, variants, device="cpu", dtype="fp32"), []
    except (HarnessError, RuntimeError, ValueError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return {"classes": [], "failures": [], "error": reason, "wall_s": 0.0}
    finally:
        torch.set_num_threads(threads)
    return {"classes": classes, "failures": failures, "scope": "full" if full else "pairs",
            "wall_s": round(time.perf_counter() - t0, 2)}


def class_of(classes: list[list[str]], name: str) -> list[str]:
    """The check class that contains ``name`` (``[name]`` when check did not see it)."""
    return next((c for c in classes if name in c), [name])


def classes_section(check: dict, heading: str = "## Which variants compute the same function") -> list[str]:
    """Markdown lines: the check's equivalence classes (singletons in one line), or why there are none."""
    out = [heading, ""]
    if check.get("error"):
        return out + [f"`check` could not group these variants: {check['error']}", ""]
    classes = check.get("classes", [])
    multi = [c for c in classes if len(c) > 1]
    single = [c[0] for c in classes if len(c) == 1]
    what = "check's pair comparisons" if check.get("scope") == "pairs" else "`python -m harness check`"
    out += [f"{what} on these variants (CPU, fp32, {check.get('wall_s', 0):.1f} s): variants in "
            "one class give the same outputs and gradients from the same weights, so their training differs only "
            "by floating-point rounding; every other pair computes a different function.", ""]
    out += [f"- class {i}: {', '.join(c)}" for i, c in enumerate(multi, 1)]
    if single:
        out.append(f"- each in a class of its own: {', '.join(single)}")
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

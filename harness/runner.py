"""Turn a selection of variants x seeds (x sweep points) into trial specs, execute them and
store each result the moment it finishes."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .config import RunConfig
from .registry import Variant
from .store import RunStore, trial_key


@dataclass
class Plan:
    """What a run trains: variants x seeds x sweep points (each point a name and a config).

    Built from command-line options by ``harness.commands.run`` or from an experiment file
    by ``harness.experiments``; ``points`` holds ``("", cfg)`` when nothing is swept.
    """

    variants: list[Variant]
    seeds: list[int]
    points: list[tuple[str, RunConfig]]
    preset: str = ""
    name: str = ""

    @property
    def config(self) -> RunConfig:
        return self.points[0][1]


@dataclass
class TrialSpec:
    """One trial as plain data (see :func:`harness.train.run_trial`)."""

    key: str
    spec: dict[str, Any]


def make_specs(variants: Iterable[Variant], seeds: Iterable[int], cfg: RunConfig, device: str,
               dtype: str, plugins: dict, points: list[tuple[str, RunConfig]] | None = None,
               threads: int | None = None) -> list[TrialSpec]:
    """Trial specs in execution order: seed-major, so an interrupted run has every variant
    at the first seeds rather than every seed of the first variants."""
    points = points or [("", cfg)]
    out = []
    for seed in seeds:
        for point, pcfg in points:
            for v in variants:
                spec = {"variant": v.name, "slots": dict(v.slots), "config": pcfg.to_dict(), "seed": seed,
                        "device": device, "dtype": dtype, "plugins": plugins, "threads": threads,
                        "point": point}
                out.append(TrialSpec(trial_key(v.name, seed, point), spec))
    return out


def progress_bar(total: int, desc: str, quiet: bool, leave: bool = True, position: int = 0):
    """A tqdm bar, silent when ``quiet`` or when stderr is not a terminal."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=leave, position=position, dynamic_ncols=True,
                disable=quiet or not sys.stderr.isatty(), file=sys.stderr)


def execute_sequential(specs: list[TrialSpec], store: RunStore, quiet: bool = False,
                       log: Callable[[str], None] | None = None) -> list[dict]:
    """Run trials one after the other in this process, storing each as soon as it ends."""
    from .train import run_trial

    results = []
    outer = progress_bar(len(specs), "trials", quiet)
    try:
        for ts in specs:
            steps = ts.spec["config"]["train"]["steps"]
            inner = progress_bar(steps, f"{ts.spec['variant']} s{ts.spec['seed']}", quiet, leave=False, position=1)

            def cb(step, loss, bar=inner):
                bar.update(1)
                if step % 25 == 0:
                    bar.set_postfix(loss=f"{loss:.3f}")

            t0 = time.perf_counter()
            result = run_trial(ts.spec, progress=cb)
            inner.close()
            result["row"]["point"] = ts.spec.get("point", "")
            path = store.write_trial(ts.key, result)
            results.append(result)
            outer.update(1)
            if log:
                r = result["row"]
                em = r.get("exact_match")
                em_s = f"exact-match {em:.3f}" if isinstance(em, float) else ""
                log(f"{r['variant']} seed {r['seed']}: {r['status']} {em_s} in {time.perf_counter() - t0:.1f} s"
                    f"{' (' + r['reason'] + ')' if r.get('reason') else ''} -> {path}")
    finally:
        outer.close()
    return results

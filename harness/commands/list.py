"""``python -m harness list``: every component by slot, every variant, task, config preset and training-recipe
choice (optimiser, schedule), marked with its plugin where that is not a built-in; ``list --settings``: every
``--set`` key with its type, default and meaning (:func:`harness.settings.setting_rows`). Each table at most 120
characters wide (:func:`harness.report.terminal.wrapped_table`)."""
from __future__ import annotations

import textwrap

from ..config import OPTIMIZERS, PRESET_NOTES, PRESETS, TrainConfig, config_sections
from ..plugins import BUILTIN_MODULES
from ..request import PLAN_DEFAULTS
from ..schedule import SCHEDULES
from ..settings import setting_rows
from .common import load_registry


DEFAULT_TASK = TrainConfig().task
DEFAULT_PRESET = PLAN_DEFAULTS["preset"]  #: run's --preset default (bench's: paper)


def register(sub, parents):
    p = sub.add_parser("list", parents=parents, help="show components by slot, variants and tasks with their plugins",
                       description="Show every slot with its components, every variant with its slot "
                                   "assignment, summary and source, every task and every config preset; what a "
                                   "plugin you loaded offers is marked with its name.")
    p.add_argument("--buggy", action="store_true", help="also show the faithful-bug variants")
    p.add_argument("--settings", action="store_true",
                   help="show every --set key (model.*, train.*) with its type, default and meaning instead")
    p.set_defaults(func=main)


def main(args) -> int:
    import pandas as pd  # here, not at the top: python -m harness --help imports no pandas

    from ..report.terminal import WIDTH, wrapped_table

    def say(text: str, indent: str = "") -> None:  # a note, wrapped to the tables' width
        print(textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "    "))

    if args.settings:
        print("Settings (--set KEY=VALUE; experiment files' [config] and [sweep] take the same keys)\n")
        print(wrapped_table(pd.DataFrame(setting_rows(config_sections())), keep=("key",)))
        return 0
    reg = load_registry(args)
    print("Components (slot: what it decides)\n")
    for slot in reg.slots.values():
        say(f"{slot.name}: {slot.decides}" + (f" [plugin {slot.plugin}]" if slot.plugin != "harness.slots" else ""), "  ")
    print()
    print(wrapped_table(pd.DataFrame(_component_rows(reg, args.buggy))))
    print()
    say("'held to': what python -m harness check holds a component to: its slot's reference (docs/components.md), "
        "an independent formula of the difference it declares, or the component it declares it equals (= slot=NAME).")
    print("\nVariants ([group:NAME]: kept out of all; select with --variants group:NAME)\n")
    print(wrapped_table(pd.DataFrame(_variant_rows(reg, args.buggy))))
    trows = [{"task": t.name + (" (default)" if t.name == DEFAULT_TASK else "") + _plugin(t.plugin),
              "summary": t.summary, "source": t.source} for t in reg.tasks.values()]
    print("\nTasks (--task NAME)\n")
    print(wrapped_table(pd.DataFrame(trows, columns=["task", "summary", "source"])))
    print("\nPresets (--preset NAME; --set KEY=VALUE changes one value)\n")
    print(wrapped_table(pd.DataFrame(_preset_rows())))
    print("\nTraining recipe (--set train.optimizer=NAME, train.schedule=NAME; every key: list --settings)\n")
    print(wrapped_table(pd.DataFrame(_recipe_rows())))
    print()
    say(f"[plugin NAME]: offered by a plugin you installed or loaded; the rest are built in, from the modules "
        f"{', '.join(BUILTIN_MODULES)} (leave one out with -p no:NAME).")
    n_bug = sum(v.buggy for v in reg.variants.values())
    if n_bug and not args.buggy:
        print(f"\n{n_bug} faithful-bug variants hidden (python -m harness list --buggy).")
    return 0


def _component_rows(reg, buggy: bool) -> list[dict]:
    rows = []
    for (slot, name), c in sorted(reg.components.items(), key=lambda kv: (list(reg.slots).index(kv[0][0]), kv[0][1])):
        if c.buggy and not buggy:
            continue
        default = reg.defaults[slot] == name
        rows.append({"slot": slot, "component": name + (" (default)" if default else "") + (" [bug]" if c.buggy else "")
                     + _plugin(c.plugin), "summary": c.summary, "source": c.source, "held to": c.held_to()})
    return rows


def _variant_rows(reg, buggy: bool) -> list[dict]:
    rows = []
    for v in reg.variants.values():
        if v.buggy and not buggy:
            continue
        r = v.resolved(reg.defaults)
        changed = ", ".join(f"{s}={c}" for s, c in r.items() if c != reg.defaults[s]) or "(all defaults)"
        rows.append({"variant": v.name + (" [bug]" if v.buggy else "") + (f" [group:{v.group}]" if v.group else "")
                     + _plugin(v.plugin), "slots (non-default)": changed, "summary": v.summary, "source": v.source})
    return rows


def _preset_rows() -> list[dict]:
    rows = []
    for name, note in PRESET_NOTES.items():
        m, t = PRESETS[name].model, PRESETS[name].train
        rows.append({"preset": name + (" (default)" if name == DEFAULT_PRESET else ""), "what it is": note,
                     "model": f"N={m.N} d_model={m.d_model} h={m.h} d_ff={m.d_ff} dropout={m.dropout:g}",
                     "training": f"{t.task}, {t.steps} steps x batch {t.batch}"})
    return rows


def _recipe_rows() -> list[dict]:
    default = TrainConfig()
    return [{"key": f"train.{key}", "choice": name + (" (default)" if getattr(default, key) == name else ""),
             "what it does": text} for key, table in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES))
            for name, text in table.items()]


def _plugin(name: str) -> str:
    """`` [plugin NAME]`` for what a plugin outside the built-ins (:data:`BUILTIN_MODULES`) offers."""
    return "" if name in BUILTIN_MODULES else f" [plugin {name}]"

"""``python -m harness list``: every component by slot, every variant and every task, with its plugin."""
from __future__ import annotations

from ..config import TrainConfig
from .common import load_registry


DEFAULT_TASK = TrainConfig().task


def register(sub, parents):
    p = sub.add_parser("list", parents=parents, help="show components by slot, variants and tasks with their plugins",
                       description="Show every slot with its components and every variant with its slot "
                                   "assignment, summary, source and the plugin that provided it.")
    p.add_argument("--buggy", action="store_true", help="also show the faithful-bug variants")
    p.set_defaults(func=main)


def main(args) -> int:
    import pandas as pd  # here, not at the top: python -m harness --help imports no pandas

    reg = load_registry(args)
    rows = []
    for (slot, name), c in sorted(reg.components.items(), key=lambda kv: (list(reg.slots).index(kv[0][0]), kv[0][1])):
        if c.buggy and not args.buggy:
            continue
        default = reg.defaults[slot] == name
        rows.append({"slot": slot, "component": name + (" (default)" if default else "") + (" [bug]" if c.buggy else ""),
                     "held to": c.declaration(), "summary": c.summary, "source": c.source, "plugin": c.plugin})
    print("Components (slot: what it decides)\n")
    for slot in reg.slots.values():
        print(f"  {slot.name}: {slot.decides}" + (f" [plugin {slot.plugin}]" if slot.plugin != "harness.slots" else ""))
    print()
    print(pd.DataFrame(rows).to_markdown(index=False, tablefmt="github", maxcolwidths=[None, None, 45, 45, 40, None]))
    print("\n'held to': the slot's reference (docs/components.md) unless the component declares a difference "
          "or an equivalence; python -m harness check holds it to that.")
    vrows = []
    for v in reg.variants.values():
        if v.buggy and not args.buggy:
            continue
        r = v.resolved(reg.defaults)
        changed = ", ".join(f"{s}={c}" for s, c in r.items() if c != reg.defaults[s]) or "(all defaults)"
        vrows.append({"variant": v.name + (" [bug]" if v.buggy else "") + (f" [group:{v.group}]" if v.group else ""), "slots (non-default)": changed,
                      "summary": v.summary, "source": v.source, "plugin": v.plugin})
    print("\nVariants ([group:NAME]: kept out of all; select with --variants group:NAME)\n")
    print(pd.DataFrame(vrows).to_markdown(index=False, tablefmt="github", maxcolwidths=[None, 40, 70, 30, None]))
    trows = [{"task": t.name + (" (default)" if t.name == DEFAULT_TASK else ""), "summary": t.summary,
              "source": t.source, "plugin": t.plugin} for t in reg.tasks.values()]
    print("\nTasks (--task NAME)\n")
    print(pd.DataFrame(trows, columns=["task", "summary", "source", "plugin"]).to_markdown(
        index=False, tablefmt="github", maxcolwidths=[None, 60, 50, None]))
    n_bug = sum(v.buggy for v in reg.variants.values())
    if n_bug and not args.buggy:
        print(f"\n{n_bug} faithful-bug variants hidden (python -m harness list --buggy).")
    return 0

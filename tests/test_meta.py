"""Meta-tests (datasette's ``test_plugin_hooks_are_documented`` style): every built-in slot has its one
declaration (``harness.slots.BUILTIN``), its check, its section in docs/components.md and a test naming it;
every hook of ``harness/hookspecs.py`` has its section in docs/plugins.md, the docstring template and a
test naming it. Each rule is a function of the texts it reads, so a planted omission shows it can fail."""
from __future__ import annotations

import ast
import inspect
import re

import pytest

from harness import hookspecs
from harness.checks.contracts import slot_check
from harness.registry import Registry
from harness.slots import BUILTIN

from .conftest import ROOT

COMPONENTS_MD = ROOT / "docs" / "components.md"
PLUGINS_MD = ROOT / "docs" / "plugins.md"
HOOKS = sorted(n for n, f in vars(hookspecs).items() if n.startswith("harness_") and callable(f))
SLOT_NAMES = [s.name for s in BUILTIN]
#: the sections of a hookspec docstring (design.md's template: offers; when it fires; how results combine; return; errors)
HOOK_TEMPLATE = ("When it fires:", "How results combine:", "Returns:", "Raises:")


def documented(text: str, names: list[str]) -> list[str]:
    """The names of ``names`` without a ``### `name` `` section in the markdown ``text``."""
    headings = set(re.findall(r"^###\s+`([\w.]+)`", text, flags=re.M))
    return [n for n in names if n not in headings]


def _test_functions() -> list[tuple[str, ast.FunctionDef, str]]:
    out = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        if path.name == "test_meta.py":
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                out.append((path.name, node, ast.get_source_segment(source, node) or ""))
    return out


TESTS = _test_functions()


def untested_slots(names: list[str], tests=TESTS) -> list[str]:
    """The slots no test function names as a string constant (``"feed_forward"``, in its body or decorators)."""
    named = {n.value for _, fn, _ in tests for n in ast.walk(fn) if isinstance(n, ast.Constant)
             and isinstance(n.value, str)}
    named |= {n.value for _, fn, _ in tests for d in fn.decorator_list for n in ast.walk(d)
              if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return [n for n in names if n not in named]


def untested_hooks(names: list[str], tests=TESTS) -> list[str]:
    """The hooks no test function's source mentions (a ``@hookimpl`` it defines, or a plugin's text)."""
    return [h for h in names if not any(h in src for _, _, src in tests)]


def assembled_slots() -> set[str]:
    """The slots ``harness/model.py`` builds: every constant ``make("x")`` / ``_shared("x")`` argument."""
    tree = ast.parse((ROOT / "harness" / "model.py").read_text())
    return {c.args[0].value for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            and c.func.attr in ("make", "_shared") and c.args and isinstance(c.args[0], ast.Constant)}


# --------------------------------------------------------------------------- slots

def test_every_slot_the_core_builds_or_a_builtin_offers_is_declared_once():
    assert len(SLOT_NAMES) == len(set(SLOT_NAMES))
    assert assembled_slots() == set(SLOT_NAMES)  # model.py builds exactly the declared built-in slots
    builtin = Registry.from_plugins()
    assert {slot for slot, _ in builtin.components} == set(SLOT_NAMES) == set(builtin.defaults)


@pytest.mark.parametrize("slot", BUILTIN, ids=lambda s: s.name)
def test_every_builtin_slot_declares_its_protocol_reference_and_an_existing_check(slot):
    assert isinstance(slot.protocol, type) and f"``{slot.name}``" in (slot.protocol.__doc__ or "")
    assert "(" in slot.protocol.__doc__ and slot.decides and slot.reference  # shapes, what it decides, its reference
    assert slot_check(slot) is not None, f"slot {slot.name!r}: check {slot.check!r} does not exist"


def test_every_builtin_slot_has_a_docs_section_and_a_test():
    assert documented(COMPONENTS_MD.read_text(), SLOT_NAMES) == []
    assert untested_slots(SLOT_NAMES) == []


# --------------------------------------------------------------------------- hooks

def test_every_hook_has_a_docs_section_its_docstring_template_and_a_test():
    assert HOOKS, "no hookspecs found"
    assert documented(PLUGINS_MD.read_text(), HOOKS) == []
    assert {h: [s for s in HOOK_TEMPLATE if s not in inspect.getdoc(getattr(hookspecs, h))] for h in HOOKS} == \
        {h: [] for h in HOOKS}
    assert untested_hooks(HOOKS) == []


# --------------------------------------------------------------------------- the rules can fail

def test_the_rules_catch_a_missing_docs_section_slot_or_test():
    text = COMPONENTS_MD.read_text()
    assert documented(text.replace("### `projections`", "### projections (moved)"), SLOT_NAMES) == ["projections"]
    assert documented(PLUGINS_MD.read_text(), [*HOOKS, "harness_add_metrics"]) == ["harness_add_metrics"]
    assert untested_slots([*SLOT_NAMES, "router"]) == ["router"]
    assert untested_hooks([*HOOKS, "harness_add_routers"]) == ["harness_add_routers"]
    no_ffn_tests = [t for t in TESTS if "feed_forward" not in t[2]]
    assert untested_slots(SLOT_NAMES, no_ffn_tests) == ["feed_forward"]

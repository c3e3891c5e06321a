"""Plugins load from a file, a module and an entry point, and duplicates name both plugins."""
import importlib.metadata
import importlib.util
import sys
import textwrap

import pytest

from harness.errors import DuplicateNameError, PluginError, UnknownNameError
from harness.plugins import PluginSpec
from harness.registry import Registry

from .conftest import EXAMPLE_PLUGIN


def test_plugin_file(registry):
    reg = Registry.from_plugins(PluginSpec(files=[str(EXAMPLE_PLUGIN)]))
    assert "example_rmsnorm" in reg.variants
    assert ("layer_norm", "rms") in reg.components
    assert reg.variants["example_rmsnorm"].plugin == str(EXAMPLE_PLUGIN)
    assert "example_rmsnorm" not in registry.variants


def test_plugin_module(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN.parent))
    reg = Registry.from_plugins(PluginSpec(modules=["harness_example"]))
    assert reg.variants["example_rmsnorm"].plugin == "harness_example"


class _FakeEntryPoint:
    def __init__(self, name, obj):
        self.name, self.value, self._obj = name, f"fake:{name}", obj

    def load(self):
        if isinstance(self._obj, Exception):
            raise self._obj
        return self._obj


def _module_from(path):
    """The module of a Python file, loaded without entering ``sys.modules`` (no test sees another's)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_entry_points(monkeypatch, eps):
    real = importlib.metadata.entry_points

    def entry_points(**kw):
        if kw.get("group") == "harness":
            return eps
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.delenv("HARNESS_DISABLE_PLUGIN_AUTOLOAD", raising=False)


def test_entry_point_plugin(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN.parent))
    import harness_example

    _fake_entry_points(monkeypatch, [_FakeEntryPoint("example", harness_example)])
    reg = Registry.from_plugins()
    assert reg.variants["example_rmsnorm"].plugin == "example"


def test_broken_entry_point_warns_or_aborts(monkeypatch):
    _fake_entry_points(monkeypatch, [_FakeEntryPoint("broken", ImportError("no module named nowhere"))])
    reg = Registry.from_plugins()
    assert any("broken" in w and "failed to import" in w for w in reg.warnings)
    assert "baseline" in reg.variants
    with pytest.raises(PluginError, match="broken"):
        Registry.from_plugins(PluginSpec(strict=True))


def test_duplicate_variant_names_both_plugins(tmp_path):
    f = tmp_path / "dup_plugin.py"
    f.write_text(textwrap.dedent("""
        from harness import Variant, hookimpl

        @hookimpl
        def harness_add_variants():
            return [Variant("baseline", {})]
    """))
    with pytest.raises(DuplicateNameError) as exc:
        Registry.from_plugins(PluginSpec(files=[str(f)]))
    assert "variants.presets" in str(exc.value) and str(f) in str(exc.value)


def test_hook_returning_wrong_type_is_reported(tmp_path, monkeypatch):
    """A ``--plugin`` file's wrong return type is an error; an installed plugin's is a warning
    (it is skipped) unless strict."""
    f = tmp_path / "wrong_plugin.py"
    f.write_text("from harness import hookimpl\n\n@hookimpl\ndef harness_add_variants():\n    return 'baseline'\n")
    with pytest.raises(PluginError, match=r"wrong_plugin\.py:4: harness_add_variants\(\) must return a list of Variant"):
        Registry.from_plugins(PluginSpec(files=[str(f)]))
    _fake_entry_points(monkeypatch, [_FakeEntryPoint("wrong", _module_from(f))])
    reg = Registry.from_plugins()
    assert any("must return a list of Variant" in w and "wrong_plugin.py:4" in w for w in reg.warnings)
    assert "baseline" in reg.variants
    with pytest.raises(PluginError, match="wrong_plugin"):
        Registry.from_plugins(PluginSpec(strict=True))


def test_variant_with_unknown_component_is_an_error(tmp_path):
    f = tmp_path / "bad_variant.py"
    f.write_text("from harness import Variant, hookimpl\n\n@hookimpl\n"
                 "def harness_add_variants():\n    return [Variant('x', {'attention': 'd2I'})]\n")
    with pytest.raises(UnknownNameError, match="d2l"):
        Registry.from_plugins(PluginSpec(files=[str(f)]))


def test_missing_plugin_file_and_module():
    with pytest.raises(PluginError, match="does not exist"):
        Registry.from_plugins(PluginSpec(files=["/nonexistent/plugin.py"]))
    with pytest.raises(PluginError, match="not found"):
        Registry.from_plugins(PluginSpec(modules=["no_such_harness_plugin_module"]))


def test_select_all_names_globs_and_unknown(registry):
    names = [v.name for v in registry.select(["all"])]
    assert "baseline" in names and not any(n.startswith("bug") for n in names)
    assert [v.name for v in registry.select(["seed_00[12]"])] == ["seed_001", "seed_002"]
    assert registry.select(["bug_001_discarded_mask"])[0].buggy
    with pytest.raises(UnknownNameError, match="baseline"):
        registry.select(["baselin"])
    sizes = [len(registry.slot_components(s)) for s in ("norm", "embedding", "attention", "mask")]
    assert sizes == [4, 2, 8, 4]  # norm: + parallel, deepnorm; attention: + gqa, mqa, qk_norm; mask: + sliding_window
    # the grid crosses the choices of `all`: group:modern's components (parallel, sdpa_packed, gqa, mqa,
    # qk_norm, sliding_window) and group:init's deepnorm stay in their group, as their variants stay out of `all`
    assert len(registry.grid()) == 2 * 2 * 4 * 3
    assert not any(v.slots["attention"] in ("gqa", "sdpa_packed") or v.slots["norm"] in ("parallel", "deepnorm")
                   for v in registry.grid())


def test_grid_takes_a_plugin_component_that_no_variant_names(tmp_path):
    plugin = tmp_path / "mask_plugin.py"
    plugin.write_text("from harness import Component, hookimpl\nfrom variants.mask import BoolMask\n\n"
                      "@hookimpl\ndef harness_add_components():\n"
                      "    return [Component('bool2', 'mask', lambda ctx: BoolMask(), 'bool again', "
                      "equivalent_to='bool')]\n")
    reg = Registry.from_plugins(PluginSpec(files=[plugin]))
    assert len(reg.grid()) == 2 * 2 * 4 * 4 and any(v.slots["mask"] == "bool2" for v in reg.grid())


def test_kit_loads_a_plugin_that_is_also_installed(monkeypatch):
    """The conformance kit's documented call, load_registry(files=[...]), on a plugin that is also
    installed through an entry point registers it once (it raised DuplicateNameError)."""
    from harness.testing import check_components, load_registry

    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN.parent))
    import harness_example

    _fake_entry_points(monkeypatch, [_FakeEntryPoint("example", harness_example)])
    for reg in (load_registry(files=[str(EXAMPLE_PLUGIN)]), load_registry(modules=["harness_example"])):
        assert reg.variants["example_rmsnorm"].plugin == "example"
        results = check_components(reg, "example_rmsnorm")
        assert any(r.verdict == "differs as declared" for r in results if r.slot == "layer_norm")


# ------------------------------------------------------------- pm.hook, -p no:NAME, defaults

def test_p_no_name_disables_one_plugin(tmp_path):
    reg = Registry.from_plugins(PluginSpec(modules=["no:variants.bugs"]))
    assert "variants.bugs" not in {v.plugin for v in reg.variants.values()}
    assert not any(n.startswith("bug_") for n in reg.variants) and "baseline" in reg.variants
    f = tmp_path / "dup_plugin.py"  # a plugin file is blocked by its path as given
    f.write_text("from harness import Variant, hookimpl\n\n@hookimpl\n"
                 "def harness_add_variants():\n    return [Variant('baseline', {})]\n")
    assert Registry.from_plugins(PluginSpec(modules=[f"no:{f}"], files=[str(f)])).variants["baseline"].plugin \
        == "variants.presets"


def test_p_no_name_on_the_command_line():
    import os
    import subprocess

    from .conftest import ROOT

    env = {**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "harness", "-p", "no:variants.bugs", "list", "--buggy"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "bug_001_discarded_mask" not in r.stdout and "baseline" in r.stdout


def test_slot_defaults_are_declared_by_components(registry):
    import harness.registry
    from harness.registry import SLOT_DOCS, default_component, default_components

    assert set(registry.defaults) == set(SLOT_DOCS)
    assert not hasattr(harness.registry, "SLOTS")  # one table of slots (SLOT_DOCS), no second view of it
    for slot, name in registry.defaults.items():
        assert registry.component(slot, name).default and default_component(slot) == name
        assert sum(c.default for (s, _), c in registry.components.items() if s == slot) == 1
    assert default_components() == registry.defaults
    assert registry.variants["baseline"].resolved() == registry.defaults


def _projections_plugin(path, **defaults):
    comps = ", ".join(f"Component({name!r}, 'projections', lambda ctx: nn.Linear, default={d})"
                      for name, d in defaults.items())
    path.write_text("import torch.nn as nn\nfrom harness import Component, hookimpl\n\n@hookimpl\n"
                    f"def harness_add_components():\n    return [{comps}]\n")
    return str(path)


def test_slot_without_or_with_two_defaults_is_an_error(tmp_path):
    second = _projections_plugin(tmp_path / "second_default.py", mine=True)
    with pytest.raises(PluginError, match="two default components") as exc:
        Registry.from_plugins(PluginSpec(files=[second]))
    assert "biased from plugin 'variants.projections'" in str(exc.value) and second in str(exc.value)
    none = _projections_plugin(tmp_path / "no_default.py", bias_free=False)
    with pytest.raises(PluginError, match="slot 'projections' has no default component"):
        Registry.from_plugins(PluginSpec(modules=["no:variants.projections"], files=[none]))
    # a plugin may declare the default when the built-in that declares it is disabled
    takeover = _projections_plugin(tmp_path / "takeover.py", bias_free=False, mine=True)
    reg = Registry.from_plugins(PluginSpec(modules=["no:variants.projections"], files=[takeover]))
    assert reg.defaults["projections"] == "mine"
    # ... and every variant that names no projections gets it, wherever it is resolved or built
    from harness.config import get_preset
    from harness.model import build_model

    assert reg.variants["baseline"].resolved()["projections"] == "mine" == reg.variants["baseline"].slots["projections"]
    assert build_model(reg, reg.variants["baseline"], get_preset("tiny").model).slots["projections"] == "mine"
    assert all(v.slots["projections"] == "mine" for v in reg.grid())


def test_registry_names_no_builtin_component():
    """The core knows slots, not the built-ins: registry.py holds no component name as a string."""
    import ast

    from .conftest import ROOT

    builtin = {name for (_, name) in Registry.from_plugins().components}
    tree = ast.parse((ROOT / "harness" / "registry.py").read_text())
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not literals & builtin


def test_hooks_are_called_through_pm_hook_wrappers_apply(tmp_path):
    """A plugin's hook wrapper sees (and may change) the combined results: the host calls
    ``pm.hook.<name>()``, not the implementations one by one."""
    f = tmp_path / "wrapper_plugin.py"
    f.write_text("from harness import hookimpl\n\n"
                 "@hookimpl(wrapper=True)\n"
                 "def harness_add_variants():\n"
                 "    results = yield\n"
                 "    return [[v for v in r if not v.name.startswith('seed_')] for r in results]\n")
    reg = Registry.from_plugins(PluginSpec(files=[str(f)]))
    assert "baseline" in reg.variants and not any(n.startswith("seed_") for n in reg.variants)


def test_harness_trace_writes_pluggy_trace_to_stderr(monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_TRACE", "1")
    Registry.from_plugins()
    err = capsys.readouterr().err
    assert "harness_add_components" in err and "harness_add_variants" in err
    monkeypatch.delenv("HARNESS_TRACE")
    Registry.from_plugins()
    assert capsys.readouterr().err == ""


def test_a_raising_hook_is_named_and_skipped(tmp_path):
    f = tmp_path / "raising_plugin.py"
    f.write_text("from harness import hookimpl\n\n@hookimpl\n"
                 "def harness_add_variants():\n    raise RuntimeError('boom')\n")
    reg = Registry.from_plugins(PluginSpec(files=[str(f)]))
    assert any("raising_plugin" in w and "RuntimeError: boom" in w for w in reg.warnings)
    assert "baseline" in reg.variants
    with pytest.raises(PluginError, match="raising_plugin.*boom"):
        Registry.from_plugins(PluginSpec(files=[str(f)], strict=True))


def test_a_raising_hook_wrapper_is_reported(tmp_path):
    f = tmp_path / "bad_wrapper.py"
    f.write_text("from harness import hookimpl\n\n@hookimpl(wrapper=True)\n"
                 "def harness_add_variants():\n    yield\n    raise RuntimeError('wrapped')\n")
    reg = Registry.from_plugins(PluginSpec(files=[str(f)]))
    assert any("hook wrapper raised RuntimeError: wrapped" in w for w in reg.warnings) and "baseline" in reg.variants
    with pytest.raises(PluginError, match="wrapped"):
        Registry.from_plugins(PluginSpec(files=[str(f)], strict=True))
